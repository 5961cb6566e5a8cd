"""``attnlab study``: the lab's studies (``attnlab.studies``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from attnlab.cli import app
from attnlab.cli.measure import OUT_OPTION, parse_ints, progress_bar, require_gpu

study_app = typer.Typer(help="The lab's studies: memory layouts and tools.",
                        no_args_is_help=True)
app.add_typer(study_app, name="study")
console = Console()


def _modes(text: str) -> list[tuple[int, int]]:
    try:
        modes = [tuple(int(v) for v in part.split("x")) for part in text.split(",") if part]
    except ValueError:
        modes = []
    if not modes or any(len(m) != 2 or m[0] < 0 or m[1] < 1 for m in modes):
        raise typer.BadParameter(f"expected modes as NxM[,NxM...] with n >= 0, m >= 1, got "
                                 f"{text!r}", param_hint="--modes")
    return modes  # type: ignore[return-value]


@study_app.command("cymatic")
def cymatic_command(
    grids: str = typer.Option("2048,8192", help="Comma-separated grid sizes (cells per side); "
                              "8192^2 is a 210 MB buffer, past the H100's 50 MB L2."),
    modes: str = typer.Option("6x4,5x4", help="Membrane modes n x m (the seed's default 6x4, "
                              "its best universal 5x4)."),
    runs: int = typer.Option(11, min=3, help="Timed runs per trace and layout (median)."),
    resume: bool = typer.Option(False, help="Keep the rows of OUT/cymatic.json and measure "
                                "only the (grid, mode) pairs it lacks: a sweep saves after "
                                "every mode, so it can be spread over several runs."),
    fa: bool = typer.Option(False, help="Add Observation JJ's three FlashAttention block "
                            "traces (one head's K/V strip, every query block x key block "
                            "pair in the kernel's, anti-diagonal and snake orders)."),
    sweep: bool = typer.Option(False, help="Observation II's sweep instead of --modes: n in "
                               "2..10 x m in 1..6, with a heatmap of each mode's geometric "
                               "mean and the best mode per trace."),
    out: Path = OUT_OPTION,
) -> None:
    """Seed 004's memory-layout study: the same gather traces through a row-major and a
    cymatic (membrane-mode) address map of a disc; speedup of the cymatic layout per trace."""
    from attnlab.studies import cymatic

    grid_sizes = parse_ints(grids, "--grids")
    mode_list = list(cymatic.SWEEP_MODES) if sweep else _modes(modes)
    require_gpu()
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "cymatic.json"
    rows = json.loads(saved.read_text()) if resume and saved.exists() else []
    done = {(r["grid"], tuple(r["mode"])) for r in rows}
    with progress_bar() as progress:
        per_mode = cymatic.SEED_TRACE_COUNT + len(cymatic.FA_TRACES) * fa
        task = progress.add_task("gather traces",
                                 total=len(grid_sizes) * len(mode_list) * per_mode)
        for grid in grid_sizes:
            todo = [mode for mode in mode_list if (grid, mode) not in done]
            progress.advance(task, per_mode * (len(mode_list) - len(todo)))
            if not todo:
                continue
            earlier = list(rows)
            rows = earlier + cymatic.measure(
                grid, todo, runs, lambda: progress.advance(task),
                lambda new, earlier=earlier: saved.write_text(json.dumps(earlier + new,
                                                                         indent=1)), fa=fa)
    columns = list(dict.fromkeys((r["grid"], tuple(r["mode"])) for r in rows))
    table = Table(title="cymatic layout: row-major time / cymatic time per trace (above 1: "
                  "cymatic faster)", title_justify="left")
    table.add_column("trace")
    for grid, mode in columns:
        table.add_column(f"{grid}^2 {mode[0]}x{mode[1]}", justify="right")
    for name in dict.fromkeys(r["trace"] for r in rows):
        table.add_row(name, *[f"{r['speedup']:.2f}x" for c in columns for r in rows
                              if r["trace"] == name and (r["grid"], tuple(r["mode"])) == c])
    if not sweep:
        console.print(table)
    shown = {cymatic.DEFAULT_MODE} if sweep else set(mode_list)
    for grid in grid_sizes:
        summary = cymatic.sweep_summary(rows, grid)
        best = summary["best_universal"]
        geomean, worst = summary["geomean"][best]
        console.print(f"{grid}^2: best mode over all traces {best}: geomean {geomean:.3f}x, "
                      f"worst trace {worst:.3f}x")
        if sweep:
            heatmap = cymatic.plot_sweep(rows, grid, out / f"cymatic_sweep_{grid}.png")
            console.print(f"wrote {heatmap}")
            shown.add(tuple(int(x) for x in best.split("x")))
    saved.write_text(json.dumps(rows, indent=1))
    # A sweep's bars: the seed's default mode and each grid's best one (54 series are unreadable).
    png = cymatic.plot([r for r in rows if tuple(r["mode"]) in shown], 512,
                       cymatic.DEFAULT_MODE if sweep else mode_list[0], out / "cymatic.png")
    console.print(f"wrote {out / 'cymatic.json'} and {png}")


@study_app.command("frontends")
def frontends_command(
    arch: str = typer.Option("sm_90a", help="Target of the static builds (sm_80, sm_90a; a "
                             "GPU run builds for the GPU at hand)."),
    gpu: bool = typer.Option(False, "--run", help="Also build with Triton, time every build "
                             "round-robin and check its output against the CuTe DSL's (GPU)."),
    runs: int = typer.Option(20, min=5),
    out: Path = OUT_OPTION,
) -> None:
    """Seed 004's front-end comparison (Observation KK) on attnlab's front-end: the same
    kernels from the CuTe DSL, nvcc (CUDA C++) and Triton: SASS instructions and groups,
    registers, build time (and time per call with --run)."""
    from attnlab.studies import frontends

    if gpu:
        import torch

        from attnlab import device

        require_gpu()
        arch = device.info(torch.device("cuda")).arch
    with progress_bar() as progress:
        task = progress.add_task(f"building for {arch}", total=len(frontends.KERNELS))
        rows = frontends.run(arch, gpu, runs, lambda: progress.advance(task))
    table = Table(title=f"front-ends on {arch}: SASS instructions (no NOPs), registers, build "
                  "seconds" + (", device time and rate" if gpu else ""), title_justify="left")
    columns = ["kernel", "front-end", "instructions", "integer/address", "global memory",
               "tensor", "registers", "build s"]
    columns += ["ms", "GB/s | TFLOP/s", "max |diff|"] if gpu else []
    for column in columns:
        table.add_column(column, justify="left" if column in ("kernel", "front-end") else
                         "right")
    for r in rows:
        if r.get("error"):
            table.add_row(r["kernel"], r["frontend"], str(r["error"])[:60])
            continue
        groups = r["groups"]
        cells = [str(r["instructions"]), str(groups.get("integer/address", 0)),
                 str(groups.get("global memory", 0)), str(groups.get("tensor", 0)),
                 str(r["registers"]), f"{r['build_s']:.2f}"]
        if gpu:
            diff = r.get("max_abs_diff")
            cells += [f"{r.get('ms', 0):.3f}", f"{r.get('rate', 0):.0f}",
                      "-" if diff is None else f"{diff:.2g}"]
        table.add_row(r["kernel"], r["frontend"], *cells)
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"frontends_{arch}.json"
    path.write_text(json.dumps(rows, indent=1))
    console.print(f"wrote {path} and {frontends.plot(rows, out / f'frontends_{arch}.png')}")
