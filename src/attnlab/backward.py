"""Launching the backward pass on the forward's saved tensors: preprocess, kernel, postprocess.

FlashAttention-2's three steps (``docs/backward.md``):

1. **Preprocess** (``kernels/common/bwd_preprocess.py``, one pass): ``D = rowsum(dO * O)``
   in fp32 (minus the LSE's own gradient, when the caller used the LSE: d lse_i / d s_ij =
   P_ij, so it folds into D), and the LSE times log2(e), both laid out ``[B, H, rows]`` and
   padded to whole query blocks so the kernel reads them without bounds checks. A row that
   saw no key (LSE -inf) gets +inf, so its recomputed probabilities are exp2(-inf) = 0
   instead of NaN. It also zeroes the fp32 ``dq_accum``.
2. **The kernel** (``kernels/sm80/backward.py``, ``kernels/sm90/backward.py``) writes dK and
   dV and adds dQ into ``dq_accum``.
3. **Postprocess**: dQ in the input dtype.
"""

from __future__ import annotations

import torch

from attnlab import device, kernel_cache
from attnlab.backward_config import BackwardConfig, default_backward
from attnlab.kernels.abi import BackwardSpec, PreprocessSpec, encode_window


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
    spec_dtype = str(q.dtype).removeprefix("torch.")
    stats_shape = (*lse.shape[:-1], rows)
    dpsum = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    lse_log2 = torch.empty(stats_shape, dtype=torch.float32, device=q.device)
    dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    preprocess = PreprocessSpec(gpu.arch, spec_dtype, head_dim, varlen, dlse is not None)
    kernel_cache.get(preprocess).fn(out, dout, lse, None if dlse is None else dlse.contiguous(),
                                    dpsum, lse_log2, dq_accum)
    spec = BackwardSpec(config, gpu.arch, spec_dtype, head_dim, window != (-1, -1), varlen,
                        deterministic)
    semaphores = None
    if deterministic:
        batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
        seqlen = max_seqlen_q if varlen else q.shape[1]
        blocks = -(-int(seqlen) // config.block_m)
        semaphores = torch.zeros(batch * q.shape[-2] * blocks, dtype=torch.int32,
                                 device=q.device)
    left, right = encode_window(window)
    kernel_cache.get(spec).fn(
        q, k, v, dout, lse_log2, dpsum,
        dq_accum, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale, left, right,
        max_seqlen_k if varlen else k.shape[1], semaphores)
    return dq_accum.to(q.dtype), dk, dv
