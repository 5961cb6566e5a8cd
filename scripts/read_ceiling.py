"""How fast one kernel can read N bytes from DRAM, by size: the ceiling a decoding call of
that cache size can reach, beside the roof (``attnlab roofline``'s 2 GiB read).

One ``torch.sum`` over a bf16 buffer per call, buffers rotated so none is in L2; device time
(the bench's device-only clock: no launch counted) and end to end (back-to-back calls),
medians. With
``--probe``, also attnlab's streaming reader (``kernels/common/stream_read.py``) on the same
buffers: its CTAs' ranges handed out statically (one equal contiguous range a CTA, as a split
decoding's) or taken a chunk at a time from a counter (``--chunk-kib``), one CTA an SM or
``--grid`` CTAs; beside each rate, from the CTAs' own clocks (medians over the timed calls):
the spread of their starts and of their ends, and the span from the first start to the last
end.

    python scripts/read_ceiling.py --out OUT [--mib 16 32 64 128 256 2048]
        [--probe --grid 128 132 --chunk-kib 64 256]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch

from attnlab.bench.timing import calls_per_span, sample_back_to_back, sample_interleaved

#: Untimed calls before the device-only ones.
WARMUP = 5
#: Stamp buffers in rotation: more than the warm-up and device-only calls together.
STAMP_RING = 64


def buffers(mib: int) -> list[torch.Tensor]:
    """bf16 buffers of ``mib`` MiB, enough of them that a rotation's 768 MiB pass L2."""
    nbytes = mib << 20
    count = max(3, -(-(768 << 20) // nbytes))
    return [torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16) for _ in range(count)]


def timed(read, rotations: int, runs: int, between=None) -> dict:
    """Device time of ``read(i)`` (the bench's device-only clock: calls queued behind a
    device-side hold, so no launch latency is counted) and end to end (back-to-back calls),
    medians, ``i`` the input set; ``between()`` runs after the device-only calls."""
    device_ms = statistics.median(sample_interleaved({"read": read}, warmup=WARMUP, runs=runs,
                                                     rotations=rotations)["read"])
    if between is not None:
        between()
    e2e_ms = statistics.median(sample_back_to_back(
        {"read": read}, calls={"read": calls_per_span(device_ms)}, rounds=10,
        rotations=rotations)["read"])
    return {"device_us": device_ms * 1e3, "e2e_us": e2e_ms * 1e3}


def with_rates(row: dict, nbytes: int) -> dict:
    return {**row, "device_gbs": nbytes / row["device_us"] / 1e3,
            "e2e_gbs": nbytes / row["e2e_us"] / 1e3}


def rate(mib: int, runs: int = 40) -> dict:
    """``torch.sum``'s rates over buffers of ``mib`` MiB."""
    bufs = buffers(mib)
    row = timed(lambda i: bufs[i].sum(dtype=torch.float32), len(bufs), runs)
    return {"mib": mib, **with_rates(row, mib << 20)}


def probe_rates(mib: int, grids: list[int], chunks_kib: list[int], runs: int = 40) -> list:
    """The streaming reader's rates over buffers of ``mib`` MiB: static ranges on each grid,
    then chunks of each size from a counter on each grid; with the medians over the timed
    calls of the CTAs' start and end spreads and of the first start to the last end
    (microseconds, the CTAs' own clocks)."""
    from attnlab import device
    from attnlab.kernels.common.stream_read import THREADS, compile_stream_read

    arch = device.info().arch
    compiled = functools.cache(compile_stream_read)
    bufs = [b.view(torch.int32) for b in buffers(mib)]
    rows = []
    for dynamic in (False, True):
        for grid in grids:
            for chunk_kib in (chunks_kib if dynamic else [(mib << 10) // grid]):
                chunk = chunk_kib << 10
                chunks = (mib << 20) // chunk
                if (mib << 20) % chunk or (chunks < grid if dynamic else chunks % grid):
                    continue
                kernel = compiled(arch, chunk, dynamic)
                counter = torch.zeros(1, device="cuda", dtype=torch.int32)
                sink = torch.empty(grid * THREADS, device="cuda", dtype=torch.int32)
                stamps = torch.zeros(STAMP_RING, 2 * grid, device="cuda", dtype=torch.int64)
                made = [0]

                def read(i, bufs=bufs, stamps=stamps, counter=counter, sink=sink,
                         kernel=kernel, chunks=chunks, made=made):
                    kernel(bufs[i], counter, stamps[made[0] % STAMP_RING], sink,
                           made[0] * chunks)
                    made[0] += 1

                device_calls = []
                row = timed(read, len(bufs), runs, lambda stamps=stamps, calls=device_calls:
                            calls.append(stamps[WARMUP:WARMUP + runs].clone()))
                clock = device_calls[0].view(runs, grid, 2).double() / 1e3
                starts, ends = clock[..., 0], clock[..., 1]
                rows.append({
                    "mib": mib, "mode": "dynamic" if dynamic else "static", "grid": grid,
                    "chunk_kib": chunk_kib, **with_rates(row, mib << 20),
                    **{name: float(value.median()) for name, value in (
                        ("start_spread_us", starts.amax(1) - starts.amin(1)),
                        ("end_spread_us", ends.amax(1) - ends.amin(1)),
                        ("span_us", ends.amax(1) - starts.amin(1)))}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--mib", type=int, nargs="*", default=[16, 32, 64, 128, 256, 2048])
    parser.add_argument("--probe", action="store_true",
                        help="also the streaming reader, static and dynamic")
    parser.add_argument("--grid", type=int, nargs="*", default=None,
                        help="the reader's CTAs (default: 128 and the SM count)")
    parser.add_argument("--chunk-kib", type=int, nargs="*", default=[64, 256],
                        help="the dynamic reader's chunk sizes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [rate(m) for m in args.mib]
    probes = []
    if args.probe:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for m in args.mib:
            probes += probe_rates(m, args.grid or [128, sms], args.chunk_kib)
    (args.out / "read-ceiling.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "rows": rows, "probes": probes}, indent=1))
    for r in rows:
        print(f"read {r['mib']:5d} MiB: device {r['device_us']:8.1f} us {r['device_gbs']:6.0f} "
              f"GB/s, end to end {r['e2e_us']:8.1f} us {r['e2e_gbs']:6.0f} GB/s")
    for r in probes:
        print(f"reader {r['mib']:5d} MiB {r['mode']:7s} grid {r['grid']:3d} chunk "
              f"{r['chunk_kib']:5d} KiB: device {r['device_us']:7.1f} us {r['device_gbs']:5.0f} "
              f"GB/s, end to end {r['e2e_gbs']:5.0f} GB/s; starts within "
              f"{r['start_spread_us']:4.1f} us, ends within {r['end_spread_us']:4.1f} us, "
              f"span {r['span_us']:6.1f} us")


if __name__ == "__main__":
    main()
