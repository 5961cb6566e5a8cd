"""GEMM plans against cuBLAS at the skinny and small shapes, in one run: what split-K dispatch
should pick (``python3 scripts/gemm_candidates.py --out DIR``)."""

import argparse
import json
from pathlib import Path

import torch

from attnlab import device
from attnlab.bench.gemm import GemmPoint, best_lines, gemm_impls, measure_gemm
from attnlab.gemm import GemmConfig

SHAPES = [(1024, 1024, 1024), (512, 512, 4096), (256, 256, 4096), (256, 256, 8192),
          (128, 128, 8192), (1, 4096, 4096), (16, 4096, 4096)]
CONFIGS = {f"{bm}x{bn} s{s} {mode[0]}": GemmConfig(block_m=bm, block_n=bn, split_k=s,
                                                   split_mode=mode)
           for bm in (64, 128) for bn in (64, 128) for s in (1, 2, 4, 8, 16)
           for mode in ("serial", "workspace") if not (s == 1 and mode != "serial")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    info = device.info(torch.device("cuda"))
    points = [GemmPoint(m, n, k, "bfloat16", "k" if m <= 16 else "n") for m, n, k in SHAPES]
    results = measure_gemm(points, gemm_impls(CONFIGS), info.l2_bytes, runs=20)
    rows = [r.to_dict() for r in results]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm_candidates.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(best_lines(results, points, "cublas")))


if __name__ == "__main__":
    main()
