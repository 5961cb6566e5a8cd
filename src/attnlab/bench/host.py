"""What a call costs the host: problems too small to keep the GPU busy, and a process's first call.

On a small problem the kernel finishes before the next call is launched, so an eager caller
waits for the host side of every call: validation, allocation, the launch. This module times
it three ways per implementation (host microseconds with no waiting, end to end, device only)
and times the first call of a fresh process twice: with an empty kernel cache (a cold
compile) and with the cache that first process left (a kernel loaded from disk).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass

from attnlab.bench.runner import AttentionFn, Point, input_sets
from attnlab.bench.timing import (
    host_us_per_call,
    sample_back_to_back,
    sample_interleaved,
    summarize,
)

#: The issue's host-bound problems: a tiny one and a small hd128 one (bf16).
HOST_POINTS = (Point(1, 128, 128, 16, 64), Point(4, 512, 512, 16, 128))
#: Calls per end-to-end span for host-bound problems.
HOST_CALLS_PER_SPAN = 50


@dataclass(frozen=True)
class HostResult:
    """Microseconds per call of one implementation on one small problem."""

    point: Point
    impl: str
    host_us: float | None
    end_to_end_us: float | None
    device_us: float | None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "point": asdict(self.point)}


def measure_host(points: tuple[Point, ...], impls: dict[str, AttentionFn], *,
                 calls: int = 2000, rounds: int = 10,
                 on_point: Callable[[Point], None] | None = None) -> list[HostResult]:
    """Host, end-to-end and device microseconds per call of each implementation."""
    results = []
    for point in points:
        q, k, v = input_sets(point)[0]
        scale = 1.0 / math.sqrt(point.head_dim)
        args = (q, k, v, scale, point.mask)
        for name, fn in impls.items():
            def call(i: int, fn: AttentionFn = fn, args: tuple = args) -> object:
                return fn(*args)

            try:
                host = host_us_per_call(call, calls=calls)
                e2e = sample_back_to_back({name: call}, calls={name: HOST_CALLS_PER_SPAN},
                                          rounds=rounds)[name]
                device = sample_interleaved({name: call}, runs=rounds * 3)[name]
                results.append(HostResult(point, name, host, summarize(e2e).median_ms * 1e3,
                                          summarize(device).median_ms * 1e3))
            except Exception as exc:  # a peer that cannot run here is a row, not a crash
                results.append(HostResult(point, name, None, None, None,
                                          f"{type(exc).__name__}: {exc}"))
        if on_point is not None:
            on_point(point)
    return results


_FIRST_CALL = """
import json, time, torch
b, s, h, d = {shape}
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
torch.cuda.synchronize()
start = time.perf_counter()
import attnlab
imported = time.perf_counter()
attnlab.attention(q, k, v)
torch.cuda.synchronize()
done = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "first_call_s": done - imported}}))
"""


def first_call_seconds(point: Point = HOST_POINTS[1]) -> dict[str, float]:
    """Seconds of ``import attnlab`` and of the first ``attention()`` call in a fresh process:
    once with an empty kernel cache (the call compiles), once more with the cache the first
    process filled (the call loads the kernel from disk)."""
    shape = (point.batch, point.seqlen_q, point.heads, point.head_dim)
    code = _FIRST_CALL.format(shape=shape)
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "ATTNLAB_CACHE_DIR": cache, "ATTNLAB_DISK_CACHE": "1"}
        for label in ("cold_compile", "warm_disk_cache"):
            run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True)
            result = json.loads(run.stdout.strip().splitlines()[-1])
            times[f"{label}_first_call_s"] = result["first_call_s"]
            times[f"{label}_import_s"] = result["import_s"]
    return times
