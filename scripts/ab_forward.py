"""Time the forward's default against cuDNN with whichever attnlab is on ``PYTHONPATH``: an A/B
of two source trees (an older commit unpacked beside this one, then this one), each in its own
process, each normalised by cuDNN from the same process.

Usage (GPU): PYTHONPATH=OLD/src python scripts/ab_forward.py --label old --out DIR
[--points 64:4096,32:4096:plain:float16] [--runs 20]. Points are head_dim:seqlen[:mask[:dtype]]
(mask causal or plain, causal if left out; dtype bfloat16 if left out), batch 4 x 16 heads;
the table goes to stdout, the numbers to OUT/ab_<label>.json. Only the bench runner's API
that both trees share is used, so an older tree runs it unchanged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import attnlab
from attnlab import kernel_cache
from attnlab.bench.baselines import available_peers
from attnlab.bench.runner import Point, attnlab_impl, measure_point
from attnlab.kernels.abi import ForwardSpec
from attnlab.policy import default_for, paired_row_blocks


def parse_point(text: str) -> Point:
    """``head_dim:seqlen[:causal|plain[:dtype]]`` at batch 4 x 16 heads."""
    head_dim, seqlen, *rest = text.split(":")
    mask = rest[0] if rest else "causal"
    if mask not in ("causal", "plain"):
        raise SystemExit(f"mask {mask!r} in {text!r}: causal or plain")
    dtype = rest[1] if len(rest) > 1 else "bfloat16"
    if dtype not in ("bfloat16", "float16"):
        raise SystemExit(f"dtype {dtype!r} in {text!r}: bfloat16 or float16")
    return Point(4, int(seqlen), int(seqlen), 16, int(head_dim), dtype, mask == "causal")


def default_config(point: Point):
    """The config ``attention()`` runs at ``point``: the policy's default, its unmasked row
    blocks paired in clusters where ``dispatch`` pairs them (before the sixtieth session this
    script timed unmasked hd128-256 points without the pairing)."""
    config = default_for("sm_90a", point.head_dim, point.causal, dtype=point.dtype,
                         seqlen=point.seqlen_q)
    return config if point.causal else paired_row_blocks(config, point.head_dim, point.seqlen_q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--points", default="32:4096,64:4096,96:4096,192:4096,64:8192")
    args = parser.parse_args()
    points = [parse_point(p) for p in args.points.split(",")]
    configs = [default_config(p) for p in points]
    kernel_cache.warm([ForwardSpec(cfg, "sm_90a", p.dtype, p.head_dim, p.causal)
                       for p, cfg in zip(points, configs, strict=True)], jobs=16)
    cudnn = available_peers()["sdpa_cudnn"]
    rows = []
    for point, cfg in zip(points, configs, strict=True):
        results = {r.impl: r for r in measure_point(
            point, {"cudnn": cudnn, "attnlab": attnlab_impl(cfg)}, runs=args.runs)}
        mine, peer = results["attnlab"], results["cudnn"]
        row = {"point": point.label(), "config": cfg.short_name(),
               "tflops": mine.tflops, "device_tflops": mine.device_tflops,
               "cudnn_tflops": peer.tflops, "cudnn_device_tflops": peer.device_tflops,
               "error": mine.error}
        rows.append(row)
        e2e, dev = mine.tflops / peer.tflops, mine.device_tflops / peer.device_tflops
        print(f"{args.label:>4} {point.label():<28} {cfg.short_name():<40} e2e {e2e:.3f}  "
              f"dev {dev:.3f}  ({mine.device_tflops:.0f} vs {peer.device_tflops:.0f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"ab_{args.label}.json").write_text(
        json.dumps({"attnlab": attnlab.__file__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
