"""Sliding windows: the masked default chosen by each query-length bucket, against FA4.

Usage (GPU): python scripts/window_candidates.py [--head-dims 64,128,256]
[--seqlen 8192,16384] [--windows 512:512,1024:0,2048:0,4096:0] [--dtypes bfloat16[,float16]]
[--runs 15] [--out DIR]

A causal mask's tiles walk 0 to Sq keys, so the masked default is chosen by the query length
(``dispatch``: the length's bucket); a sliding window's tiles each walk about its span
(``left + right + 1`` keys), whatever the length. At each point (16k tokens of hidden 2048)
this times the dispatch's choice at every bucket (``dispatch.choose``: the tile and
grid that bucket's causal problems get, the static walk handed to the counter where it is
unbalanced) beside FA4 (``bench.baselines.fa4``), device only and end to end, TFLOP/s over
the window's pairs (``bench.timing.window_pairs``); each variant's output is checked against
the default's. The table goes to stdout, the numbers to OUT/window_candidates.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import torch

from attnlab import device, dispatch, kernel_cache
from attnlab.bench.baselines import fa4
from attnlab.bench.runner import Point, attnlab_impl, input_sets, measure_point
from attnlab.kernels.abi import ForwardSpec
from attnlab.tune.cache import SEQLEN_BUCKETS
from attnlab.validation import Problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--seqlen", default="8192,16384")
    parser.add_argument("--windows", default="512:512,1024:0,2048:0,4096:0",
                        help="left:right pairs, comma-separated")
    parser.add_argument("--dtypes", default="bfloat16", help="bfloat16, float16 or both")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()

    gpu = device.info()
    windows = [tuple(int(x) for x in w.split(":")) for w in args.windows.split(",")]
    points = []
    for dtype, head_dim, seqlen, window in itertools.product(
            args.dtypes.split(","), (int(h) for h in args.head_dims.split(",")),
            (int(s) for s in args.seqlen.split(",")), windows):
        problem = Problem(batch=max(1, 16384 // seqlen), seqlen_q=seqlen,
                          seqlen_k=seqlen, num_heads=2048 // head_dim,
                          num_heads_kv=2048 // head_dim, head_dim=head_dim,
                          dtype=getattr(torch, dtype), softmax_scale=head_dim ** -0.5,
                          window=window)
        configs = {"default": dispatch.config_for(gpu, problem)}
        for bucket in SEQLEN_BUCKETS:
            config = dispatch.choose(gpu, problem, bucket, False)
            if config not in configs.values():
                configs[f"bucket{bucket}"] = config
        points.append((problem, configs))
    kernel_cache.warm(list({ForwardSpec(c, gpu.arch, p.dtype_name, p.head_dim, True)
                            for p, configs in points for c in configs.values()}), 16)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for problem, configs in points:
        point = Point(problem.batch, problem.seqlen_q, problem.seqlen_k, problem.num_heads,
                      problem.head_dim, problem.dtype_name, window=problem.window)
        impls = {name: attnlab_impl(cfg) for name, cfg in configs.items()}
        impls["fa4"] = fa4()
        sets = input_sets(point)
        q, k, v = sets[0]
        scale = problem.head_dim ** -0.5
        reference = impls["default"](q, k, v, scale, point.mask).float()
        diffs = {name: float((fn(q, k, v, scale, point.mask).float() - reference).abs().max())
                 for name, fn in impls.items() if name != "default"}
        row = {"point": point.label(), "max_abs_diff_to_default": diffs,
               "configs": {name: c.short_name() for name, c in configs.items()}}
        for result in measure_point(point, impls, runs=args.runs, sets=sets):
            row[result.impl] = (result.error if result.timing is None else
                                [result.tflops, result.device_tflops])
        rows.append(row)
        print(row["point"] + ": " + "  ".join(
            f"{name} {row[name][0]:.0f} ({row[name][1]:.0f})" if isinstance(row[name], list)
            else f"{name} {row[name]}" for name in impls), flush=True)
    (args.out / "window_candidates.json").write_text(json.dumps(rows))
    # bf16 outputs of one function differ by a few units in their last place (3.9e-3 here).
    wrong = {row["point"]: name for row in rows
             for name, diff in row["max_abs_diff_to_default"].items()
             if math.isnan(diff) or diff > 0.05}
    if wrong:
        raise SystemExit(f"outputs differ from the default's: {wrong}")


if __name__ == "__main__":
    main()
