"""What attnlab asks of a CUDA device, asked once per device and process.

torch answers device queries through the driver (``get_device_properties`` builds a Python
object each time): microseconds that a launch path pays on every call if it asks again.
Everything here is cached by device index.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")

_ARCH_BY_CAPABILITY = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 7): "sm_86", (8, 9): "sm_89",
                       (9, 0): "sm_90a"}


@dataclass(frozen=True)
class DeviceInfo:
    """The facts of one GPU that select and size kernels."""

    index: int
    name: str
    capability: tuple[int, int]
    arch: str
    multiprocessors: int
    l2_bytes: int
    #: The DRAM's nominal bandwidth (two transfers a memory clock over the bus width; 0 where
    #: torch does not report them), what the decoding's split choice weighs per SM.
    dram_bytes_per_s: float = 0.0


def _index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


def stream_handle(device: torch.device | int | None = None) -> int:
    """The raw handle of the device's current stream: what per-stream state (counters,
    scratch buffers) is keyed by. ``torch.cuda.current_stream`` builds a ``Stream`` object
    for it, tens of microseconds a call; this reads the handle alone."""
    return torch._C._cuda_getCurrentRawStream(_index(device))


def per_stream(cache: dict[int, T], device: torch.device | int | None, make: Callable[[], T]
               ) -> T:
    """``cache``'s entry for the device's current stream, ``make()`` the first time: scratch
    buffers a call's launches write and read back before the call's last launch ends. A
    stream runs its launches in order, so the next call's writes come after this call has
    read them, and the allocations (~3-5 us of host time each) are made once."""
    stream = stream_handle(device)
    entry = cache.get(stream)
    if entry is None:
        entry = cache[stream] = make()
    return entry


def info(device: torch.device | int | None = None) -> DeviceInfo:
    """The :class:`DeviceInfo` of a CUDA device (default: the current one)."""
    return _info(_index(device))


@functools.cache
def _info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    dram = (2 * getattr(props, "memory_bus_width", 0) / 8
            * getattr(props, "memory_clock_rate", 0) * 1e3)
    return DeviceInfo(index, props.name, capability, arch_for(capability, props.name),
                      props.multi_processor_count, props.L2_cache_size, dram)


def arch_for(capability: tuple[int, int], name: str = "this GPU") -> str:
    """The compilation target of a compute capability (``sm_80``, ``sm_86``, ``sm_89``,
    ``sm_90a``); newer GPUs run the ``mma.sync`` path's sm_80 code."""
    arch = _ARCH_BY_CAPABILITY.get(capability)
    if arch is None:
        if capability < (8, 0):
            raise ValueError(f"attnlab needs an sm80 (Ampere) or newer GPU; {name} is "
                             f"sm_{capability[0]}{capability[1]}")
        # Newer GPUs run the sm80 path's PTX through the driver (no Hopper/Blackwell features).
        arch = "sm_80"
    return arch


def arch_of(device: torch.device | int | None = None) -> str:
    """The compilation target of a CUDA device (see :func:`arch_for`)."""
    return info(device).arch
