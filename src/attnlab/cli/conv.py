"""``attnlab bench --family conv``: the table and JSON of the convolution bench."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from attnlab.cli.gemm import parse_gemm_dtypes
from attnlab.cli.measure import console, progress_bar, require_gpu


def bench_conv(dtypes: str, runs: int, out: Path) -> None:
    import torch

    from attnlab import device
    from attnlab.bench.conv import conv_impls, conv_sets, sd_unet_points
    from attnlab.bench.gemm import measure_gemm

    require_gpu()
    info = device.info(torch.device("cuda"))
    points = [p for dtype in parse_gemm_dtypes(dtypes) if dtype != "int8"
              for p in sd_unet_points(dtype=dtype)]
    out.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        task = progress.add_task("conv", total=len(points))
        results = measure_gemm(points, conv_impls(), info.l2_bytes, runs=runs,
                               on_point=lambda p: progress.advance(task),
                               make_sets=conv_sets)
    table = Table(title=f"attnlab bench --family conv on {info.name}: TFLOP/s end to end "
                        "(device only); ratio to cuDNN (F.conv2d, channels-last) in the same "
                        "run", title_justify="left")
    for column in ("shape", "dtype", "cudnn", "attnlab", "ratio", "device ratio"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    for point in points:
        mine = {r.impl: r for r in results if r.point == point}
        ours, peer = mine["attnlab"], mine["cudnn"]
        cells = [f"{r.tflops:.0f} ({r.device_tflops:.0f})" if r.tflops else (r.error or "-")[:40]
                 for r in (peer, ours)]
        ok = ours.tflops and peer.tflops
        table.add_row(point.label(), point.dtype, *cells,
                      f"{ours.tflops / peer.tflops:.2f}x" if ok else "-",
                      f"{ours.device_tflops / peer.device_tflops:.2f}x" if ok else "-")
    console.print(table)
    path = out / "conv.json"
    path.write_text(json.dumps({"device": info.name,
                                "results": [r.to_dict() for r in results]}, indent=1))
    console.print(f"wrote {path}")
