"""Time wgmma tiles per head dim against the peers, in one run (what ``SM90A_WGMMA_KNOBS``
is chosen from).

Usage (GPU): python scripts/sm90_candidates.py [--head-dims 32,96,192,256]
[--masks plain,causal] [--out DIR]
For each head dim, plain and causal, bf16, batch 4 x 16 heads x seq 4k, it times the
wgmma kernel with each candidate tile (B_c, ring stages; FA3's two overlaps on, or as noted)
next to SDPA flash, cuDNN and FA4: TFLOP/s end to end and device only. The candidates are
compiled into the kernel cache in parallel first. The table goes to stdout, the numbers to
OUT/sm90_candidates.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab import kernel_cache
from attnlab.bench.baselines import available_peers
from attnlab.bench.runner import Point, attnlab_impl, measure_point
from attnlab.config import FlashConfig
from attnlab.kernels.abi import ForwardSpec
from attnlab.ladder import HOPPER_STEPS

SCHEDULE = {"intra_wg_overlap": True, "pingpong": True}
#: Three consumer warpgroups: 192 query rows per CTA.
M192 = {"block_m": 192, "num_warps": 12}
#: Candidate tiles per head dim (B_r = 64 per consumer warpgroup, B_c, ring stages; ``_fence``:
#: P's registers pinned, ``fence_p``): each spill-free and within shared memory (B_c x stages
#: bounded by 227 KB at hd192/256).
TILES: dict[int, dict[str, dict[str, object]]] = {
    32: {"m128bn128x3": {"block_n": 128, "kv_stages": 3},
         "m192bn128x3": {**M192, "block_n": 128, "kv_stages": 3}},
    64: {"m128bn128x3": {"block_n": 128, "kv_stages": 3},
         "m192bn128x3": {**M192, "block_n": 128, "kv_stages": 3}},
    96: {"bn128x2": {"block_n": 128, "kv_stages": 2},
         "m192bn96x2_fence": {**M192, "block_n": 96, "kv_stages": 2, "fence_p": True}},
    128: {"m128bn128x3": {"block_n": 128, "kv_stages": 3}},
    192: {"bn96x2_fence": {"block_n": 96, "kv_stages": 2, "fence_p": True}},
    256: {"bn64x2": {"block_n": 64, "kv_stages": 2},
          "bn80x2": {"block_n": 80, "kv_stages": 2},
          "bn80x2_fence": {"block_n": 80, "kv_stages": 2, "fence_p": True}},
}
#: Each candidate also with the longest-first order over L2 sections (``lpt``; masked only).
TILES = {hd: {**tiles, **{f"{name}_lpt": {**knobs, "lpt": True}
                          for name, knobs in tiles.items()}}
         for hd, tiles in TILES.items()}


def candidates(head_dim: int) -> dict[str, FlashConfig]:
    return {name: HOPPER_STEPS["wgmma"].replace(**{**SCHEDULE, **knobs})
            for name, knobs in TILES[head_dim].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--head-dims", default="32,96,192,256")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--masks", default="plain,causal",
                        help="plain, causal or both (comma-separated)")
    args = parser.parse_args()
    head_dims = [int(h) for h in args.head_dims.split(",")]
    masks = [{"plain": False, "causal": True}[m] for m in args.masks.split(",")]
    points = [Point(4, args.seqlen, args.seqlen, 16, hd, "bfloat16", causal)
              for hd in head_dims for causal in masks]
    kernel_cache.warm([ForwardSpec(cfg, "sm_90a", p.dtype, p.head_dim, p.causal)
                       for p in points for cfg in candidates(p.head_dim).values()], jobs=16)
    peers = {name: fn for name, fn in available_peers().items()
             if name in ("sdpa_flash", "sdpa_cudnn", "fa4")}
    rows = []
    for point in points:
        configs = candidates(point.head_dim)
        impls = {**peers, **{name: attnlab_impl(cfg) for name, cfg in configs.items()}}
        results = measure_point(point, impls, runs=args.runs)
        row = {"point": point.label(), "configs": {n: c.short_name() for n, c in configs.items()}}
        for r in results:
            row[r.impl] = [r.tflops, r.device_tflops, r.error]
        rows.append(row)
        cells = "  ".join(f"{r.impl} {r.tflops:.0f}({r.device_tflops:.0f})" if r.tflops
                          else f"{r.impl} failed: {(r.error or '')[:80]}" for r in results)
        print(f"{point.label()}: {cells}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm90_candidates.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
