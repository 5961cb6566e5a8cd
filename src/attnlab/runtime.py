"""Launching the forward kernel on validated torch tensors.

A :class:`Launch` holds what every call with the same metadata needs: the compiled kernel's
TVM-FFI function and the scalar arguments, already encoded. Building one is the slow path
(the device's facts, the config choice, the kernel cache, the persistent grid), done once per
call signature; calling one passes the tensors straight to the compiled function, which checks
them against its signature in C++ and launches on the current torch stream. Nothing on that
path queries the device, reads the tuning cache or allocates, so it is safe inside CUDA-graph
capture.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab import device, dispatch, kernel_cache
from attnlab.config import FlashConfig
from attnlab.counters import scratch, tile_counters
from attnlab.kernels.abi import (
    ForwardSpec,
    encode_window,
    row_head_strides,
    split_tail_scratch,
)
from attnlab.memo import remember
from attnlab.validation import Problem, check_data_pointers, describe


class Launch:
    """One call signature's launch: ``launch(q, k, v, out, lse, cu_q, cu_k)``.

    ``fn`` None stands for a problem with no work: nothing at all when q is empty, else (no
    keys) a zero output and an LSE of -inf, the softmax over an empty set.
    """

    __slots__ = ("fn", "softmax_scale", "left", "right", "max_seqlen_q", "num_ctas",
                 "spec", "dynamic_tiles", "scratch_size")

    def __init__(self, fn: Any, softmax_scale: float = 1.0, window: tuple[int, int] = (0, 0),
                 max_seqlen_q: int = 0, num_ctas: int | None = None,
                 spec: ForwardSpec | None = None):
        self.fn = fn
        self.softmax_scale = softmax_scale
        self.left, self.right = window
        self.max_seqlen_q = max_seqlen_q
        self.num_ctas = num_ctas
        self.spec = spec
        self.dynamic_tiles = spec is not None and spec.config.dynamic_tiles
        # A split_tail launch's scratch (fp32 values); 0 without.
        self.scratch_size = (split_tail_scratch(spec.config, spec.head_dim, num_ctas)
                             if spec is not None and spec.splits_tail else 0)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None = None,
                 cu_seqlens_k: torch.Tensor | None = None) -> None:
        if self.fn is not None:
            counter = partials = None
            if self.dynamic_tiles:
                counter = tile_counters(q.device, 2)
            elif self.scratch_size:
                counter = tile_counters(q.device, self.num_ctas)
                partials = scratch(q.device, self.scratch_size)
            self.fn(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, self.softmax_scale,
                    self.left, self.right, self.max_seqlen_q, self.num_ctas, counter,
                    partials)
        elif q.numel():
            out.zero_()
            if lse is not None:
                lse.fill_(-torch.inf)


def launch_for(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
               problem: Problem, config: FlashConfig | None, with_lse: bool) -> Launch:
    """The :class:`Launch` of validated inputs (compiles the kernel if no cache has it).

    ``out`` None stands for the new contiguous output the caller will allocate.

    Raises:
        attnlab.ConfigError: ``config`` cannot serve this head dim on this GPU.
    """
    # Dim -3 is Sk dense and total_k packed: zero means no row has a key.
    if q.numel() == 0 or k.shape[-3] == 0:
        return Launch(None)
    gpu = device.info(q.device)
    if config is None:
        config = dispatch.config_for(gpu, problem)
    config.check_problem(problem.head_dim, gpu.arch)
    strides = None
    if config.static_strides:
        out_strides = out.stride() if out is not None else _contiguous_strides(q.shape)
        strides = row_head_strides(q, k, v) + (tuple(out_strides[-3:-1]),)
    spec = ForwardSpec(config, gpu.arch, problem.dtype_name, problem.head_dim,
                       problem.windowed, problem.varlen, with_lse, strides)
    kernel = kernel_cache.get(spec)
    num_ctas = _persistent_grid(kernel, gpu) if config.persistent else None
    return Launch(kernel.fn, problem.softmax_scale, encode_window(problem.window),
                  problem.seqlen_q, num_ctas, spec)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _persistent_grid(kernel: kernel_cache.CompiledKernel, gpu: device.DeviceInfo) -> int:
    """SMs x resident CTAs per SM (the occupancy model on the kernel's registers and shared
    memory; one per SM when the registers are unknown), in whole clusters."""
    from attnlab.analysis.occupancy import occupancy, spec_from_properties

    config, spec = kernel.spec.config, kernel.spec
    ctas = 1
    if kernel.registers is not None:
        props = torch.cuda.get_device_properties(gpu.index)
        ctas = occupancy(spec_from_properties(props), config.num_threads, kernel.registers,
                         config.smem_bytes(spec.head_dim)).ctas_per_sm
    # Whole clusters: a cluster's CTAs walk their tiles together. Assumed all resident at
    # once (a cluster needs its SMs in one GPC): so on the H100/H200 SXM's 132 SMs, whose
    # clustered walks measured no second wave (docs/ladder.md, forty-third session).
    return gpu.multiprocessors * max(1, ctas) // config.cluster_m * config.cluster_m


_launches: dict[tuple, Launch] = {}


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
            cu_seqlens_k: torch.Tensor | None, max_seqlen_q: int | None,
            max_seqlen_k: int | None, softmax_scale: float, window: tuple[int, int],
            config: FlashConfig | None) -> None:
    """Write ``out`` (and ``lse`` unless None) for validated inputs: the custom ops' body, and
    the benchmarks' way to time the kernel into preallocated outputs.

    Dense: q/out ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]``, lse ``[B, Hq, Sq]``. Packed
    (``cu_seqlens_*`` int32 ``[B + 1]``): q/out ``[total_q, Hq, D]``, k/v
    ``[total_k, Hkv, D]``, lse ``[Hq, total_q]``. ``window`` = (left, right), -1 unbounded.
    """
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), v.stride(),
           out.stride(), lse is None, cu_seqlens_q is None, max_seqlen_q, max_seqlen_k,
           softmax_scale, window, config)
    launch = _launches.get(key)
    if launch is None:
        problem = describe(q, k, softmax_scale, window, cu_seqlens_q, max_seqlen_q,
                           max_seqlen_k)
        launch = launch_for(q, k, v, out, problem, config, lse is not None)
        remember(_launches, key, launch)
    check_data_pointers(q, k, v, out)
    launch(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)


def forget() -> None:
    """Drop every remembered launch (after the tuning cache or the kernels changed)."""
    _launches.clear()
