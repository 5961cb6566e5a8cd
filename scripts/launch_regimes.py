"""Does a decoding call's host side cost more when the GPU has drained than when work is still
queued? (issue 21: at B = 1 x 32k MQA a contiguous call measured 19.5-27 us end to end, its
paged twin 37-49 us, with the same kernels' busy time, 16.3 / 16.7 us, and the same profiled
enqueue time; 1-launch calls at 4k took 33 us, more than the 2-launch contiguous 32k call.)

Usage (GPU): python scripts/launch_regimes.py [--out DIR] [--points B:KEYS:HQ:HKV,...]
For each point (hd128 bf16, ``attnlab bench --decode``'s inputs in rotation), contiguous and
paged, and for two controls (a 1-element ``add_`` and SDPA flash at the point), spans of 50
calls in alternating order, each span in two regimes: ``drained`` (the device synchronized
before the span, as the bench's end-to-end spans start) and ``primed`` (a 20 ms
``torch.cuda._sleep`` enqueued first, so every call of the span is queued behind work). Per
span: host microseconds per call (wall time of the enqueue) and, drained, the end-to-end
microseconds per call on CUDA events. Prints the medians, writes OUT/launch_regimes.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from attnlab import device
from attnlab.bench.decode import decode_impls, decode_sets, parse_points
from attnlab.bench.runner import Point

POINTS = ((1, 4096, 8, 1), (1, 32768, 8, 1), (1, 131072, 8, 1), (1, 4096, 32, 8))
HEAD_DIM = 128
CALLS = 50
ROUNDS = 15


def sleep_cycles(ms: float) -> int:
    """``torch.cuda._sleep`` cycles of about ``ms`` milliseconds on this GPU."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    stop.record()
    stop.synchronize()
    return int(10_000_000 * ms / start.elapsed_time(stop))


def span(fn, primed_cycles: int | None) -> tuple[float, float | None]:
    """(host us per call, end-to-end us per call or None when primed)."""
    torch.cuda.synchronize()
    if primed_cycles:
        torch.cuda._sleep(primed_cycles)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for i in range(CALLS):
        fn(i)
    host = (time.perf_counter() - t0) / CALLS * 1e6
    stop.record()
    stop.synchronize()
    return host, None if primed_cycles else start.elapsed_time(stop) / CALLS * 1e3


def callables(sets: list[tuple], scale: float) -> dict:
    """attnlab contiguous and paged, SDPA flash and a 1-element ``add_``, each taking the
    call's index (input set ``i % len(sets)``)."""
    impls = decode_impls({})
    transposed = [tuple(t.transpose(1, 2) for t in s[:3]) for s in sets]
    tiny = torch.zeros(1, device="cuda")
    fns = {name: (lambda i, impl=impls[name]: impl(*sets[i % len(sets)], scale, False))
           for name in ("attnlab", "attnlab_paged")}
    fns["sdpa_flash"] = lambda i: torch.nn.functional.scaled_dot_product_attention(
        *transposed[i % len(sets)], scale=scale, enable_gqa=True)
    fns["add_"] = lambda i: tiny.add_(1)
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--points", type=parse_points, default=POINTS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    l2_bytes = device.info(torch.device("cuda")).l2_bytes
    cycles = sleep_cycles(20.0)
    scale = HEAD_DIM ** -0.5
    rows = []
    with torch.no_grad(), torch.nn.attention.sdpa_kernel(
            torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        for batch, keys, heads_q, heads_kv in args.points:
            point = Point(batch, 1, keys, heads_q, HEAD_DIM, heads_kv=heads_kv)
            sets = decode_sets(point, l2_bytes, paged=True)
            fns = callables(sets, scale)
            for fn in fns.values():
                for i in range(30):
                    fn(i)
            samples = {(name, regime): [] for name in fns for regime in ("drained", "primed")}
            ends = {name: [] for name in fns}
            for r in range(ROUNDS):
                names = list(fns) if r % 2 == 0 else list(reversed(fns))
                for name in names:
                    host, end = span(fns[name], None)
                    samples[name, "drained"].append(host)
                    ends[name].append(end)
                    samples[name, "primed"].append(span(fns[name], cycles)[0])
            for name in fns:
                row = {"point": f"{point.label()}", "impl": name,
                       "host_drained_us": statistics.median(samples[name, "drained"]),
                       "host_primed_us": statistics.median(samples[name, "primed"]),
                       "end_to_end_us": statistics.median(ends[name]),
                       "end_to_end_all_us": ends[name]}
                rows.append(row)
                print(f"{row['point']:40s} {name:14s} host drained {row['host_drained_us']:6.1f}"
                      f"  primed {row['host_primed_us']:6.1f}  end to end "
                      f"{row['end_to_end_us']:6.1f}", flush=True)
    (args.out / "launch_regimes.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
