"""Where a host-bound decoding call's end-to-end time goes on the device's clock, contiguous
against paged (issue 21: the paged call reads 4-10 % below the contiguous one end to end at
B = 1 and 8 x 4k, while its enqueue time is the same and its kernel 0.3-0.6 us longer).

Usage (GPU): python scripts/decode_spans.py [--out DIR] [--calls N] [--points B:KEYS:HQ:HKV,...]
For B = 1 and 8 at 4k keys, GQA 32/8 and MQA 8/1 (or ``--points``), hd128 bf16, on ``attnlab bench
--decode``'s inputs (its input sets in rotation): the bench's end-to-end microseconds per
call (``bench.timing.sample_back_to_back``), then ``--calls`` back-to-back calls under
torch.profiler (CUDA activity): the host's enqueue time per call while profiled, and from
the kernel timeline each call's period, busy and idle time (``analysis.timeline``) and each
of its kernels' duration and start after the kernel before.
Prints a table, writes OUT/decode_spans.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from attnlab import device
from attnlab.analysis.timeline import call_spans
from attnlab.bench.decode import decode_impls, decode_sets, parse_points
from attnlab.bench.runner import Point
from attnlab.bench.timing import MAX_CALLS_PER_SPAN, sample_back_to_back

POINTS = ((1, 4096, 32, 8), (8, 4096, 32, 8), (1, 4096, 8, 1), (8, 4096, 8, 1))
HEAD_DIM = 128


def kernel_intervals(prof) -> list[tuple[float, float]]:
    """(start_us, end_us) of every kernel the profiler saw (copies and fills left out)."""
    return [(e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]


def measure(point: Point, paged: bool, calls: int, l2_bytes: int) -> dict:
    sets = decode_sets(point, l2_bytes, paged=True)
    impl = decode_impls({})["attnlab_paged" if paged else "attnlab"]
    scale = HEAD_DIM ** -0.5

    def call(i: int) -> None:
        impl(*sets[i % len(sets)], scale, False)

    for i in range(50):
        call(i)
    torch.cuda.synchronize()
    name = "paged" if paged else "contiguous"
    # The bench's span at these host-bound points: its most calls per span.
    end_to_end = sample_back_to_back({name: call}, calls={name: MAX_CALLS_PER_SPAN},
                                     rounds=20, rotations=len(sets))[name]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        enqueue_us = (time.perf_counter() - start) / calls * 1e6
        torch.cuda.synchronize()
    kernels = sorted(kernel_intervals(prof))
    per_call = len(kernels) // calls
    # Each of a call's kernels (in launch order): its median duration, and its start after
    # the previous kernel's end (negative: launched early and overlapping it, PDL).
    parts = {}
    for i in range(per_call):
        mine = kernels[i::per_call]
        parts[f"kernel{i}_us"] = statistics.median(end - start for start, end in mine)
        if i:
            earlier = kernels[i - 1::per_call]
            parts[f"kernel{i}_after_us"] = statistics.median(
                start - before[1] for (start, _), before in zip(mine, earlier, strict=False))
    return {"point": f"{point.label()} {name}", "sets": len(sets),
            "end_to_end_us": statistics.median(end_to_end) * 1e3,
            "profiled_enqueue_us": enqueue_us, "kernels_per_call": len(kernels) / calls,
            **call_spans(kernels, per_call).to_dict(), **parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--points", type=parse_points, default=POINTS,
                        help="B:KEYS:HQ:HKV, comma-separated (default: the four 4k points)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    l2_bytes = device.info(torch.device("cuda")).l2_bytes
    rows = []
    with torch.no_grad():
        for (batch, keys, heads_q, heads_kv), paged in itertools.product(args.points,
                                                                          (False, True)):
            point = Point(batch, 1, keys, heads_q, HEAD_DIM, heads_kv=heads_kv)
            row = measure(point, paged, args.calls, l2_bytes)
            rows.append(row)
            print(row["point"], " ".join(f"{k}={v:.2f}" for k, v in row.items()
                                         if isinstance(v, float)), flush=True)
    (args.out / "decode_spans.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
