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

from attnlab import device, kernel_cache, memo
from attnlab.backward_config import BackwardConfig, default_backward
from attnlab.kernels.abi import (
    STATS_ROW_MULTIPLE,
    BackwardSpec,
    PreprocessSpec,
    encode_window,
)


def _padded_rows(q: torch.Tensor, varlen: bool, block_m: int) -> int:
    # Packed: one block past the last sequence's start covers every block's read, rounded to
    # whole 16-byte rows (the TMA copies' stride granularity).
    if varlen:
        return -(-(q.shape[0] + block_m) // STATS_ROW_MULTIPLE) * STATS_ROW_MULTIPLE
    return -(-q.shape[1] // block_m) * block_m


class BackwardLaunch:
    """What every backward call of one signature needs, built once: the two compiled kernels
    and the sizes and scalars of their arguments (``runtime.Launch``'s counterpart)."""

    __slots__ = ("preprocess", "kernel", "stats_shape", "window", "max_seqlen_k",
                 "semaphores", "scale")

    def __init__(self, q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, varlen: bool,
                 has_dlse: bool, max_seqlen_q: int | None, max_seqlen_k: int | None,
                 softmax_scale: float, window: tuple[int, int], deterministic: bool,
                 config: BackwardConfig | None):
        head_dim = q.shape[-1]
        gpu = device.info(q.device)
        if config is None:
            config = default_backward(head_dim, gpu.arch, varlen, deterministic,
                                      window != (-1, -1))
        config.check_problem(head_dim, gpu.arch)
        dtype = str(q.dtype).removeprefix("torch.")
        self.preprocess = kernel_cache.get(
            PreprocessSpec(gpu.arch, dtype, head_dim, varlen, has_dlse)).fn
        self.kernel = kernel_cache.get(BackwardSpec(
            config, gpu.arch, dtype, head_dim, window != (-1, -1), varlen, deterministic)).fn
        self.stats_shape = (*lse.shape[:-1], _padded_rows(q, varlen, config.block_m))
        self.window = encode_window(window)
        self.max_seqlen_k = max_seqlen_k if varlen else k.shape[1]
        self.scale = softmax_scale
        # Deterministic: the turn counters' (sequences or None for cu_seqlens', heads,
        # query blocks).
        self.semaphores = None
        if deterministic:
            seqlen = max_seqlen_q if varlen else q.shape[1]
            self.semaphores = (None if varlen else q.shape[0], q.shape[-2],
                               -(-int(seqlen) // config.block_m))

    def __call__(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                 cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        device = q.device
        dk = torch.empty(k.shape, dtype=k.dtype, device=device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=device)
        dq_accum = torch.empty(q.shape, dtype=torch.float32, device=device)
        dpsum = torch.empty(self.stats_shape, dtype=torch.float32, device=device)
        lse_log2 = torch.empty(self.stats_shape, dtype=torch.float32, device=device)
        if not dout.is_contiguous():
            dout = dout.contiguous()
        if dlse is not None and not dlse.is_contiguous():
            dlse = dlse.contiguous()
        self.preprocess(out, dout, lse, dlse, dpsum, lse_log2, dq_accum)
        semaphores = None
        if self.semaphores is not None:
            batch, heads, blocks = self.semaphores
            batch = cu_seqlens_q.shape[0] - 1 if batch is None else batch
            semaphores = torch.zeros(batch * heads * blocks, dtype=torch.int32, device=device)
        self.kernel(q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv, cu_seqlens_q,
                    cu_seqlens_k, self.scale, *self.window, self.max_seqlen_k, semaphores)
        return dq_accum.to(q.dtype), dk, dv


_launches: dict[tuple, BackwardLaunch] = {}


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
    ``dlse``, or None). Layouts as the forward's; dq/dk/dv are new contiguous tensors. The
    launch is built once per call signature (:class:`BackwardLaunch`).

    Raises:
        attnlab.ConfigError: the backward does not serve this head dim (or ``config`` cannot
            serve it on this GPU).
    """
    if q.numel() == 0 or k.shape[-3] == 0:
        # No key anywhere: every output row is 0 whatever q, k and v are.
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    varlen = cu_seqlens_q is not None
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), v.stride(),
           out.stride(), lse.shape, dlse is None, varlen, max_seqlen_q, max_seqlen_k,
           softmax_scale, window, deterministic, config)
    launch = _launches.get(key)
    if launch is None:
        launch = BackwardLaunch(q, k, lse, varlen, dlse is not None, max_seqlen_q,
                                max_seqlen_k, softmax_scale, window, deterministic, config)
        memo.remember(_launches, key, launch)
    return launch(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k)


def forget() -> None:
    """Drop every remembered backward launch."""
    _launches.clear()
