"""Time the Hopper kernel's schedule knobs against the default and the peers, in one run.

Usage (GPU): python scripts/sm90_candidates.py [--out DIR]
For each point (bf16, 16k tokens, hidden 2048) it times the wgmma default, the default with
``intra_wg_overlap``, with ``pingpong`` and with both (at hd64 the overlap takes B_c = 128,
where its registers fit), next to SDPA flash, cuDNN and FA4: TFLOP/s end to end and device
only. The table goes to stdout, the numbers to OUT/sm90_candidates.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab import policy
from attnlab.bench.baselines import available_peers
from attnlab.bench.runner import Point, attnlab_impl, measure_point

POINTS = [Point(16384 // s, s, s, 2048 // hd, hd, "bfloat16", causal)
          for hd, seqlens in ((128, (1024, 4096, 16384)), (64, (4096, 16384)))
          for causal in (False, True) for s in seqlens]


def candidates(head_dim: int) -> dict:
    base = policy.default_for("sm_90a", head_dim)
    overlap = {"intra_wg_overlap": True, **({"block_n": 128} if head_dim == 64 else {})}
    return {"default": base, "overlap": base.replace(**overlap),
            "pingpong": base.replace(pingpong=True),
            "both": base.replace(pingpong=True, **overlap)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    peers = {name: fn for name, fn in available_peers().items()
             if name in ("sdpa_flash", "sdpa_cudnn", "fa4")}
    rows = []
    for point in POINTS:
        configs = candidates(point.head_dim)
        impls = {**peers, **{name: attnlab_impl(cfg) for name, cfg in configs.items()}}
        results = measure_point(point, impls, runs=args.runs)
        row = {"point": point.label(), "configs": {n: c.short_name() for n, c in configs.items()}}
        for r in results:
            row[r.impl] = [r.tflops, r.device_tflops, r.error]
        rows.append(row)
        cells = "  ".join(f"{r.impl} {r.tflops:.0f}({r.device_tflops:.0f})" if r.tflops
                          else f"{r.impl} failed" for r in results)
        print(f"{point.label()}: {cells}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm90_candidates.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
