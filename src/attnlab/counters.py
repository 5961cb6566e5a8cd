"""Zeroed int32 counters in device memory that kernels count on and leave zero again.

Serial split-K (``kernels/gemm/sm90.py``: the slices of an output tile count in, the last
resets the tile's counter) and the attention forward's dynamic tile scheduler
(``FlashConfig.dynamic_tiles``: persistent CTAs take their next tile from a counter; the last
CTA to finish resets it) need counters that are zero when a launch starts. Each kernel leaves
them zero, so one buffer serves every launch of a stream; launches on different streams may
run at once, so each (device, stream) has its own.
"""

from __future__ import annotations

import torch

from attnlab.device import stream_handle

_counters: dict[tuple[int, int], torch.Tensor] = {}


def tile_counters(dev: torch.device, count: int) -> torch.Tensor:
    """At least ``count`` zeroed int32 counters for launches on the current stream."""
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    key = (index, stream_handle(index))
    counters = _counters.get(key)
    if counters is None or counters.numel() < count:
        counters = torch.zeros(max(count, 1024), dtype=torch.int32, device=dev)
        _counters[key] = counters
    return counters
