"""Timing GPU work: CUDA events, warm-up, median of many runs, two ways.

* End to end (:func:`sample_back_to_back`), the headline: what an eager caller sees. Calls run
  back to back with nothing queued ahead of them, so when a call's host side (validation,
  allocation, launch) takes longer than the previous call's kernel, the device waits and the
  time shows.
* Device only (:func:`sample_interleaved`): the calls queue behind a device-side hold, so a
  mark pair measures the kernels alone, whatever the host costs.

``fn(i)`` is called with a rotation index so callers can cycle through several input sets whose
total size exceeds the L2 cache; otherwise repeated runs would time the cache, not the kernel.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
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

    def hold(self, ms: float) -> None: ...


#: Host time per timed call that the device hold before the timed calls covers (ms): well
#: above attnlab's launch overhead (~0.2 ms) and SDPA's (~0.04 ms).
HOLD_MS_PER_CALL = 0.5
#: SM clock cycles per millisecond assumed to size the hold (2 GHz: at lower clocks the hold
#: only lasts longer).
CYCLES_PER_MS = 2_000_000


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

    def hold(self, ms: float) -> None:
        """Keep the stream busy for about ``ms`` (a spinning kernel), so that the work
        enqueued meanwhile waits in the queue instead of for the host."""
        import torch

        torch.cuda._sleep(int(ms * CYCLES_PER_MS))


class TimedCallError(RuntimeError):
    """An implementation that failed while being timed (``name``; the cause is chained)."""

    def __init__(self, name: str, exc: Exception):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.name = name


def round_orders(count: int, rounds: int) -> list[list[int]]:
    """The order of ``count`` functions in each of ``rounds`` rounds: a Williams design (a
    Latin square balanced for carry-over) taken in turn. Over each full cycle (``count``
    rounds for an even count, twice that for an odd one) every function runs at every place
    of a round equally often and right after every other function equally often, so neither
    its place (a GPU cooler at the start of a round) nor its predecessor (another library's
    calls leaving the CPU's caches cold, its data in L2) favours one of them. Two functions
    alternate direction, as the first design did; with more, reversing alternate rounds put
    the second function right after an outsider every other round while the first always
    followed itself or the second."""
    if count < 1 or rounds < 0:
        raise ValueError(f"need count >= 1, rounds >= 0; got {count}, {rounds}")
    first = [0]
    for step in range(1, count):
        first.append((step + 1) // 2 if step % 2 else count - step // 2)
    square = [[(index + shift) % count for index in first] for shift in range(count)]
    if count % 2:
        square += [row[::-1] for row in square]
    return [square[r % len(square)] for r in range(rounds)]


def sample_interleaved(fns: dict[str, Callable[[int], object]], *, warmup: int = 5,
                       runs: int = 30, rotations: int = 1, clock: Clock | None = None
                       ) -> dict[str, list[float]]:
    """Milliseconds of ``runs`` calls of each function, taken round-robin.

    Each round calls every function once, in the orders of :func:`round_orders`, so all of
    them see the GPU in the same state: clocks and power that drift over a run, a cooler
    GPU at the start, or the function before, favour none of them. Call number ``k``
    overall gets input set ``k % rotations``, so consecutive calls never share an input
    set. ``warmup`` untimed rounds come first; marks are read only after the last call, so
    timing never synchronises between calls. A function that raises is reported as
    ``TimedCallError``.

    The timed calls queue behind a device-side hold (``clock.hold``) long enough for the host
    to enqueue them all, with Python's garbage collector paused: a mark pair then measures
    the call's device time even when its host side (launch overhead, a collection) takes
    longer than the previous call's kernel. Without it, the device idles between a start
    mark and a launch that is still on its way, and that idle time is counted.
    """
    if runs < 1 or warmup < 0 or rotations < 1:
        raise ValueError(f"need runs >= 1, warmup >= 0, rotations >= 1; got {runs}, {warmup}, "
                         f"{rotations}")
    clock = clock if clock is not None else CudaEventClock()
    names = list(fns)
    calls = 0

    def call(name: str) -> None:
        nonlocal calls
        try:
            fns[name](calls % rotations)
        except Exception as exc:
            raise TimedCallError(name, exc) from exc
        calls += 1

    for _ in range(warmup):
        for name in names:
            call(name)
    clock.wait()
    marks: dict[str, list[tuple[object, object]]] = {name: [] for name in names}
    collecting = gc.isenabled()
    gc.disable()
    try:
        clock.hold(HOLD_MS_PER_CALL * runs * len(names))
        for order in round_orders(len(names), runs):
            for name in (names[i] for i in order):
                start = clock.mark()
                call(name)
                marks[name].append((start, clock.mark()))
    finally:
        if collecting:
            gc.enable()
    clock.wait()
    return {name: [clock.elapsed_ms(start, stop) for start, stop in pairs]
            for name, pairs in marks.items()}


#: A back-to-back span lasts at least this long (ms), so the marks' own cost is negligible.
SPAN_MS = 2.0
#: At most this many calls per span (small problems).
MAX_CALLS_PER_SPAN = 50


def calls_per_span(call_ms: float) -> int:
    """Calls per end-to-end span for a call that takes about ``call_ms``."""
    if call_ms <= 0:
        return MAX_CALLS_PER_SPAN
    return max(1, min(MAX_CALLS_PER_SPAN, math.ceil(SPAN_MS / call_ms)))


def sample_back_to_back(fns: dict[str, Callable[[int], object]], *, calls: dict[str, int],
                        rounds: int = 20, warmup: int = 3, rotations: int = 1,
                        clock: Clock | None = None) -> dict[str, list[float]]:
    """End-to-end milliseconds per call of each function: per round, ``calls[name]`` calls
    back to back between two marks, the span divided by the calls.

    Rounds go round-robin over the functions in the orders of :func:`round_orders`, as in
    :func:`sample_interleaved`; the device is drained before every span, so nothing queued
    earlier hides the host side of the calls. Call ``k`` of a function gets input set
    ``k % rotations``. A function that raises is reported as ``TimedCallError``.
    """
    if rounds < 1 or warmup < 0 or rotations < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0, rotations >= 1; got {rounds}, "
                         f"{warmup}, {rotations}")
    clock = clock if clock is not None else CudaEventClock()
    names = list(fns)
    counts = dict.fromkeys(names, 0)

    def call(name: str) -> None:
        try:
            fns[name](counts[name] % rotations)
        except Exception as exc:
            raise TimedCallError(name, exc) from exc
        counts[name] += 1

    for _ in range(warmup):
        for name in names:
            call(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for order in round_orders(len(names), rounds):
        for name in (names[i] for i in order):
            clock.wait()
            start = clock.mark()
            for _ in range(calls[name]):
                call(name)
            stop = clock.mark()
            clock.wait()
            samples[name].append(clock.elapsed_ms(start, stop) / calls[name])
    return samples


def host_us_per_call(fn: Callable[[int], object], *, calls: int = 2000, warmup: int = 50,
                     rotations: int = 1) -> float:
    """Host microseconds per call: wall time of ``calls`` calls enqueued without waiting,
    divided by the calls. Meaningful when the device keeps up (small problems): then the host
    side (Python, validation, allocation, launch) is the whole cost of a call."""
    import torch

    for i in range(warmup):
        fn(i % rotations)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i % rotations)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def time_calls(fn: Callable[[int], object], *, warmup: int = 5, runs: int = 30,
               rotations: int = 1, clock: Clock | None = None) -> Timing:
    """One function timed: median, min and max of ``runs`` calls after ``warmup``."""
    return summarize(sample_interleaved({"fn": fn}, warmup=warmup, runs=runs,
                                        rotations=rotations, clock=clock)["fn"])


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                    causal: bool = False, window: tuple[int, int] | None = None) -> float:
    """Forward FLOPs as FlashAttention reports them: 4 B H Sq Sk D (halved when causal); with
    a sliding ``window``, 4 B H D times the (query, key) pairs inside it (``window_pairs``)."""
    if window is not None:
        return 4.0 * batch * heads * head_dim * window_pairs(seqlen_q, seqlen_k, window)
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def window_pairs(seqlen_q: int, seqlen_k: int, window: tuple[int, int]) -> int:
    """(query, key) pairs inside ``window = (left, right)`` (-1: a side unbounded), aligned to
    the bottom right as FlashAttention's windows are: query ``i`` sees keys ``i + Sk - Sq -
    left`` to ``i + Sk - Sq + right``."""
    import torch

    left, right = window
    diagonal = torch.arange(seqlen_q) + (seqlen_k - seqlen_q)
    first = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
    last = ((diagonal + right).clamp(max=seqlen_k - 1) if right >= 0
            else torch.full_like(diagonal, seqlen_k - 1))
    return int((last - first + 1).clamp(min=0).sum())


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
