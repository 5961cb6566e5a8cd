"""GEMM plans against cuBLAS at the skinny and small shapes, in one run: what split-K dispatch
should pick (``python3 scripts/gemm_candidates.py --out DIR``)."""

import argparse
import ast
import json
from pathlib import Path

import torch

from attnlab import device
from attnlab.bench.gemm import GemmPoint, best_lines, gemm_impls, measure_gemm
from attnlab.gemm.tune import split_configs

SHAPES = [(1024, 1024, 1024), (512, 512, 4096), (256, 256, 4096), (256, 256, 8192),
          (128, 128, 8192), (1, 4096, 4096), (16, 4096, 4096)]
MODES = ("serial", "workspace", "cluster")
TILES = ((64, 64), (64, 128), (128, 64), (128, 128))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--modes", default=",".join(MODES),
                        help="split modes weighed (the first also unsplit)")
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    parser.add_argument("--tiles", default=",".join(f"{m}x{n}" for m, n in TILES),
                        help="BMxBN or BMxBNxBK tiles, comma-separated")
    parser.add_argument("--splits", default="1,2,4,8,16")
    parser.add_argument("--also", default="",
                        help="KNOB=VALUE (a GemmConfig field, e.g. pdl=False): each candidate "
                             "also with it")
    args = parser.parse_args()
    info = device.info(torch.device("cuda"))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    points = [GemmPoint(m, n, k, "bfloat16", "k" if m <= 16 else "n") for m, n, k in shapes]
    tiles = tuple(tuple(int(x) for x in t.split("x")) for t in args.tiles.split(","))
    counts = tuple(int(x) for x in args.splits.split(","))
    configs = split_configs(tiles, counts, tuple(args.modes.split(",")))
    if args.also:
        knob, value = args.also.split("=")
        configs |= {f"{name} {args.also}": cfg.replace(**{knob: ast.literal_eval(value)})
                    for name, cfg in configs.items()}
    results = measure_gemm(points, gemm_impls(configs), info.l2_bytes, runs=20)
    rows = [r.to_dict() for r in results]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm_candidates.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(best_lines(results, points, "cublas", top=len(configs) + 1)))


if __name__ == "__main__":
    main()
