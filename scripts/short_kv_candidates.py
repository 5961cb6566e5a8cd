"""Time forward tiles for short key sequences (cross-attention) on the GPU, device only.

Usage (GPU): python scripts/short_kv_candidates.py [--out DIR]
Seed 004's cross-attention shapes (B=8, H=8, Sq x Sk = 256 x 77, 1024 x 256, 4096 x 77) at
hd64 and hd128: the default tile against narrower K/V blocks (B_c 80 or 96 covers 77 keys in
one block, against 128 with 40 % padding) and shorter query tiles, beside cuDNN; median
device time of round-robin runs. Results go to OUT/short_kv_candidates.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import attnlab
from attnlab import device
from attnlab.bench.baselines import sdpa
from attnlab.bench.runner import CROSS_SHAPES
from attnlab.bench.timing import attention_flops, sample_interleaved, summarize
from attnlab.policy import default_for

#: Knob changes on the default tile.
VARIANTS = {"default": {}, "bn80": {"block_n": 80, "fence_p": True},
            "bn96": {"block_n": 96, "fence_p": True},
            "bn80 bm128": {"block_n": 80, "fence_p": True, "block_m": 128, "num_warps": 8},
            "bn64": {"block_n": 64}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    arch = device.info(torch.device("cuda")).arch
    gen = torch.Generator(device="cuda").manual_seed(0)
    cudnn = sdpa("sdpa_cudnn")
    rows = []
    for head_dim in (64, 128):
        base = default_for(arch, head_dim)
        for sq, sk in CROSS_SHAPES:
            q = torch.randn(8, sq, 8, head_dim, device="cuda", dtype=torch.bfloat16,
                            generator=gen)
            k, v = (torch.randn(8, sk, 8, head_dim, device="cuda", dtype=torch.bfloat16,
                                generator=gen) for _ in range(2))
            fns = {}
            for name, knobs in VARIANTS.items():
                try:
                    config = base.replace(**knobs)
                    attnlab.attention(q, k, v, config=config)
                except Exception as exc:  # a tile that cannot serve the head dim: a row
                    print(f"hd{head_dim} {name}: {type(exc).__name__}: {exc}")
                    continue
                fns[name] = _call(q, k, v, config)
            fns["sdpa_cudnn"] = _peer(cudnn, q, k, v, head_dim ** -0.5)
            samples = sample_interleaved(fns, runs=args.runs)
            flops = attention_flops(8, 8, sq, sk, head_dim)
            line = [f"hd{head_dim} {sq}x{sk}:"]
            for name, ms in samples.items():
                median = summarize(ms).median_ms
                rows.append({"head_dim": head_dim, "shape": [sq, sk], "variant": name,
                             "device_ms": median, "tflops": flops / median / 1e9})
                line.append(f"{name} {flops / median / 1e9:.0f}")
            print("  ".join(line), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "short_kv_candidates.json").write_text(json.dumps(rows, indent=1))


def _call(q, k, v, config):
    return lambda i: attnlab.attention(q, k, v, config=config)


def _peer(fn, q, k, v, scale):
    return lambda i: fn(q, k, v, scale)


if __name__ == "__main__":
    main()
