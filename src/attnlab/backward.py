"""Launching the backward pass on the forward's saved tensors: preprocess, kernel, postprocess.

FlashAttention-2's three steps (``docs/backward.md``):

1. **Preprocess** (torch ops): ``D = rowsum(dO * O)`` in fp32 (minus the LSE's own gradient,
   when the caller used the LSE: d lse_i / d s_ij = P_ij, so it folds into D), and the LSE
   times log2(e), both laid out ``[B, H, rows]`` and padded to whole query blocks so the
   kernel reads them without bounds checks. A row that saw no key (LSE -inf) gets +inf, so
   its recomputed probabilities are exp2(-inf) = 0 instead of NaN.
2. **The kernel** (``kernels/sm80/backward.py``, ``kernels/sm90/backward.py``) writes dK and
   dV and adds dQ into a zeroed fp32 ``dq_accum``.
3. **Postprocess**: dQ in the input dtype.
"""

from __future__ import annotations

import math

import torch

from attnlab import device, kernel_cache
from attnlab.backward_config import BackwardConfig, default_backward
from attnlab.kernels.abi import BackwardSpec, encode_window

LOG2_E = math.log2(math.e)


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``[B, H, S]`` / ``[H, total]`` fp32 per-row value zero-padded to ``rows`` rows, rows
    contiguous (the kernel's layout; ``x`` may be a transposed view)."""
    return torch.nn.functional.pad(x, (0, rows - x.shape[-1])).contiguous()


def _padded_rows(q: torch.Tensor, varlen: bool, block_m: int) -> int:
    # Packed: one block past the last sequence's start covers every block's read.
    if varlen:
        return q.shape[0] + block_m
    return -(-q.shape[1] // block_m) * block_m


def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dlse: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    window: tuple[int, int],
    deterministic: bool = False,
    config: BackwardConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of validated forward inputs, their output and LSE (as
    ``runtime.forward`` wrote them) and the output's gradient ``dout`` (and the LSE's,
    ``dlse``, or None). Layouts as the forward's; dq/dk/dv are new contiguous tensors.

    Raises:
        attnlab.ConfigError: the backward does not serve this head dim (or ``config`` cannot
            serve it on this GPU).
    """
    varlen = cu_seqlens_q is not None
    head_dim = q.shape[-1]
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0 or k.shape[-3] == 0:
        # No key anywhere: every output row is 0 whatever q, k and v are.
        return torch.zeros_like(q), dk.zero_(), dv.zero_()
    gpu = device.info(q.device)
    if config is None:
        config = default_backward(head_dim, gpu.arch, varlen)
    config.check_problem(head_dim, gpu.arch)
    dout = dout.contiguous()
    rows = _padded_rows(q, varlen, config.block_m)
    # [B, S, H] / [total, H] -> the LSE's [B, H, S] / [H, total]; out is converted inside
    # the product, not copied.
    dpsum = (dout.float() * out).sum(-1).transpose(-1, -2)
    if dlse is not None:
        dpsum = dpsum - dlse
    lse_log2 = (lse * LOG2_E).nan_to_num_(nan=math.nan, neginf=math.inf)
    dq_accum = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    spec = BackwardSpec(config, gpu.arch, str(q.dtype).removeprefix("torch."), head_dim,
                        window != (-1, -1), varlen, deterministic)
    semaphores = None
    if deterministic:
        batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
        seqlen = max_seqlen_q if varlen else q.shape[1]
        blocks = -(-int(seqlen) // config.block_m)
        semaphores = torch.zeros(batch * q.shape[-2] * blocks, dtype=torch.int32,
                                 device=q.device)
    left, right = encode_window(window)
    kernel_cache.get(spec).fn(
        q, k, v, dout, _padded(lse_log2, rows), _padded(dpsum, rows),
        dq_accum, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale, left, right,
        max_seqlen_k if varlen else k.shape[1], semaphores)
    return dq_accum.to(q.dtype), dk, dv
