"""2:4 sparse ``wgmma`` tiles against the dense attnlab HGEMM and cuBLAS on one pruned A, in one
run: which tile ``SPARSE_WGMMA_CONFIG`` should be, and how its metadata words should come
(``sparse_meta``: by TMA, the default, or by each thread's global loads, the ``meta-global``
entries) (``python3 scripts/sparse_candidates.py --out DIR``)."""

import argparse
import json
from pathlib import Path

import torch

from attnlab import device
from attnlab.bench.gemm import GemmPoint, measure_gemm, sparse_sets
from attnlab.gemm import GemmConfig, matmul, sparse_matmul

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 14336, 4096)]
TILES = {"128x256x64": GemmConfig(), "128x256x128": GemmConfig(block_k=128),
         "128x192x128": GemmConfig(block_n=192, block_k=128),
         "192x128x128": GemmConfig(block_m=192, block_n=128, block_k=128),
         "128x128x128": GemmConfig(block_n=128, block_k=128)}
# The contenders again with the metadata words from global memory (the build before the ring).
TILES |= {f"{name} meta-global": TILES[name].replace(sparse_meta="global")
          for name in ("128x256x128", "128x256x64", "192x128x128")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    info = device.info(torch.device("cuda"))
    impls = {"cublas": lambda a, sparse, semi, b: torch.matmul(a, b),
             "attnlab": lambda a, sparse, semi, b: matmul(a, b)}
    impls |= {name: (lambda a, sparse, semi, b, c=cfg: sparse_matmul(sparse, b, config=c))
              for name, cfg in TILES.items()}
    points = [GemmPoint(m, n, k, "bfloat16", "k") for m, n, k in SHAPES]
    results = measure_gemm(points, impls, info.l2_bytes, runs=20, make_sets=sparse_sets)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sparse_candidates.json").write_text(
        json.dumps([r.to_dict() for r in results], indent=1))
    for point in points:
        mine = {r.impl: r for r in results if r.point == point}
        dense = mine["attnlab"].device_tflops
        print(point.label(), " ".join(
            f"{name} {r.tflops:.0f}({r.device_tflops:.0f}, {r.device_tflops / dense:.2f}x)"
            if r.tflops else f"{name} {(r.error or '-')[:40]}" for name, r in mine.items()))


if __name__ == "__main__":
    main()
