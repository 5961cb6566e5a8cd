"""Where the backward's time goes, attnlab against FA4 (or its mma.sync kernel against FA2),
at issue 20's anchor points.

Two parts, each per (impl, point): the backward alone through autograd under the torch
profiler (every CUDA kernel it launches, device time each: the preprocess, the main kernel,
dQ's conversion and whatever torch adds), and one ncu profile of that backward
(``--profile-from-start off``: exactly the kernels of one autograd backward, after warm-up)
with the sections that say where the main kernel waits (speed of light, instruction stats,
warp states, per-instruction stall samples). Full results to ``--out``; a short table last.

    python scripts/bwd_profile.py --out OUT --points 64,2048,0 64,2048,1 [--no-ncu]
    python scripts/bwd_profile.py --target attnlab --point 64,2048,1   # what ncu runs
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

TOKENS, HIDDEN = 16384, 2048
#: ncu's raw-page metrics printed in the table (substring of the metric name -> short name).
SHOWN = {"gpu__time_duration.sum": "time", "launch__registers_per_thread": "regs",
         "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "gmma %",
         "smsp__inst_executed.sum": "inst",
         "smsp__sass_inst_executed_op_local_ld.sum": "local ld",
         "smsp__sass_inst_executed_op_local_st.sum": "local st",
         "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "smem wavefronts"}
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "InstructionStats", "LaunchStats",
            "Occupancy", "WarpStateStats", "SourceCounters", "MemoryWorkloadAnalysis")


def inputs(hd: int, seqlen: int) -> tuple[torch.Tensor, ...]:
    batch, heads = TOKENS // seqlen, HIDDEN // hd
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch.bfloat16,
                           generator=gen).requires_grad_() for _ in range(3))
    return q, k, v, torch.randn(batch, seqlen, heads, hd, device="cuda", dtype=torch.bfloat16,
                                generator=gen)


#: The peers by this script's names (``attnlab.bench.baselines``' factories).
PEERS = {"fa2": "sdpa_flash", "fa4": "fa4"}


def forward(impl: str, q, k, v, causal: bool) -> torch.Tensor:
    scale = 1 / math.sqrt(q.shape[-1])
    if impl == "attnlab":
        import attnlab
        return attnlab.attention(q, k, v, softmax_scale=scale, causal=causal)
    from attnlab.bench.baselines import available_peers
    return available_peers()[PEERS[impl]](q, k, v, scale, causal)


def sm80_backward(q, k, v, do, causal: bool):
    """attnlab's ``mma.sync`` backward as the sm80 path runs it on this GPU
    (``mma_sync_backward_for``), called directly (autograd picks the sm_90a kernel here)."""
    import attnlab
    from attnlab import backward
    from attnlab.backward_config import mma_sync_backward_for

    scale = 1 / math.sqrt(q.shape[-1])
    out, lse = attnlab.attention(q, k, v, softmax_scale=scale, causal=causal,
                                 return_lse=True)
    config = mma_sync_backward_for("sm_90a", q.shape[-1], causal, "bfloat16")
    return lambda: backward.attention_backward(
        do, q, k, v, out, lse, None, None, None, None, None, scale,
        (-1, 0) if causal else (-1, -1), config=config)


def one_backward(impl: str, hd: int, seqlen: int, causal: bool, region) -> None:
    """Warm up, then one backward inside ``region`` (a context manager)."""
    q, k, v, do = inputs(hd, seqlen)
    if impl == "sm80":
        run = sm80_backward(q.detach(), k.detach(), v.detach(), do, causal)
    else:
        def run():
            forward(impl, q, k, v, causal).backward(do)
    for _ in range(3):
        run()
    if impl != "sm80":
        out = forward(impl, q, k, v, causal)
        run = lambda: out.backward(do)  # noqa: E731
    torch.cuda.synchronize()
    with region():
        run()
        torch.cuda.synchronize()


def kernel_breakdown(impl: str, hd: int, seqlen: int, causal: bool) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CUDA])
    one_backward(impl, hd, seqlen, causal, lambda: prof)
    rows = [{"kernel": e.key[:120], "us": e.device_time_total, "count": e.count}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["us"])


def ncu_profile(impl: str, point: str, out: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        rep = Path(folder) / "bwd"
        cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off",
               *[a for s in SECTIONS for a in ("--section", s)], "-o", str(rep),
               sys.executable, __file__, "--target", impl, "--point", point]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
        if done.returncode:
            return {"error": (done.stderr or done.stdout)[-2000:]}
        raw = subprocess.run(["ncu", "-i", f"{rep}.ncu-rep", "--page", "raw", "--csv"],
                             capture_output=True, text=True).stdout
        from attnlab.analysis.ncu import parse_raw_csv, parse_source_csv
        rows = parse_raw_csv(raw)
        main = max(rows, key=lambda r: float(r.get("gpu__time_duration.sum", "0")
                                            .replace(",", "") or 0))
        name = main["Kernel Name"]
        # ncu filters on the function's base name (no return type, scope or template
        # arguments: FA2's kernel is a template).
        base = re.split(r"[<(]", name)[0].split()[-1].split("::")[-1]
        source = subprocess.run(["ncu", "-i", f"{rep}.ncu-rep", "-k",
                                 "regex:" + re.escape(base[:60]), "--page", "source", "--csv",
                                 "--print-source", "sass"], capture_output=True, text=True)
        (out / f"ncu-{impl}-{point.replace(',', '-')}-source.csv").write_text(source.stdout)
        try:
            stalls = parse_source_csv(source.stdout, impl, top=24).to_dict()
        except StopIteration:
            stalls = {"error": source.stderr[-1000:]}
    # Durations in the raw page's unit for the column (the same for every row).
    kernels = [{"kernel": r["Kernel Name"][:120], "duration": r.get("gpu__time_duration.sum")}
               for r in rows]
    return {"kernels": kernels, "main": {k: main.get(k) for k in main},
            "stalls": stalls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--points", nargs="*", default=["64,2048,0", "64,2048,1"],
                        help="HD,SEQLEN,CAUSAL(0|1)")
    parser.add_argument("--impls", default="attnlab,fa4",
                        help="attnlab, fa4, fa2 (SDPA flash), sm80 (attnlab's mma.sync kernel)")
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--target", help="run one backward for ncu (an --impls name)")
    parser.add_argument("--point")
    args = parser.parse_args()
    if args.target:
        hd, seqlen, causal = (int(x) for x in args.point.split(","))
        one_backward(args.target, hd, seqlen, bool(causal), _cuda_profiler_region)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results, lines = [], []
    for point in args.points:
        hd, seqlen, causal = (int(x) for x in point.split(","))
        for impl in args.impls.split(","):
            entry = {"impl": impl, "point": point,
                     "breakdown": kernel_breakdown(impl, hd, seqlen, bool(causal))}
            if not args.no_ncu:
                entry["ncu"] = ncu_profile(impl, point, args.out)
            results.append(entry)
            (args.out / "bwd-profile.json").write_text(json.dumps(results, indent=1))
            total = sum(r["us"] for r in entry["breakdown"])
            parts = ", ".join(f"{r['kernel'][:40]} {r['us']:.0f}" for r in entry["breakdown"])
            lines.append(f"{point:>10} {impl:8} {total:8.0f} us: {parts}")
            main_ncu = entry.get("ncu", {}).get("main") or {}
            shown = "  ".join(f"{short} {main_ncu[name]}" for name, short in SHOWN.items()
                              if name in main_ncu)
            if shown:
                lines.append(f"{'':>10} {impl:8} ncu main: {shown}")
            stalls = entry.get("ncu", {}).get("stalls") or {}
            if "by_reason" in stalls:
                total_s = stalls["total"] or 1
                lines.append(f"{'':>10} {impl:8} stalls: " + ", ".join(
                    f"{n.removeprefix('stall_')} {100 * c / total_s:.0f}%"
                    for n, c in stalls["by_reason"][:7]))
            print(lines[-1], flush=True)
    print("\n".join(lines))


class _cuda_profiler_region:
    def __enter__(self):
        torch.cuda.profiler.start()

    def __exit__(self, *exc):
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
