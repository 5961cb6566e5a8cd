"""Launching a compiled kernel on torch tensors (the only torch <-> CuTe DSL boundary)."""

from __future__ import annotations

import torch

from attnlab.compile import get_forward_kernel, launch_args
from attnlab.config import FlashConfig
from attnlab.dispatch import arch_of


def launch_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    config: FlashConfig,
    *,
    window: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> None:
    """Run the forward kernel on validated inputs, writing ``out`` and ``lse``.

    Dense: q/out ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]``, lse ``[B, Hq, Sq]``. Varlen
    (``cu_seqlens_q``/``_k`` int32 ``[B + 1]``): q/out ``[total_q, Hq, D]``, k/v
    ``[total_k, Hkv, D]``, lse ``[Hq, total_q]``. ``window`` = (left, right), -1 unbounded;
    causal is (-1, 0). Compiles on the first call for a (config, arch, dtype, head dim, variant)
    and reuses it after; no host synchronisation and no allocation, so it is safe inside CUDA
    graph capture once warmed up. ``max_seqlen_k`` is accepted for symmetry with
    flash_attn's varlen API; the kernel reads key lengths from ``cu_seqlens_k``.
    """
    import cuda.bindings.driver as cuda

    del max_seqlen_k
    varlen = cu_seqlens_q is not None
    windowed = tuple(window) != (-1, -1)
    kernel = get_forward_kernel(config, arch_of(q.device), str(q.dtype).removeprefix("torch."),
                                q.shape[-1], windowed=windowed, varlen=varlen)
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    kernel(*launch_args(q, k, v, out, lse, softmax_scale, stream, window=tuple(window),
                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        max_seqlen_q=max_seqlen_q))
