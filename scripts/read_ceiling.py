"""How fast one kernel can read N bytes from DRAM, by size: the ceiling a decoding call of
that cache size can reach, beside the roof (``attnlab roofline``'s 2 GiB read).

One ``torch.sum`` over a bf16 buffer per call, buffers rotated so none is in L2; device time
(CUDA events around each call) and end to end (back-to-back calls), medians.

    python scripts/read_ceiling.py --out OUT [--mib 16 32 64 128 256 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def rate(mib: int, runs: int = 50) -> dict:
    nbytes = mib << 20
    count = max(3, -(-(768 << 20) // nbytes))
    bufs = [torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16) for _ in range(count)]
    for b in bufs:
        b.sum(dtype=torch.float32)
    times = []
    for i in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        bufs[i % count].sum(dtype=torch.float32)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(runs):
        bufs[i % count].sum(dtype=torch.float32)
    torch.cuda.synchronize()
    e2e = (time.perf_counter() - t0) / runs
    device = statistics.median(times)
    return {"mib": mib, "device_us": device * 1e6, "device_gbs": nbytes / device / 1e9,
            "e2e_us": e2e * 1e6, "e2e_gbs": nbytes / e2e / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--mib", type=int, nargs="*", default=[16, 32, 64, 128, 256, 2048])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [rate(m) for m in args.mib]
    (args.out / "read-ceiling.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    for r in rows:
        print(f"read {r['mib']:5d} MiB: device {r['device_us']:8.1f} us {r['device_gbs']:6.0f} "
              f"GB/s, end to end {r['e2e_us']:8.1f} us {r['e2e_gbs']:6.0f} GB/s")


if __name__ == "__main__":
    main()
