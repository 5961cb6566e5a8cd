"""Seed 004's split experiment (Phase 6 Step 2, "split-Q": K/V ranges split over CTAs whose
partial ``{m, l, O}`` a second kernel merges) on this GPU, through the decoding kernel.

Usage (GPU): python scripts/split_study.py [--out DIR]
The seed ran it on prefill (B=4, H=16, seq 1024, hd64 on an RTX 3070: splits=4 1.05x,
splits=16 0.88x of its kernel, the partial buffers' traffic eating the gain). Here the same
shape and a decode shape (B=1, 32/8 heads, cache 32k) run ``attention_with_kvcache`` with
``num_splits`` 1, 4, 16 and 64, beside the prefill kernel (``attention``) on the prefill
shape; device time, median of round-robin runs; OUT/split_study.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import attnlab
from attnlab.bench.timing import attention_flops, sample_interleaved, summarize

SHAPES = {"prefill B=4 H=16 seq 1024 hd64": (4, 1024, 1024, 16, 16, 64),
          "decode B=1 32/8 cache 32k hd128": (1, 1, 32768, 32, 8, 128)}
SPLITS = (1, 4, 16, 64)


def _split_kv(q, k, v, seqlens, splits):
    return lambda i: attnlab.attention_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                                    num_splits=splits)


def _prefill(q, k, v):
    return lambda i: attnlab.attention(q, k, v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for label, (b, sq, sk, hq, hkv, d) in SHAPES.items():
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        seqlens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        fns = {f"split-KV, {n} split{'s' if n > 1 else ''}": _split_kv(q, k, v, seqlens, n)
               for n in SPLITS}
        if sq == sk:
            fns["prefill kernel (attention)"] = _prefill(q, k, v)
        for fn in fns.values():
            fn(0)
        samples = sample_interleaved(fns, runs=args.runs)
        flops = attention_flops(b, hq, sq, sk, d, False)
        kv_bytes = 2 * b * sk * hkv * d * 2
        line = [label + ":"]
        for name, ms in samples.items():
            median = summarize(ms).median_ms
            rows.append({"shape": label, "variant": name, "device_ms": median,
                         "tflops": flops / median / 1e9, "kv_gbs": kv_bytes / median / 1e6})
            line.append(f"{name} {median:.3f} ms")
        print("  ".join(line), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split_study.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
