"""Implicit-GEMM convolution plans against cuDNN at the SD-UNet shapes with C >= 320, in one
run: which tile and split count the conv dispatch should pick
(``python3 scripts/conv_candidates.py --out DIR``). The candidates' kernels are compiled in
parallel first; tables print per point (the five best, ratios to cuDNN end to end and device
only), all results go to ``DIR/conv_candidates.json``."""

import argparse
import json
import os
from pathlib import Path

import torch

from attnlab import device, kernel_cache
from attnlab.bench.conv import ConvPoint, conv_impls, conv_sets
from attnlab.bench.gemm import best_lines, measure_gemm
from attnlab.conv import conv2d
from attnlab.gemm.tune import split_configs
from attnlab.kernels.conv.abi import ImplicitConvSpec
from attnlab.kernels.gemm.abi import binary_config

SHAPES = [(n, c, hw) for n in (1, 4) for c, hw in ((320, 64), (640, 32), (640, 16), (512, 16))]
TILES = ((128, 128), (128, 160), (128, 256), (64, 64), (64, 128), (64, 160), (64, 256))
SPLITS = (1, 2, 4)
MODES = ("serial", "cluster")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tiles", default=",".join(f"{m}x{n}" for m, n in TILES))
    parser.add_argument("--splits", default=",".join(map(str, SPLITS)))
    parser.add_argument("--modes", default=",".join(MODES),
                        help="how slices meet (a cluster where the tile shares out)")
    args = parser.parse_args()
    info = device.info(torch.device("cuda"))
    tiles = [tuple(int(x) for x in t.split("x")) for t in args.tiles.split(",")]
    configs = split_configs(tuple(tiles), tuple(map(int, args.splits.split(","))),
                            tuple(args.modes.split(",")))
    specs = {ImplicitConvSpec(binary_config(cfg), info.arch, "bfloat16",
                              split="none" if cfg.split_k == 1 else cfg.split_mode, bias=True)
             for cfg in configs.values()}
    kernel_cache.warm(sorted(specs, key=str), jobs=min(12, os.cpu_count() or 1))
    impls = {name: impl for name, impl in conv_impls().items() if name in ("cudnn", "attnlab")}
    for name, cfg in configs.items():
        impls[name] = (lambda x, w, b, s, p, cfg=cfg: conv2d(x, w, b, stride=s, padding=p,
                                                              algorithm="implicit",
                                                              config=cfg))
    points = [ConvPoint(n, c, hw, c) for n, c, hw in SHAPES]
    results = measure_gemm(points, impls, info.l2_bytes, runs=20, make_sets=conv_sets)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conv_candidates.json").write_text(
        json.dumps({"device": info.name, "results": [r.to_dict() for r in results]}, indent=1))
    print("\n".join(best_lines(results, points, "cudnn", also="attnlab")))


if __name__ == "__main__":
    main()
