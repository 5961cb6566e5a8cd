"""Launching a compiled kernel on torch tensors (the only torch <-> CuTe DSL boundary)."""

from __future__ import annotations

import torch

from attnlab.compile import get_forward_kernel, launch_args, row_head_strides
from attnlab.config import FlashConfig
from attnlab.dispatch import arch_of

#: (compiled kernel, device index) -> persistent grid size, for kernels that needed the
#: driver's attention once (a carveout to set, an occupancy to read).
_prepared: dict[tuple[int, int], int] = {}


def _prepare(kernel, config: FlashConfig, q: torch.Tensor) -> int:
    """Apply the config's kernel attributes on this device; the persistent grid size."""
    from attnlab.kernel_handle import apply_kernel_attributes, ctas_per_sm

    key = (id(kernel), q.device.index)
    grid = _prepared.get(key)
    if grid is None:
        apply_kernel_attributes(kernel, config, q.device.index)
        grid = 1
        if config.persistent:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            grid = sms * max(1, ctas_per_sm(kernel, config, q.shape[-1], q.element_size()))
        _prepared[key] = grid
    return grid


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
                                q.shape[-1], windowed=windowed, varlen=varlen,
                                strides=row_head_strides(q, k, v, out)
                                if config.static_strides else None)
    persistent_ctas = 1
    if config.persistent or config.smem_carveout >= 0:
        persistent_ctas = _prepare(kernel, config, q)
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    kernel(*launch_args(q, k, v, out, lse, softmax_scale, stream, window=tuple(window),
                        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                        max_seqlen_q=max_seqlen_q, persistent_ctas=persistent_ctas))
