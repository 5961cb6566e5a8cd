"""``attnlab bench --family gemm``: the table, JSON and plot of the GEMM bench."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from attnlab.cli.measure import console, parse_dtypes, progress_bar, require_gpu


def parse_shapes(text: str | None) -> list[tuple[int, int, int, str]]:
    """``"4096x4096x4096,1x4096x4096t"`` -> ``[(4096, 4096, 4096, "n"), (1, 4096, 4096,
    "k")]``; None: the lab's shapes and the LLM set (B^T for the LLM set, as F.linear)."""
    from attnlab.bench.gemm import LAB_SHAPES, LLM_SHAPES

    if text is None:
        return [(*s, "n") for s in LAB_SHAPES] + [(*s, "k") for s in LLM_SHAPES]
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        weight = part.endswith("t")
        try:
            m, n, k = (int(x) for x in part.removesuffix("t").split("x"))
        except ValueError:
            raise typer.BadParameter(f"expected MxNxK (e.g. 4096x4096x4096), got {part!r}",
                                     param_hint="--shapes") from None
        if min(m, n, k) <= 0:
            raise typer.BadParameter(f"sizes must be positive, got {part!r}",
                                     param_hint="--shapes")
        shapes.append((m, n, k, "k" if weight else "n"))
    return shapes


def bench_gemm(shapes: str | None, dtypes: str, runs: int, out: Path) -> None:
    import torch

    from attnlab import device
    from attnlab.bench.gemm import GemmPoint, gemm_impls, int8_impls, measure_gemm
    from attnlab.gemm.dispatch import plan
    from attnlab.gemm.int8 import INT8_BLOCK_K

    # INT8 reads B K-major: always the transposed-weight layout.
    points = [GemmPoint(m, n, k, dtype, "k" if dtype == "int8" else major)
              for dtype in parse_dtypes(dtypes, int8=True)
              for m, n, k, major in parse_shapes(shapes)]
    require_gpu()
    info = device.info(torch.device("cuda"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with progress_bar() as progress:
        task = progress.add_task("gemm", total=len(points))
        for family, impls in (("16-bit", gemm_impls()), ("int8", int8_impls())):
            chosen = [p for p in points if (p.dtype == "int8") == (family == "int8")]
            results += measure_gemm(chosen, impls, info.l2_bytes, runs=runs,
                                    on_point=lambda p: progress.advance(task))
    table = Table(title=f"attnlab bench --family gemm on {info.name}: TFLOP/s (int8: TOP/s) end "
                        "to end (device only); ratio to cuBLAS (int8: torch._int_mm) in the same "
                        "run", title_justify="left")
    for column in ("shape", "dtype", "plan", "peer", "attnlab", "ratio", "device ratio"):
        table.add_column(column, justify="left" if column in ("shape", "plan") else "right")
    rows = []
    for point in points:
        mine = {r.impl: r for r in results if r.point == point}
        ours, peer = mine["attnlab"], mine["int_mm" if point.dtype == "int8" else "cublas"]
        p = (plan(point.m, point.n, point.k, info.multiprocessors, block_k=INT8_BLOCK_K,
                  allow_split=False, in_dtype="int8") if point.dtype == "int8"
             else plan(point.m, point.n, point.k, info.multiprocessors))
        cells = [f"{r.tflops:.0f} ({r.device_tflops:.0f})" if r.tflops else (r.error or "-")[:40]
                 for r in (peer, ours)]
        ratio = (f"{ours.tflops / peer.tflops:.2f}x" if ours.tflops and peer.tflops else "-")
        dratio = (f"{ours.device_tflops / peer.device_tflops:.2f}x"
                  if ours.device_tflops and peer.device_tflops else "-")
        table.add_row(point.label(), point.dtype, p.config.label(), *cells, ratio, dratio)
        rows += [{**r.to_dict(), "plan": p.config.label()} for r in mine.values()]
    console.print(table)
    path = out / "gemm.json"
    path.write_text(json.dumps({"device": info.name, "results": rows}, indent=1))
    console.print(f"wrote {path} and {plot_gemm(results, out / 'gemm.png')}")


def bench_sparse(shapes: str | None, dtypes: str, runs: int, out: Path) -> None:
    """``attnlab bench --family sparse``: the 2:4 sparse HGEMM against the dense kernels on
    the same pruned A (TFLOP/s of the dense product's FLOPs), and the online INT8 GEMM beside
    them; table, ``sparse.json``, plot."""
    import torch

    from attnlab import device
    from attnlab.bench.gemm import (
        SPARSE_SHAPES,
        GemmPoint,
        measure_gemm,
        sparse_impls,
        sparse_sets,
    )

    chosen = (parse_shapes(shapes) if shapes
              else [(m, n, k, "k") for m, n, k in SPARSE_SHAPES])
    points = [GemmPoint(m, n, k, dtype, "k") for dtype in parse_dtypes(dtypes)
              for m, n, k, _ in chosen]
    require_gpu()
    info = device.info(torch.device("cuda"))
    out.mkdir(parents=True, exist_ok=True)
    impls = sparse_impls()
    with progress_bar() as progress:
        task = progress.add_task("sparse", total=len(points))
        results = measure_gemm(points, impls, info.l2_bytes, runs=runs,
                               on_point=lambda p: progress.advance(task), make_sets=sparse_sets)
    table = Table(title=f"attnlab bench --family sparse on {info.name}: TFLOP/s of the dense "
                        "product end to end (device only), one pruned A; 2:4 sparse over the "
                        "dense kernels in the same run", title_justify="left")
    for column in ("shape", "dtype", *impls, "/ attnlab", "/ cublas"):
        table.add_column(column, justify="left" if column == "shape" else "right")
    for point in points:
        mine = {r.impl: r for r in results if r.point == point}
        cells = [f"{r.tflops:.0f} ({r.device_tflops:.0f})" if r.tflops else (r.error or "-")[:30]
                 for r in mine.values()]
        sparse = mine["sparse24"]
        ratios = [f"{sparse.tflops / mine[peer].tflops:.2f}x"
                  if sparse.tflops and mine[peer].tflops else "-"
                  for peer in ("attnlab", "cublas")]
        table.add_row(point.label(), point.dtype, *cells, *ratios)
    console.print(table)
    path = out / "sparse.json"
    path.write_text(json.dumps({"device": info.name,
                                "results": [r.to_dict() for r in results]}, indent=1))
    console.print(f"wrote {path} and {plot_gemm(results, out / 'sparse.png')}")


def plot_gemm(results: list, path: Path) -> Path:
    """TFLOP/s per shape, one bar per implementation, one panel per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = list(dict.fromkeys(r.point.dtype for r in results))
    names = list(dict.fromkeys(r.impl for r in results))
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(12, 4 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes, strict=True):
        points = list(dict.fromkeys(r.point for r in results if r.point.dtype == dtype))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [next((r.tflops or 0 for r in results
                            if r.point == p and r.impl == name), 0) for p in points]
            ax.bar([x + i * width for x in range(len(points))], values, width, label=name)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(points))],
                      [p.label() for p in points], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s end to end")
        ax.set_yscale("log")
        ax.set_title(dtype)
        ax.legend()
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ladder_gemm(shapes: str, dtype: str, runs: int, out: Path) -> None:
    """The lab's HGEMM steps at ``shapes`` (B a transposed weight), % of cuBLAS in the same
    run, each step's ratio to its base; table, ``gemm_ladder.json`` and a plot."""
    import torch

    from attnlab import device
    from attnlab.bench.gemm import GemmPoint
    from attnlab.gemm.ladder import GEMM_BASES, ladder_matmul, steps_for

    require_gpu()
    info = device.info(torch.device("cuda"))
    (dtype_name,) = parse_dtypes(dtype)
    steps = steps_for(info.arch)
    impls = {"cublas": torch.matmul}
    impls.update({name: (lambda a, b, cfg=cfg: ladder_matmul(a, b, cfg))
                  for name, (cfg, _) in steps.items()})
    points = [GemmPoint(m, n, k, dtype_name, "k") for m, n, k, _ in parse_shapes(shapes)]
    steps_table({name: (cfg.to_dict(), what) for name, (cfg, what) in steps.items()},
                GEMM_BASES, impls, "cublas", points, runs, out / "gemm_ladder",
                f"attnlab ladder --family gemm on {info.name}, {dtype_name}: % of cuBLAS end "
                "to end (device only), x its base step")


def ladder_sparse(shapes: str, dtype: str, runs: int, out: Path) -> None:
    """The 2:4 sparse steps (``gemm.ladder.SPARSE_STEPS``) at ``shapes`` on one pruned A, % of
    cuBLAS (on A dense) in the same run, each step's ratio to its base; table,
    ``sparse_ladder.json`` and a plot."""
    import torch

    from attnlab import device
    from attnlab.bench.gemm import GemmPoint, sparse_sets
    from attnlab.gemm.ladder import SPARSE_BASES, sparse_step, sparse_steps_for

    require_gpu()
    info = device.info(torch.device("cuda"))
    (dtype_name,) = parse_dtypes(dtype)
    steps = sparse_steps_for(info.arch)
    impls = {"cublas": lambda a, s, semi, b: torch.matmul(a, b)}
    impls.update({name: sparse_step(name) for name in steps})
    points = [GemmPoint(m, n, k, dtype_name, "k") for m, n, k, _ in parse_shapes(shapes)]
    steps_table({name: ({**cfg.to_dict(), "sparse": sparse}, what)
                 for name, (cfg, sparse, what) in steps.items()},
                SPARSE_BASES, impls, "cublas", points, runs, out / "sparse_ladder",
                f"attnlab ladder --family sparse on {info.name}, {dtype_name}: % of cuBLAS "
                "end to end (device only), x its base step", make_sets=sparse_sets)


def ladder_conv(dtype: str, runs: int, out: Path) -> None:
    """The lab's convolution steps at SD-UNet shapes, % of cuDNN in the same run, each step's
    ratio to its base; table, ``conv_ladder.json`` and a plot."""
    import torch

    from attnlab import device
    from attnlab.bench.conv import ConvPoint, conv_sets
    from attnlab.conv.ladder import CONV_BASES, CONV_STEPS, step_conv

    require_gpu()
    info = device.info(torch.device("cuda"))
    (dtype_name,) = parse_dtypes(dtype)
    impls = {"cudnn": lambda x, w, b, s, p: torch.nn.functional.conv2d(x, w, b, s, p)}
    impls.update({name: step_conv(name) for name in CONV_STEPS})
    points = [ConvPoint(n, c, hw, c, dtype=dtype_name)
              for n, c, hw in ((1, 320, 64), (4, 320, 64), (4, 640, 32), (1, 128, 64))]
    steps = {name: ({k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in opts.items()},
                    what) for name, (opts, what) in CONV_STEPS.items()}
    steps_table(steps, CONV_BASES, impls, "cudnn", points, runs, out / "conv_ladder",
                f"attnlab ladder --family conv on {info.name}, {dtype_name}: % of cuDNN end "
                "to end (device only), x its base step", make_sets=conv_sets)


def steps_table(steps: dict[str, tuple[dict, str]], bases: dict[str, str], impls: dict,
                peer: str, points: list, runs: int, stem: Path, title: str,
                make_sets=None) -> None:
    """Time ``impls`` (the steps and ``peer``) at ``points``; print each step's percent of the
    peer and ratio to its base, write ``{stem}.json`` and ``{stem}.png``."""
    import torch

    from attnlab import device
    from attnlab.bench.gemm import gemm_sets, measure_gemm

    info = device.info(torch.device("cuda"))
    stem.parent.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        task = progress.add_task(stem.name.replace("_", " "), total=len(points))
        results = measure_gemm(points, impls, info.l2_bytes, runs=runs,
                               on_point=lambda p: progress.advance(task),
                               make_sets=make_sets or gemm_sets)
    table = Table(title=title, title_justify="left")
    table.add_column("step")
    table.add_column("what it changes")
    for point in points:
        table.add_column(point.label(), justify="right")
    rows = []
    for name, (knobs, what) in steps.items():
        cells = []
        for point in points:
            mine = {r.impl: r for r in results if r.point == point}
            r, ref, base = mine[name], mine[peer], mine.get(bases.get(name, ""))
            if not r.tflops or not ref.tflops:
                cells.append((r.error or "-")[:30])
                continue
            delta = f" x{r.tflops / base.tflops:.2f}" if base is not None and base.tflops else ""
            cells.append(f"{100 * r.tflops / ref.tflops:.0f}% "
                         f"({100 * r.device_tflops / ref.device_tflops:.0f}%){delta}")
        table.add_row(name, what, *cells)
        rows.append({"step": name, "config": knobs, "what": what})
    console.print(table)
    path = stem.with_suffix(".json")
    path.write_text(json.dumps({"device": info.name, "steps": rows,
                                "results": [r.to_dict() for r in results]}, indent=1))
    console.print(f"wrote {path} and {plot_gemm(results, stem.with_suffix('.png'))}")


def tune_gemm(cache, shapes: str, dtype: str, runs: int) -> None:
    """Time ``gemm_space`` at each shape (round-robin, end to end), store each shape's best in
    ``cache`` and print every shape's best against the dispatch model's choice."""
    import torch

    from attnlab import device
    from attnlab.bench.gemm import GemmPoint, measure_gemm
    from attnlab.dispatch import reload_tune_cache
    from attnlab.gemm import int8_matmul, matmul
    from attnlab.gemm.api import forget_calls
    from attnlab.gemm.tune import gemm_key, gemm_space, record, tune_shape

    require_gpu()
    info = device.info(torch.device("cuda"))
    (dtype_name,) = parse_dtypes(dtype, int8=True)
    out_name = "bfloat16" if dtype_name == "int8" else dtype_name
    table = Table(title=f"attnlab tune --family gemm on {info.name}, {dtype_name}: ms end to "
                        "end", title_justify="left")
    for column in ("shape", "candidates", "model's choice", "ms", "best", "ms", "gain"):
        table.add_column(column)
    for m, n, k, major in parse_shapes(shapes):
        point = GemmPoint(m, n, k, dtype_name, "k" if dtype_name == "int8" else major)
        space = gemm_space(m, n, k, info.multiprocessors, dtype_name, out_name)
        if dtype_name == "int8":
            impls = {cfg.label(): (lambda a, b, sa, sb, zb, cfg=cfg:
                                   int8_matmul(a, b, sa, sb, zero_b=zb, config=cfg))
                     for cfg in space}
        else:
            impls = {cfg.label(): (lambda a, b, cfg=cfg: matmul(a, b, config=cfg))
                     for cfg in space}
        by_label = {cfg.label(): cfg for cfg in space}
        with progress_bar() as progress:
            progress.add_task(f"{point.label()}: {len(space)} configs", total=None)
            results = {r.impl: r for r in measure_gemm([point], impls, info.l2_bytes,
                                                       runs=runs)}

        def time_ms(cfg, results=results):
            timing = results[cfg.label()].timing
            return timing.median_ms if timing else None

        best, timings = tune_shape(space, time_ms)
        record(cache, gemm_key(info, dtype_name, out_name, m, n, k), best, timings)
        model = space[0]
        model_ms = timings.get(model, float("nan"))
        table.add_row(point.label(), str(len(by_label)), model.label(), f"{model_ms:.4f}",
                      best.label(), f"{timings[best]:.4f}", f"{model_ms / timings[best]:.2f}x")
    console.print(table)
    console.print(f"wrote {cache.save()}")
    reload_tune_cache()
    forget_calls()
