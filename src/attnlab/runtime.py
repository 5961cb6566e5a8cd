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
) -> None:
    """Run the forward kernel on validated inputs, writing ``out`` (BSHD) and ``lse`` (B, H, Sq).

    Compiles on the first call for a (config, arch, dtype, head dim) and reuses it after, so
    warmed-up launches never compile.
    """
    import cuda.bindings.driver as cuda

    arch = arch_of(q.device)
    dtype = str(q.dtype).removeprefix("torch.")
    kernel = get_forward_kernel(config, arch, dtype, q.shape[-1])
    stream = cuda.CUstream(torch.cuda.current_stream(q.device).cuda_stream)
    kernel(*launch_args(q, k, v, out, lse, softmax_scale, stream))
