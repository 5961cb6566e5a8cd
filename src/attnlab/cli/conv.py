"""``attnlab bench --family conv``: the convolution bench (conv2d against cuDNN) and the
ResBlock chain (against torch eager and ``torch.compile``): tables and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from attnlab.cli.measure import console, parse_dtypes, progress_bar, require_gpu


def bench_conv(dtypes: str, runs: int, out: Path) -> None:
    import torch

    from attnlab import device
    from attnlab.bench.conv import (
        RESBLOCKS,
        ResBlockPoint,
        conv_impls,
        conv_sets,
        resblock_impls,
        resblock_sets,
        sd_unet_points,
    )
    from attnlab.bench.gemm import measure_gemm
    from attnlab.conv.api import plan_label

    def conv_plan(point) -> str:
        x, w, _, stride, padding = conv_sets(point, 0)[0]
        return plan_label(x, w, stride, padding)

    points = [p for dtype in parse_dtypes(dtypes) for p in sd_unet_points(dtype=dtype)]
    require_gpu()
    info = device.info(torch.device("cuda"))
    out.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        task = progress.add_task("conv", total=len(points))
        results = measure_gemm(points, conv_impls(), info.l2_bytes, runs=runs,
                               on_point=lambda p: progress.advance(task),
                               make_sets=conv_sets)
    table = Table(title=f"attnlab bench --family conv on {info.name}: TFLOP/s end to end "
                        "(device only); attnlab (implicit GEMM) and the lab's earlier steps "
                        "(direct FFMA, im2col + GEMM); "
                        "ratio to cuDNN (F.conv2d, channels-last) in the same run",
                  title_justify="left")
    for column in ("shape", "dtype", "plan", "cudnn", "direct", "im2col", "attnlab", "ratio",
                   "device ratio"):
        table.add_column(column, justify="left" if column in ("shape", "plan") else "right")
    for point in points:
        mine = {r.impl: r for r in results if r.point == point}
        ours, peer = mine["attnlab"], mine["cudnn"]
        cells = [f"{r.tflops:.1f} ({r.device_tflops:.1f})" if r.tflops else
                 (r.error or "-")[:40] for r in (peer, mine["direct"], mine["im2col"], ours)]
        ok = ours.tflops and peer.tflops
        table.add_row(point.label(), point.dtype, conv_plan(point), *cells,
                      f"{ours.tflops / peer.tflops:.2f}x" if ok else "-",
                      f"{ours.device_tflops / peer.device_tflops:.2f}x" if ok else "-")
    console.print(table)
    blocks = [ResBlockPoint(1, c, hw, dtype) for dtype in parse_dtypes(dtypes)
              for c, hw in RESBLOCKS]
    with progress_bar() as progress:
        task = progress.add_task("resblock (torch.compile compiles first)", total=len(blocks))
        chain = measure_gemm(blocks, resblock_impls(), info.l2_bytes, runs=runs,
                             on_point=lambda p: progress.advance(task),
                             make_sets=resblock_sets)
    table = Table(title="the ResBlock chain: ms end to end (device only); attnlab's ratio to "
                        "torch eager and to torch.compile", title_justify="left")
    for column in ("block", "eager", "compiled", "attnlab", "/ eager", "/ compiled"):
        table.add_column(column, justify="left" if column == "block" else "right")
    for point in blocks:
        mine = {r.impl: r for r in chain if r.point == point}
        ms = {name: r.timing.median_ms if r.timing else None for name, r in mine.items()}
        cells = [f"{ms[n]:.3f} ({mine[n].device_timing.median_ms:.3f})" if ms[n] else
                 (mine[n].error or "-")[:30] for n in ("eager", "compiled", "attnlab")]
        ratios = [f"{ms[peer] / ms['attnlab']:.2f}x" if ms[peer] and ms["attnlab"] else "-"
                  for peer in ("eager", "compiled")]
        table.add_row(point.label(), *cells, *ratios)
    console.print(table)
    path = out / "conv.json"
    path.write_text(json.dumps({"device": info.name,
                                "results": [r.to_dict() for r in results + chain]}, indent=1))
    console.print(f"wrote {path}")
