"""What each implementation launches at one attention point: kernel names, grid, block,
registers and shared memory from the torch profiler's trace, and each kernel's median time.

Usage (GPU): python3 scripts/attention_peer_probe.py --point 16,1024,32,64,bfloat16,causal
[--calls 10] [--out DIR]
(B, S, H, D, dtype[, causal]); attnlab's default, FA4 where it imports, cuDNN and FA2 through
torch SDPA. Reads how a peer tiles a problem where it leads (e.g. cuDNN at hd64 causal 1k).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from attnlab.bench.baselines import available_peers
from attnlab.bench.runner import Point, attnlab_impl, input_sets

#: The trace's per-kernel launch fields, as kineto names them.
LAUNCH_FIELDS = ("grid", "block", "registers per thread", "shared memory",
                 "blocks per SM", "est. achieved occupancy %")


def parse_point(text: str) -> Point:
    fields = text.split(",")
    batch, seqlen, heads, head_dim = (int(x) for x in fields[:4])
    dtype = fields[4] if len(fields) > 4 else "bfloat16"
    causal = len(fields) > 5 and fields[5] == "causal"
    return Point(batch, seqlen, seqlen, heads, head_dim, dtype, causal)


def kernels_of(fn, sets, causal: bool, scale: float, calls: int) -> list[dict]:
    """The kernels of ``calls`` calls of ``fn``: name, launch fields, median time (us)."""
    for i in range(3):
        fn(*sets[i % len(sets)], scale, causal)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(*sets[i % len(sets)], scale, causal)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    by_name: dict[str, dict] = {}
    times: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.get("cat") != "kernel":
            continue
        args = event.get("args", {})
        by_name.setdefault(event["name"], {f: args.get(f) for f in LAUNCH_FIELDS})
        times[event["name"]].append(event.get("dur", 0.0))
    return [{"name": name, **fields, "us": statistics.median(times[name]),
             "launches": len(times[name])} for name, fields in by_name.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--point", default="16,1024,32,64,bfloat16,causal")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    point = parse_point(args.point)
    sets = input_sets(point)
    scale = point.head_dim ** -0.5
    impls = {"attnlab": attnlab_impl(), **available_peers()}
    report = {"point": args.point, "impls": {}}
    for name, fn in impls.items():
        try:
            report["impls"][name] = kernels_of(fn, sets, point.causal, scale, args.calls)
        except Exception as exc:  # a peer that cannot run this point is reported, not fatal
            report["impls"][name] = [{"error": f"{type(exc).__name__}: {exc}"}]
    for name, kernels in report["impls"].items():
        for k in kernels:
            if "error" in k:
                print(f"{name:12s} {k['error']}")
                continue
            print(f"{name:12s} {k['us']:8.1f} us x{k['launches']:<3d} grid {k['grid']} "
                  f"block {k['block']} regs {k['registers per thread']} "
                  f"smem {k['shared memory']}  {k['name'][:110]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_peer_probe.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
