"""Timing GPU work the way the seeds compare kernels: CUDA events, warm-up, median of many runs.

``fn(i)`` is called with a rotation index so callers can cycle through several input sets whose
total size exceeds the L2 cache; otherwise repeated runs would time the cache, not the kernel.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call over ``runs`` timed calls."""

    median_ms: float
    min_ms: float
    max_ms: float
    runs: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples_ms: list[float]) -> Timing:
    """Median, min and max of per-call times (ms)."""
    if not samples_ms:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples_ms), min(samples_ms), max(samples_ms),
                  len(samples_ms))


def time_cuda(fn: Callable[[int], object], *, warmup: int = 5, runs: int = 30,
              rotations: int = 1) -> Timing:
    """Time ``fn`` with one pair of CUDA events per call, after ``warmup`` untimed calls."""
    import torch

    if runs < 1 or warmup < 0 or rotations < 1:
        raise ValueError(f"need runs >= 1, warmup >= 0, rotations >= 1; got {runs}, {warmup}, "
                         f"{rotations}")
    for i in range(warmup):
        fn(i % rotations)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(runs)]
    for i, (start, stop) in enumerate(events):
        start.record()
        fn(i % rotations)
        stop.record()
    torch.cuda.synchronize()
    return summarize([start.elapsed_time(stop) for start, stop in events])


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool = False) -> float:
    """Forward FLOPs as FlashAttention reports them: 4 B H Sq Sk D (halved when causal)."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
