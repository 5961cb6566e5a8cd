"""Time backward-kernel candidates against the peers' backward, in one run (what
``backward_config.default_backward`` is chosen from).

Usage (GPU): python scripts/bwd_candidates.py [--head-dims 64,128] [--seqlens 2048,8192]
[--masks plain,causal] [--work backward|forward+backward] [--dtype bfloat16|float16]
[--out DIR]
Per point (bf16 unless ``--dtype``, 16k tokens, hidden 2048), the backward alone: the peers
(SDPA flash, cuDNN, FA4) through autograd from a kept graph, attnlab's candidates
(``VARIANTS``: knob changes on the default) through ``backward.attention_backward`` on the
forward's saved output, its pre- and postprocess included. TFLOP/s (2.5x the forward's
FLOPs) end to end and device only; the numbers go to OUT/bwd_candidates.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attnlab import backward, kernel_cache
from attnlab.backward_config import (
    BackwardConfig,
    default_backward,
    mma_sync_backward_for,
)
from attnlab.bench.baselines import available_peers
from attnlab.bench.report import one_line
from attnlab.bench.runner import Point, measure_point, training_impl
from attnlab.kernels.abi import BackwardSpec

#: Candidates: knob changes on the default (``{}`` is the default itself; ``default_of``:
#: start from another arch's default; ``sm_80``: the mma.sync kernel as Hopper runs it,
#: ``mma_sync_backward_for``).
VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "stages1": {"q_stages": 1},
    "bm128": {"block_m": 128},
    "bm64": {"block_m": 64},
    "mma_sync": {"wgmma": False, "producer_warp": False},
    "cp_async": {"producer_warp": False},
    "lpt": {"lpt": True},
    "O1": {"ptxas_opt_level": 1},
    "O3": {"ptxas_opt_level": 3},
    "sm80": {"default_of": "sm_80"},
    "sm80_O3": {"default_of": "sm_80", "ptxas_opt_level": 3},
    "sm80_dk_last": {"default_of": "sm_80", "dq_first": False},
    "sm80_dq_first": {"default_of": "sm_80", "dq_first": True},
    "sm80_O2": {"default_of": "sm_80", "ptxas_opt_level": 2},
    "sm80_dq_first_O2": {"default_of": "sm_80", "dq_first": True, "ptxas_opt_level": 2},
    "sm80_dq_first_O3": {"default_of": "sm_80", "dq_first": True, "ptxas_opt_level": 3},
    "sm80_lpt": {"default_of": "sm_80", "lpt": True},
    "sm80_lpt_O3": {"default_of": "sm_80", "lpt": True, "ptxas_opt_level": 3},
    "sm80_1d": {"default_of": "sm_80", "block_m": 64, "kv_warps_n": 1, "dq_warps_m": 0},
    "sm80_kv_n2": {"default_of": "sm_80", "kv_warps_n": 2},
    "sm80_kv_n2_dq2": {"default_of": "sm_80", "kv_warps_n": 2, "dq_warps_m": 2},
    "sm80_dq2": {"default_of": "sm_80", "dq_warps_m": 2},
    "sm80_bm128_kv_n2": {"default_of": "sm_80", "block_m": 128, "kv_warps_n": 2},
    "sm80_bm128_kv_n2_dq4": {"default_of": "sm_80", "block_m": 128, "kv_warps_n": 2,
                             "dq_warps_m": 4},
}


def candidate_impl(config: BackwardConfig, arch: str, work: str):
    """The backward alone, on the saved forward of each input set; or (``work`` =
    ``"forward+backward"``) a forward and the backward, every call. The forward is the
    default, or for a variant of the sm_80 backward the ``mma.sync`` forward measured best
    on Hopper (``mma_sync_default_for``): the sm80 path on this GPU."""
    import attnlab
    from attnlab.policy import mma_sync_default_for

    saved: dict[tuple, tuple] = {}

    def forward(q, k, v, scale, causal):
        forward_config = (None if arch == "sm_90a" else mma_sync_default_for(
            "sm_90a", q.shape[-1], causal, str(q.dtype).removeprefix("torch.")))
        return attnlab.attention(q, k, v, softmax_scale=scale, causal=causal,
                                 return_lse=True, config=forward_config)

    def run(q, k, v, scale, causal=False):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), causal)
        if work == "forward+backward":
            out, lse = forward(q, k, v, scale, causal)
            if key not in saved:
                saved[key] = (torch.randn_like(out),)
            dout = saved[key][0]
        else:
            if key not in saved:
                out, lse = forward(q, k, v, scale, causal)
                saved[key] = (torch.randn_like(out), out, lse)
            dout, out, lse = saved[key]
        return backward.attention_backward(dout, q, k, v, out, lse, None, None, None, None,
                                           None, scale, (-1, 0) if causal else (-1, -1),
                                           config=config)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="2048,8192")
    parser.add_argument("--masks", default="plain,causal")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--work", choices=["backward", "forward+backward"], default="backward",
                        help="forward+backward: each variant with its arch's default forward")
    args = parser.parse_args()
    names = args.variants.split(",")
    points = [Point(16384 // s, s, s, 2048 // hd, hd, args.dtype, mask == "causal",
                    work=args.work)
              for hd in map(int, args.head_dims.split(","))
              for s in map(int, args.seqlens.split(","))
              for mask in args.masks.split(",")]

    def configs(head_dim: int, causal: bool) -> dict[str, tuple[BackwardConfig, str]]:
        """Per variant name, its backward config and the arch whose default (for a masked
        kernel when ``causal``) it starts from."""
        found = {}
        for name in names:
            try:
                knobs = dict(VARIANTS[name])
                arch = str(knobs.pop("default_of", "sm_90a"))
                base = (mma_sync_backward_for("sm_90a", head_dim, causal, args.dtype)
                        if arch == "sm_80" else default_backward(head_dim, arch,
                                                                  windowed=causal))
                config = base.replace(**knobs)
                config.check_problem(head_dim, "sm_90a")
                found[name] = (config, arch)
            except ValueError as exc:
                print(f"hd{head_dim} {name}: {exc}")
        return found

    kernel_cache.warm([BackwardSpec(cfg, "sm_90a", args.dtype, p.head_dim, p.causal)
                       for p in points for cfg, _ in configs(p.head_dim, p.causal).values()],
                      jobs=16)
    peers = {name: training_impl(fn, args.work) for name, fn in available_peers().items()
             if name in ("sdpa_flash", "sdpa_cudnn", "fa4")}
    rows = []
    for point in points:
        impls = {**peers, **{name: candidate_impl(cfg, arch, args.work)
                             for name, (cfg, arch) in configs(point.head_dim,
                                                              point.causal).items()}}
        results = measure_point(point, impls, runs=args.runs)
        row = {"point": point.label(), "results": {
            r.impl: [r.tflops, r.device_tflops, r.error] for r in results}}
        rows.append(row)
        print(one_line(point.label(), results), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bwd_candidates.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
