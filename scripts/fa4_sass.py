"""FA4's Hopper forward built on a GPU-less machine, its SASS beside attnlab's default.

Cross-compiles ``flash_attn.cute``'s sm_90a forward (flash-attn-4) for
one head dim and mask through its own interface, on torch's fake tensors (CuTe DSL builds for
``CUTE_DSL_ARCH``; FA4 takes the SM count from ``FLASH_ATTENTION_NUM_SMS``), keeps its cubin,
and prints for it and for attnlab's default of the same problem: the instruction count, the
work the loop bodies do (``HGMMA``, ``MUFU``, ``FMUL``, ``FADD``, ``FMNMX``, ``F2FP``) and the
softmax's order in each overlapped body (``attnlab.analysis.overlap``). The forty-seventh
session's row-sum order came from this comparison (docs/ladder.md).

Needs flash-attn-4 importable (pip install flash-attn-4==4.0.0b36 quack-kernels==0.6.5 einops;
quack imports triton, which a machine without one needs too).

Usage: python scripts/fa4_sass.py --head-dim 64 [--causal] [--dtype bfloat16] [--seqlen 16384]
[--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

OPS = ("HGMMA", "MUFU", "FMUL", "FADD", "FFMA", "FMNMX", "F2FP")


def build_fa4(head_dim: int, causal: bool, dtype: str, seqlen: int, out: Path) -> Path:
    """The cubin of FA4's forward for (batch 1, ``seqlen``, 32 heads, ``head_dim``)."""
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(out),
                      FLASH_ATTENTION_NUM_SMS=os.environ.get("FLASH_ATTENTION_NUM_SMS", "132"))
    import torch
    from flash_attn.cute import interface
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty(1, seqlen, 32, head_dim, dtype=getattr(torch, dtype),
                               device="cuda") for _ in range(3))
        interface._flash_attn_fwd(q, k, v, causal=causal, _arch=90)
    cubins = sorted(out.rglob("*.cubin"), key=lambda p: p.stat().st_mtime)
    if not cubins:
        raise SystemExit(f"FA4's build wrote no cubin under {out}")
    return cubins[-1]


def summary(label: str, sass_text: str) -> str:
    from attnlab.analysis.overlap import softmax_order
    from attnlab.analysis.sass import histogram, parse

    ops = histogram(parse(sass_text))
    order = softmax_order(sass_text)
    counts = "  ".join(f"{op} {ops.get(op, 0)}" for op in OPS)
    return (f"{label}: {sum(ops.values())} instructions; {counts}\n"
            f"  exponentials before each P V wait {order.exps_before_pv_wait}, "
            f"O multiplies after each stretch's last exponential {order.fmuls_after_last_exp}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="fa4-sass-"))
    out.mkdir(parents=True, exist_ok=True)
    fa4_cubin = build_fa4(args.head_dim, args.causal, args.dtype, args.seqlen, out)

    from attnlab import policy
    from attnlab.analysis.sass import disassemble
    from attnlab.compile import compile_config

    config = policy.default_for("sm_90a", args.head_dim, args.causal, dtype=args.dtype,
                                seqlen=args.seqlen)
    ours = compile_config(config, "sm_90a", dtype=args.dtype, head_dim=args.head_dim,
                          windowed=args.causal, out_dir=out / "attnlab")
    for name, label, cubin in (("fa4", "FA4", fa4_cubin),
                               ("attnlab", f"attnlab {config.short_name()}", ours.cubin)):
        text = disassemble(cubin)
        (out / f"{name}.sass").write_text(text)
        print(summary(label, text))
    print(f"SASS in {out}")


if __name__ == "__main__":
    main()
