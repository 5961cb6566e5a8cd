"""Kernel configs against the reference (SDPA flash) in one process, on the same inputs.

``python -m attnlab.bench.compare`` prints a table of TFLOP/s and ratios to the reference and
writes the full numbers as JSON. ``--sweep`` adds candidate configs for tuning kernel 7.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.bench.baselines import sdpa
from attnlab.bench.timing import Timing, attention_flops, tflops, time_cuda
from attnlab.config import ConfigError, FlashConfig

REFERENCE = "sdpa_flash"
#: Rotate input sets until they span this multiple of the L2 cache.
L2_SPAN = 3


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    head_dim: int

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k,
                               self.head_dim)


def sweep_candidates() -> dict[str, FlashConfig]:
    """Block shapes, warps and load schedules worth timing for kernel 7 on a Hopper GPU."""
    from attnlab.ladder import k06

    candidates = {}
    for block_m, block_n, warps in ((64, 64, 4), (128, 64, 8), (128, 128, 8), (128, 32, 4),
                                    (128, 64, 4), (64, 128, 4), (128, 128, 4)):
        for q_frags in (0, 2):
            try:
                cfg = k06.replace(block_m=block_m, block_n=block_n, num_warps=warps,
                                  q_frags_per_load=q_frags)
            except ConfigError:
                continue
            candidates[f"m{block_m}n{block_n}w{warps}q{q_frags}"] = cfg
    return candidates


def _input_sets(shape: Shape, dtype: torch.dtype, seed: int) -> list[tuple[torch.Tensor, ...]]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # q, k, v and the output.
    per_set = (torch.finfo(dtype).bits // 8) * shape.batch * shape.heads * shape.head_dim * 2 * (
        shape.seqlen_q + shape.seqlen_k)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    count = max(1, min(8, math.ceil(L2_SPAN * l2 / per_set)))

    def randn(seqlen):
        return torch.randn(shape.batch, seqlen, shape.heads, shape.head_dim, device="cuda",
                           dtype=dtype, generator=gen)

    return [(randn(shape.seqlen_q), randn(shape.seqlen_k), randn(shape.seqlen_k))
            for _ in range(count)]


def measure(configs: dict[str, FlashConfig], shape: Shape, dtype: torch.dtype, *,
            runs: int = 30, warmup: int = 5) -> dict[str, Timing]:
    """Time every config and the reference on the same rotating inputs."""
    from attnlab.runtime import launch_forward

    sets = _input_sets(shape, dtype, seed=0)
    scale = 1.0 / math.sqrt(shape.head_dim)
    outs = [(torch.empty_like(q), torch.empty(shape.batch, shape.heads, shape.seqlen_q,
                                              device="cuda")) for q, _, _ in sets]
    results = {}
    reference = sdpa(REFERENCE)
    results[REFERENCE] = time_cuda(lambda i: reference(*sets[i], scale), warmup=warmup,
                                   runs=runs, rotations=len(sets))
    for name, cfg in configs.items():
        launch_forward(*sets[0], *outs[0], scale, cfg)  # compile outside the timed region

        def run(i, cfg=cfg):
            launch_forward(*sets[i], *outs[i], scale, cfg)

        results[name] = time_cuda(run, warmup=warmup, runs=runs, rotations=len(sets))
    return results


def table_rows(results: dict[str, Timing], shape: Shape) -> list[dict[str, object]]:
    ref_ms = results[REFERENCE].median_ms
    return [{"name": name, **t.to_dict(), "tflops": tflops(shape.flops, t.median_ms),
             "ratio": ref_ms / t.median_ms} for name, t in results.items()]


def main(argv: list[str] | None = None) -> None:
    from attnlab.ladder import LADDER

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--sweep", action="store_true", help="also time tuning candidates")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    shape = Shape(args.tokens // args.seqlen, args.seqlen, args.seqlen, args.heads,
                  args.head_dim)
    configs = dict(LADDER)
    if args.sweep:
        configs.update(sweep_candidates())
    results = measure(configs, shape, getattr(torch, args.dtype), runs=args.runs)
    rows = table_rows(results, shape)
    device = torch.cuda.get_device_name()
    print(f"\n{device}  {args.dtype}  B={shape.batch} H={shape.heads} S={shape.seqlen_q} "
          f"D={shape.head_dim}")
    print(f"{'config':<16}{'median ms':>11}{'min':>9}{'max':>9}{'TFLOP/s':>10}{'ratio':>8}")
    for row in rows:
        print(f"{row['name']:<16}{row['median_ms']:>11.3f}{row['min_ms']:>9.3f}"
              f"{row['max_ms']:>9.3f}{row['tflops']:>10.1f}{row['ratio']:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "dtype": args.dtype,
                                         "shape": shape.__dict__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
