"""Back-to-back calls on the device's timeline: what one call costs the GPU's clock.

An end-to-end span of back-to-back calls (``bench.timing.sample_back_to_back``) gives one
number per call. Where that number is above both the host's enqueue time and the kernels'
device time (a host-bound decoding step, a small GEMM), the span alone cannot say where the
rest goes. A profiler's kernel timeline of the same span can: per call, the **period** (its
first kernel's start to the next call's), the **busy** time (the union of its kernels'
intervals: launches that overlap under programmatic dependent launch count once) and the
**idle** time between them (period - busy; negative where consecutive calls overlap).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CallSpans:
    """Medians over the calls of a span (microseconds); ``calls``: how many had a next call
    to measure the period against."""

    calls: int
    period_us: float
    busy_us: float
    idle_us: float

    def to_dict(self) -> dict[str, float]:
        return {"calls": self.calls, "period_us": self.period_us, "busy_us": self.busy_us,
                "idle_us": self.idle_us}


def _union_length(intervals: Sequence[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def call_spans(kernels: Sequence[tuple[float, float]], per_call: int) -> CallSpans:
    """The span's calls from its kernels' ``(start_us, end_us)``, ``per_call`` kernels a
    call, in launch order (sorted by start here).

    Raises:
        ValueError: ``per_call`` < 1, a kernel count that is not a whole number of calls,
            fewer than two calls, or an interval that ends before it starts.
    """
    if per_call < 1:
        raise ValueError(f"per_call must be >= 1, got {per_call}")
    if len(kernels) % per_call:
        raise ValueError(f"{len(kernels)} kernels are not whole calls of {per_call}")
    if len(kernels) < 2 * per_call:
        raise ValueError(f"need at least two calls ({2 * per_call} kernels), got "
                         f"{len(kernels)}")
    if any(end < start for start, end in kernels):
        raise ValueError("a kernel interval ends before it starts")
    ordered = sorted(kernels)
    calls = [ordered[i:i + per_call] for i in range(0, len(ordered), per_call)]
    periods = [nxt[0][0] - this[0][0] for this, nxt in zip(calls[:-1], calls[1:], strict=True)]
    busy = [_union_length(call) for call in calls[:-1]]
    idle = [p - b for p, b in zip(periods, busy, strict=True)]
    return CallSpans(len(periods), statistics.median(periods), statistics.median(busy),
                     statistics.median(idle))
