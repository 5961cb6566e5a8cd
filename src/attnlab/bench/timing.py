"""Timing GPU work the way the seeds compare kernels: CUDA events, warm-up, median of many runs.

``fn(i)`` is called with a rotation index so callers can cycle through several input sets whose
total size exceeds the L2 cache; otherwise repeated runs would time the cache, not the kernel.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol


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


class Clock(Protocol):
    """Marks points in a stream of work and measures between them (CUDA events, or a fake)."""

    def mark(self) -> object: ...

    def wait(self) -> None: ...

    def elapsed_ms(self, start: object, stop: object) -> float: ...


class CudaEventClock:
    """CUDA events on the current stream: device time, not host time."""

    def mark(self) -> object:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wait(self) -> None:
        import torch

        torch.cuda.synchronize()

    def elapsed_ms(self, start: object, stop: object) -> float:
        return start.elapsed_time(stop)  # type: ignore[attr-defined]


def time_calls(fn: Callable[[int], object], *, warmup: int = 5, runs: int = 30,
               rotations: int = 1, clock: Clock | None = None) -> Timing:
    """Time ``fn`` with a pair of marks per call, after ``warmup`` untimed calls.

    Marks are read only after the last call, so timing never synchronises between calls.
    """
    if runs < 1 or warmup < 0 or rotations < 1:
        raise ValueError(f"need runs >= 1, warmup >= 0, rotations >= 1; got {runs}, {warmup}, "
                         f"{rotations}")
    clock = clock if clock is not None else CudaEventClock()
    for i in range(warmup):
        fn(i % rotations)
    clock.wait()
    marks = []
    for i in range(runs):
        start = clock.mark()
        fn(i % rotations)
        marks.append((start, clock.mark()))
    clock.wait()
    return summarize([clock.elapsed_ms(start, stop) for start, stop in marks])


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool = False) -> float:
    """Forward FLOPs as FlashAttention reports them: 4 B H Sq Sk D (halved when causal)."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
