"""Zeroed int32 counters in device memory that kernels count on and leave zero again, and fp32
scratch space that a launch writes before it reads.

Serial split-K (``kernels/gemm/sm90.py``: the slices of an output tile count in, the last
resets the tile's counter) and the attention forward's dynamic tile scheduler
(``FlashConfig.dynamic_tiles``: persistent CTAs take their next tile from a counter; the last
CTA to finish resets it) need counters that are zero when a launch starts. Each kernel leaves
them zero, so one buffer serves every launch of a stream; launches on different streams may
run at once, so each (device, stream) has its own. The forward's ``split_tail`` walk counts its
split tiles' flags there, and leaves their partial results in the stream's scratch.
"""

from __future__ import annotations

import torch

from attnlab.device import stream_handle

_counters: dict[tuple[int, int], torch.Tensor] = {}
_scratch: dict[tuple[int, int], torch.Tensor] = {}


def tile_counters(dev: torch.device, count: int) -> torch.Tensor:
    """At least ``count`` zeroed int32 counters for launches on the current stream."""
    return _stream_buffer(_counters, dev, max(count, 1024), torch.int32)


def scratch(dev: torch.device, count: int) -> torch.Tensor:
    """At least ``count`` fp32 values for launches on the current stream (each launch writes
    what it reads)."""
    return _stream_buffer(_scratch, dev, count, torch.float32)


def _stream_buffer(buffers: dict[tuple[int, int], torch.Tensor], dev: torch.device, count: int,
                   dtype: torch.dtype) -> torch.Tensor:
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    key = (index, stream_handle(index))
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < count:
        buffer = torch.zeros(count, dtype=dtype, device=dev)
        buffers[key] = buffer
    return buffer
