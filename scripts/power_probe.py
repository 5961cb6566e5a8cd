"""Clocks and power while attention runs: why end-to-end TFLOP/s sit 5-10 % under device only.

Usage (GPU): python scripts/power_probe.py [--out DIR] [--seconds S] [--rounds R]
       [--candidates HD,MASK,SEQLEN,NAMES]
The Hopper table's end-to-end figures are 2-9 % under its device-only ones for attnlab and
8-25 % for FA4 at every length, also where a call's host side is a small fraction of its
kernel (hd128 16k: 3 ms a call), so host time does not explain the gap. One reading: the
device-only calls run right after a spinning hold (``timing.sample_interleaved``) on a cool,
boosted GPU, the back-to-back spans on one held at its power limit. This script runs each
implementation alone for ``S`` seconds back to back (a CUDA event pair per call) after a
cool-down, while ``nvidia-smi`` samples the SM clock, the power draw and the clock-event
reasons every 20 ms; per implementation it reports the TFLOP/s of the first 20 calls and of
the second half, the clock and the power over the second half and the energy per call. The
same for the bf16 8192^3 matrix product (cuBLAS and ``attnlab.gemm.matmul``), whose rate the
issue takes as the roof. ``--candidates``: FA4 and the default against
``scripts/sm90_candidates.py`` variants at one point instead. Writes OUT/power_probe.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from attnlab.bench.baselines import available_peers
from attnlab.bench.runner import Point, attnlab_impl, input_sets
from attnlab.bench.timing import attention_flops

POINTS = [Point(1, 16384, 16384, 16, 128, "bfloat16", False),
          Point(1, 16384, 16384, 32, 64, "bfloat16", False),
          Point(2, 8192, 8192, 16, 128, "bfloat16", True)]
PEERS = ("fa4", "sdpa_cudnn")
MATMUL_SIZE = 8192
FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")
#: The clock-event reasons' field, by its current name and the one older drivers know.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


class Sampler:
    """``nvidia-smi`` in a loop: (host monotonic time, clock MHz, watts, degrees, reasons)."""

    def __init__(self, period_ms: int = 20):
        self.rows: list[tuple[float, ...]] = []
        fields = FIELDS + next((f,) for f in (*REASON_FIELDS, "") if not f or subprocess.run(
            ["nvidia-smi", f"--query-gpu={f}", "--format=csv"], capture_output=True
        ).returncode == 0)
        self.proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={','.join(f for f in fields if f)}",
             "--format=csv,noheader,nounits", f"-lms={period_ms}"], stdout=subprocess.PIPE,
            text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            parts = [p.strip() for p in line.split(",")]
            try:
                clock, watts, temp = (float(p) for p in parts[:3])
            except ValueError:
                continue
            reasons = int(parts[3], 16) if len(parts) > 3 else 0
            self.rows.append((time.monotonic(), clock, watts, temp, reasons))

    def window(self, start: float, stop: float) -> dict[str, float]:
        rows = [r for r in self.rows if start <= r[0] <= stop]
        if not rows:
            return {}
        reasons = 0
        for r in rows:
            reasons |= r[4]
        return {"samples": len(rows), "sm_mhz": statistics.mean(r[1] for r in rows),
                "watts": statistics.mean(r[2] for r in rows),
                "celsius": statistics.mean(r[3] for r in rows), "reasons": hex(reasons)}

    def stop(self) -> None:
        self.proc.terminate()


def sustained(call, seconds: float, call_ms: float) -> tuple[list[float], float, float]:
    """Per-call device ms of ``seconds`` of back-to-back ``call(i)``, and the host window of
    the run's second half (monotonic)."""
    calls = max(40, math.ceil(seconds * 1e3 / call_ms))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    start = time.monotonic()
    events[0].record()
    for i in range(calls):
        call(i)
        events[i + 1].record()
    torch.cuda.synchronize()
    stop = time.monotonic()
    return ([a.elapsed_time(b) for a, b in itertools.pairwise(events)],
            start + (stop - start) / 2, stop)


def measure(label: str, name: str, call, flops: float, seconds: float, sampler: Sampler
            ) -> dict:
    """One implementation alone: a cool-down on a spinning kernel (low power, as the table's
    hold), then ``seconds`` of back-to-back calls."""
    torch.cuda._sleep(int(0.5 * 2e9))
    torch.cuda.synchronize()
    first = sustained(call, 0.05, 1.0)[0]
    ms, half, stop = sustained(call, seconds, statistics.median(first))
    steady = statistics.median(ms[len(ms) // 2:])
    row = {"point": label, "impl": name,
           "tflops_first20": flops / statistics.median(ms[:20]) / 1e9,
           "tflops_steady": flops / steady / 1e9, "calls": len(ms),
           **sampler.window(half, stop)}
    if "watts" in row:
        row["joules_per_call"] = row["watts"] * steady * 1e-3
    print(f"{label:52s} {name:14s} first {row['tflops_first20']:6.1f} "
          f"steady {row['tflops_steady']:6.1f} TFLOP/s  {row.get('sm_mhz', 0):6.0f} MHz "
          f"{row.get('watts', 0):5.0f} W {row.get('celsius', 0):4.0f} C reasons "
          f"{row.get('reasons')}  {row.get('joules_per_call', 0):.3f} J/call", flush=True)
    return row


def attention_cases(point: Point, impls: dict) -> tuple[str, float, dict]:
    """``(label, FLOPs, name -> call(i))`` of attention at ``point`` over rotated inputs."""
    sets = input_sets(point)
    scale = point.head_dim ** -0.5
    calls = {name: (lambda i, fn=fn: fn(*sets[i % len(sets)], scale, point.causal))
             for name, fn in impls.items()}
    return point.label(), attention_flops(point.batch, point.heads, point.seqlen_q,
                                          point.seqlen_k, point.head_dim, point.causal), calls


def matmul_cases(size: int = MATMUL_SIZE) -> tuple[str, float, dict]:
    """The matrix-product roof the issue quotes (bf16 ``size``^3): cuBLAS and attnlab's."""
    from attnlab.gemm import matmul

    sets = [tuple(torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2)) for _ in range(2)]
    return f"bf16 matmul {size}^3", 2.0 * size ** 3, {
        "cublas": lambda i: torch.matmul(*sets[i % 2]),
        "attnlab": lambda i: matmul(*sets[i % 2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over the implementations, alternate ones reversed")
    parser.add_argument("--candidates", default=None, metavar="HD,MASK,SEQLEN,NAMES[,DTYPE]",
                        help="instead of the peers but FA4: the default and these "
                             "scripts/sm90_candidates.py variants ('+'-separated) at one "
                             "point of the Hopper table's shapes (bfloat16 unless DTYPE), "
                             "e.g. 128,plain,16384,kv3+bc144")
    args = parser.parse_args()
    peers = available_peers()
    if args.candidates:
        from sm90_candidates import candidates  # this script's folder is on sys.path

        hd, mask, seqlen, names, *dtype = args.candidates.split(",")
        hd, seqlen, causal = int(hd), int(seqlen), mask == "causal"
        point = Point(16384 // seqlen, seqlen, seqlen, 2048 // hd, hd,
                      dtype[0] if dtype else "bfloat16", causal)
        cases = [attention_cases(point, {
            **{n: peers[n] for n in PEERS[:1] if n in peers},
            **{name: attnlab_impl(cfg) for name, cfg in candidates(
                hd, causal, seqlen, point.dtype, set(names.split("+"))).items()}})]
    else:
        impls = {"attnlab": attnlab_impl(), **{n: peers[n] for n in PEERS if n in peers}}
        cases = [matmul_cases(), *(attention_cases(point, impls) for point in POINTS)]
    sampler = Sampler()
    rows = []
    try:
        for label, flops, calls in cases:
            for call in calls.values():
                call(0)  # compiles: not timed
            names = list(calls)
            for r in range(args.rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    rows.append({**measure(label, name, calls[name], flops, args.seconds,
                                           sampler), "round": r})
    finally:
        sampler.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "power_probe.json").write_text(json.dumps(rows, separators=(",", ":")))


if __name__ == "__main__":
    main()
