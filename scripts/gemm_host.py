"""Where a GEMM call's host time goes (issue 22's host-bound points: the skinny set, where
split-K's device gain is spent on the host, and INT8 at 2048^3, 0.43x ``torch._int_mm`` end to
end against 0.83x device only).

Usage (GPU): python scripts/gemm_host.py [--out DIR]
Host microseconds per call (``bench.timing.host_us_per_call``: calls enqueued without
waiting, on one small problem) and, for whole calls, device microseconds (behind a device-side
hold: where they come near the host's, the host number is the device's) of ``matmul`` unsplit and
with each split mode, of ``int8_matmul`` with and without zero points, of ``torch.matmul`` and
``torch._int_mm`` beside them, and of the parts of a call in isolation (the signature lookup,
C's allocation, the scale checks, the kernel launch on preallocated buffers); then
the cProfile of 2,000 int8 calls (top 12 by own time). Prints a table, writes
OUT/gemm_host.json and OUT/gemm_host_profile.txt.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
from pathlib import Path

import torch

from attnlab.bench.timing import CudaEventClock, host_us_per_call
from attnlab.counters import tile_counters
from attnlab.gemm import GemmConfig, int8_matmul, matmul
from attnlab.gemm import api as gemm_api
from attnlab.gemm import int8 as int8_api

#: Small enough that the device keeps up with the host: the timings are the host's.
SHAPE = (256, 256, 1024)


def gemm_parts(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The bf16 GEMM: whole calls per split mode, the peer, and the unsplit call's parts."""
    pieces = {"matmul (none)": lambda i: matmul(a, b),
              "torch.matmul": lambda i: torch.matmul(a, b)}
    for mode in ("serial", "workspace", "atomic"):
        config = GemmConfig(block_m=64, block_n=64, split_k=4, split_mode=mode)
        pieces[f"matmul ({mode}, 4 slices)"] = lambda i, c=config: matmul(a, b, config=c)
    matmul(a, b)
    key = next(k for k, v in gemm_api._calls.items() if v.plan.splits == 1)
    call = gemm_api._calls[key]
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    pieces.update({
        "  lookup": lambda i: gemm_api._calls.get((a.shape, a.stride(), a.dtype, a.device,
                                                   b.shape, b.stride(), b.dtype, b.device,
                                                   a.dtype, None)),
        "  allocation": lambda i: torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype,
                                              device=a.device),
        "  counters": lambda i: tile_counters(a.device, 1024),
        "  launch": lambda i: call.gemm(a, b, c, None, None, *gemm_api.NO_EPILOGUE, 1,
                                        call.plan.num_ctas),
    })
    return pieces


def device_us_per_call(fn, calls: int = 200) -> float:
    """Device microseconds per call: ``calls`` calls enqueued behind a device-side hold (so
    the host never starves the stream), timed by CUDA events."""
    clock = CudaEventClock()
    fn(0)
    clock.wait()
    clock.hold(calls * 0.1)
    start = clock.mark()
    for i in range(calls):
        fn(i)
    stop = clock.mark()
    clock.wait()
    return clock.elapsed_ms(start, stop) / calls * 1e3


def int8_parts(a_q, b_q, scale_a, scale_b, zero_b) -> dict:
    """INT8: whole calls (asymmetric, symmetric), the peer, and the asymmetric call's parts."""
    int8_matmul(a_q, b_q, scale_a, scale_b, zero_b=zero_b)
    call = next(v for v in int8_api._calls.values() if v.zero_points)
    c = torch.empty((a_q.shape[0], b_q.shape[1]), dtype=torch.bfloat16, device=a_q.device)
    pieces = {
        "int8_matmul (zero points)": lambda i: int8_matmul(a_q, b_q, scale_a, scale_b,
                                                           zero_b=zero_b),
        "int8_matmul (symmetric)": lambda i: int8_matmul(a_q, b_q, scale_a, scale_b),
        "torch._int_mm": lambda i: torch._int_mm(a_q, b_q),
        "  scale checks": lambda i: [int8_api._check_vector(n, v, len(v), a_q.device) for n, v in
                                     (("scale_a", scale_a), ("scale_b", scale_b),
                                      ("zero_b", zero_b))],
        "  int8 launch": lambda i: call.gemm(a_q, b_q, c, None, None, scale_a, scale_b, zero_b,
                                             None, None, 1, call.plan.num_ctas),
    }
    return pieces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    m, n, k = SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    a_q = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8, generator=gen)
    b_q = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8, generator=gen).t()
    scale_a, scale_b = (torch.rand(s, device="cuda", generator=gen) + 0.5 for s in (m, n))
    zero_b = torch.randn(n, device="cuda", generator=gen)
    with torch.no_grad():
        pieces = {**gemm_parts(a, b), **int8_parts(a_q, b_q, scale_a, scale_b, zero_b)}
        rows = {}
        for name, fn in pieces.items():
            # Parts (indented) are host-side pieces; whole calls also get their device time.
            rows[name] = {"host_us": host_us_per_call(fn)}
            if not name.startswith(" "):
                rows[name]["device_us"] = device_us_per_call(fn)
            print(f"{name:32s} " + "  ".join(f"{k} {v:7.1f}" for k, v in rows[name].items()),
                  flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(2000):
            int8_matmul(a_q, b_q, scale_a, scale_b, zero_b=zero_b)
        profiler.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    (args.out / "gemm_host.json").write_text(json.dumps({"shape": SHAPE, "calls": rows},
                                                        indent=1))
    (args.out / "gemm_host_profile.txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
