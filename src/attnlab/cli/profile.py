"""``attnlab profile`` (Nsight Compute, ours vs the reference), ``attnlab roofline`` and
``attnlab patch`` (control-code edits timed against the original)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from attnlab.cli import app
from attnlab.cli.measure import OUT_OPTION, parse_dtypes, parse_ints, require_gpu

console = Console()
#: Peers ``--peers`` takes (each profiled in its own process; see ``analysis.ncu``).
PEERS = ("sdpa_flash", "sdpa_cudnn", "fa4")


def _shape(text: str) -> tuple[int, ...]:
    values = parse_ints(text, "--shape")
    if len(values) != 5:
        raise typer.BadParameter(f"expected B,Sq,Sk,H,D, got {text!r}", param_hint="--shape")
    return tuple(values)


def _profile_all(config: str, shape: tuple[int, ...], dtype: str, peers: list[str],
                 causal: bool = False):
    from attnlab.analysis.ncu import ProfilerUnavailable, profile

    target = ["--config", config, "--shape", ",".join(map(str, shape)), "--dtype", dtype]
    if causal:
        target.append("--causal")
    impls = ["attnlab", *peers]
    try:
        return [profile(impl, target) for impl in impls]
    except ProfilerUnavailable as exc:
        console.print(f"[red]cannot read hardware counters here:[/red] {exc}")
        raise typer.Exit(code=3) from None


def _family_shape(family: str, shape: str | None) -> tuple[str, tuple[int, ...]]:
    """The shape option of ``profile``/``roofline`` for a family (its default when None),
    checked: B,Sq,Sk,H,D for attention, three sizes for gemm (M,N,K) and conv (N,C,HW)."""
    if family not in ("attention", *FAMILY_ROOFLINES):
        raise typer.BadParameter(f"{family!r} is not one of attention, "
                                 f"{', '.join(FAMILY_ROOFLINES)}", param_hint="--family")
    if family == "attention":
        shape = shape or "4,4096,4096,16,128"
        return shape, _shape(shape)
    shape = shape or FAMILY_ROOFLINES[family][0]
    try:
        dims = tuple(int(x) for x in shape.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise typer.BadParameter(f"expected three positive sizes, got {shape!r}",
                                 param_hint="--shape")
    return shape, dims


def _profile_family(family: str, shape: str, dtype: str):
    """ncu of attnlab's call and its peer's at one GEMM or convolution shape."""
    from attnlab.analysis.ncu import ProfilerUnavailable, profile

    target = ["--family", family, "--shape", shape, "--dtype", dtype]
    try:
        return [profile(impl, target) for impl in ("attnlab", FAMILY_ROOFLINES[family][1])]
    except ProfilerUnavailable as exc:
        console.print(f"[red]cannot read hardware counters here:[/red] {exc}")
        raise typer.Exit(code=3) from None


@app.command("profile")
def profile_command(
    config: str = typer.Argument(
        "k07", help="Ladder name, JSON file of FlashConfig fields, or 'default' (what a call "
        "runs on this GPU)."),
    shape: str | None = typer.Option(None, help="B,Sq,Sk,H,D (default 4,4096,4096,16,128); "
                                     "with --family gemm M,N,K, conv N,C,HW."),
    dtype: str = typer.Option("bf16"),
    causal: bool = typer.Option(False, help="Causal mask (bottom-right; Sq == Sk here)."),
    peers: str = typer.Option("sdpa_flash", help="Comma-separated peers profiled beside it: "
                              f"{', '.join(PEERS)} (empty for none)."),
    family: str = typer.Option("attention", help="attention (CONFIG and --peers), or gemm / "
                               "conv: what attnlab.gemm.matmul / attnlab.conv.conv2d run, "
                               "beside cuBLAS / cuDNN (CONFIG, --peers and --causal unused)."),
    stalls: bool = typer.Option(False, help="Also sample warp stalls per SASS instruction "
                                "(ncu's source counters): the reasons and the instructions "
                                "with the most samples, per implementation."),
    out: Path = OUT_OPTION,
) -> None:
    """Nsight Compute metrics of one launch: bank conflicts, stalls, pipes, opcodes, bytes."""
    from attnlab.analysis.ncu import METRIC_SETS, OPCODES_SHOWN, derived, save_json
    from attnlab.ladder import resolve

    shape, dims = _family_shape(family, shape)
    if family != "attention":
        if stalls:
            raise typer.BadParameter("stall sampling is for attention configs",
                                     param_hint="--stalls")
        (dtype_name,) = parse_dtypes(dtype)
        require_gpu()
        with console.status("running ncu (one launch each)"):
            profiles = _profile_family(family, shape, dtype_name)
        config, causal = family, False
    elif config != "default":
        try:
            resolve(config)
        except (KeyError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="CONFIG") from None
    peer_names = [p for p in peers.split(",") if p]
    unknown = sorted(set(peer_names) - set(PEERS))
    if unknown and family == "attention":
        raise typer.BadParameter(f"unknown peers {unknown}; choose from {', '.join(PEERS)}",
                                 param_hint="--peers")
    if family == "attention":
        (dtype_name,) = parse_dtypes(dtype)
        require_gpu()
        with console.status("running ncu (one launch each)"):
            profiles = _profile_all(config, dims, dtype_name, peer_names, causal)
    mask_name = " causal" if causal else ""
    table = Table(title=f"ncu --clock-control none: {config} vs peers, shape {shape}{mask_name}")
    table.add_column("metric")
    for p in profiles:
        table.add_column(p.impl, justify="right")
    for group, metrics in METRIC_SETS.items():
        table.add_row(f"[bold]{group}[/bold]")
        for short in metrics:
            if short == "per_opcode_with_modifier":
                # Executed counts of the seeds' suspects; every opcode is in the JSON.
                for opcode in OPCODES_SHOWN:
                    table.add_row(f"  {opcode}", *[_fmt(_opcode(p, opcode)) for p in profiles])
                continue
            table.add_row(short, *[_fmt(p.metrics.get(short)) for p in profiles])
    table.add_row("[bold]derived[/bold]")
    for key in sorted({k for p in profiles for k in derived(p)}):
        table.add_row(key, *[_fmt(derived(p).get(key)) for p in profiles])
    console.print(table)
    for p in profiles:
        if "unavailable" in p.metrics:
            missing = p.metrics["unavailable"]
            console.print(f"[yellow]{p.impl}: ncu did not report[/yellow] {missing}")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"profile_{Path(config).stem}{'_causal' if causal else ''}_{'x'.join(map(str, dims))}"
    console.print(f"wrote {save_json(out / f'{stem}.json', profiles)}")
    if stalls:
        _stall_tables(config, dims, dtype_name, peer_names, causal, out / f"{stem}_stalls.json")


def _stall_tables(config: str, shape: tuple[int, ...], dtype: str, peers: list[str],
                  causal: bool, path: Path) -> None:
    import json

    from attnlab.analysis.ncu import ProfilerUnavailable, stall_sampling

    target = ["--config", config, "--shape", ",".join(map(str, shape)), "--dtype", dtype]
    if causal:
        target.append("--causal")
    reports = []
    for impl in ["attnlab", *peers]:
        try:
            with console.status(f"sampling {impl}'s stalls"):
                report = stall_sampling(impl, target)
        except ProfilerUnavailable as exc:
            console.print(f"[red]{exc}[/red]")
            continue
        reports.append(report)
        table = Table(title=f"{impl}: {report.total} warp-stall samples; the instructions "
                      "with the most", title_justify="left")
        for column in ("samples", "share", "address", "SASS", "top reasons"):
            table.add_column(column, justify="right" if column in ("samples", "share")
                             else "left")
        for site in report.sites:
            table.add_row(str(site.samples), f"{site.samples / report.total:.1%}",
                          site.address, site.sass[:60],
                          ", ".join(f"{name} {n}" for name, n in site.reasons))
        console.print(table)
        console.print("by reason: " + ", ".join(
            f"{name} {n / report.total:.0%}" for name, n in report.by_reason[:6]))
    path.write_text(json.dumps([r.to_dict() for r in reports], indent=1))
    console.print(f"wrote {path}")


EDIT_OPTION = typer.Option(
    None, "--edit", help="OPCODE:FROM:TO stall edit (repeat for several variants; 'A+B' "
    "applies two edits in one variant); default seed 004's HMMA edit for this GPU: the "
    "stall of back-to-back HMMAs halved, 8 -> 4 on sm_80, 6 -> 3 on sm_90a (its IMMA:4:2 "
    "needs an int8 kernel).")


@app.command("patch")
def patch_command(
    config: str = typer.Argument(
        "k16", help="Ladder name, JSON file of FlashConfig fields, 'default', or "
        "cuda:igemm_tile / cuda:hgemm_tile (the front-end study's nvcc WMMA tiles: IMMA and "
        "HMMA, at 4096^3; default edits IMMA:4:2 and the arch's HMMA halving)."),
    edit: list[str] | None = EDIT_OPTION,
    shape: str = typer.Option("4,4096,4096,16,128", help="B,Sq,Sk,H,D"),
    dtype: str = typer.Option("bf16"),
    causal: bool = typer.Option(False),
    runs: int = typer.Option(50, min=5),
    out: Path = OUT_OPTION,
) -> None:
    """Rewrite instructions' stall counts in a compiled kernel and time it against the
    original (seed 004's CuAssembler edits), checking its output is unchanged."""
    import json

    import torch

    from attnlab import device
    from attnlab.analysis.cubin_patch import SEED_HMMA_EDIT, SEED_IMMA_EDIT, StallEdit
    from attnlab.bench.patch_ab import run_ab, run_cubin_ab
    from attnlab.bench.runner import Point
    from attnlab.ladder import resolve

    def variants_of(texts: list[str]) -> dict[str, list[StallEdit]]:
        return {text: [StallEdit.parse(part) for part in text.split("+")] for text in texts}

    cuda_kernel = config.removeprefix("cuda:") if config.startswith("cuda:") else None
    try:
        if cuda_kernel is not None and cuda_kernel not in ("igemm_tile", "hgemm_tile"):
            raise ValueError(f"{config}: the CUDA kernels are cuda:igemm_tile and "
                             f"cuda:hgemm_tile (the front-end study's WMMA tiles)")
        flash = None if config == "default" or cuda_kernel else resolve(config)
        variants = variants_of(edit or [])
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc)) from None
    b, sq, sk, h, d = _shape(shape)
    (dtype_name,) = parse_dtypes(dtype)
    require_gpu()
    if not variants:
        arch = device.info(torch.device("cuda")).arch
        seed = SEED_IMMA_EDIT if cuda_kernel == "igemm_tile" else SEED_HMMA_EDIT
        variants = variants_of([seed.get(arch, seed["sm_80"])])
    point = Point(b, sq, sk, h, d, dtype_name, causal)
    with console.status("compiling, patching and timing"):
        if cuda_kernel is None:
            results = run_ab(point, flash, variants, runs=runs)
            what = point.label()
        else:
            results = run_cubin_ab(cuda_kernel, variants, runs=runs)
            what, causal, (b, sq, sk, h, d) = "4096^3 (nvcc WMMA tile)", False, (4096,) * 5
    base = results[0].median_ms
    table = Table(title=f"control-code edits of {config}: {what}, {runs} runs each")
    for column in ("variant", "instructions changed", "median ms (95 % CI)", "vs original",
                   "output"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for r in results:
        same = "identical" if r.identical else f"[red]differs by {r.max_abs_diff:.3g}[/red]"
        table.add_row(r.variant, str(r.changed),
                      f"{r.median_ms:.4f} ({r.ci_ms[0]:.4f}-{r.ci_ms[1]:.4f})",
                      f"{base / r.median_ms:.3f}x", same)
    console.print(table)
    out.mkdir(parents=True, exist_ok=True)
    stem = cuda_kernel or Path(config).stem
    path = out / (f"patch_{stem}{'_causal' if causal else ''}_"
                  f"{'x'.join(map(str, (b, sq, sk, h, d)))}.json")
    path.write_text(json.dumps({"point": what, "config": config,
                                "results": [r.to_dict() for r in results]}, indent=1))
    console.print(f"wrote {path}")


def _opcode(profile, opcode: str) -> float | None:
    counts = profile.metrics.get("per_opcode_with_modifier")
    return counts.get(opcode) if isinstance(counts, dict) else None


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)[:40]


CONFIGS_ARGUMENT = typer.Argument(None, help="Ladder names / JSON files (default k07).")


#: The lab families' roofline anchors: the default shape and the peer profiled beside attnlab.
FAMILY_ROOFLINES = {"gemm": ("8192,8192,8192", "cublas"), "conv": ("4,320,64", "cudnn")}


@app.command()
def roofline(
    configs: list[str] = CONFIGS_ARGUMENT,
    shape: str | None = typer.Option(None, help="B,Sq,Sk,H,D (default 4,4096,4096,16,128); "
                                     "with --family gemm M,N,K (8192^3), conv N,C,HW "
                                     "(4,320,64: a 3 x 3 convolution)."),
    dtype: str = typer.Option("bf16"),
    family: str = typer.Option("attention", help="attention (the configs and SDPA flash), "
                               "gemm (attnlab.gemm.matmul and cuBLAS) or conv "
                               "(attnlab.conv.conv2d and cuDNN): Observation BB per family."),
    out: Path = OUT_OPTION,
) -> None:
    """Roofline PNG: configs and the reference against measured DRAM/L2/matmul ceilings."""
    import json

    import torch

    from attnlab.analysis.roofline import RooflinePoint, plot_roofline
    from attnlab.bench.ceilings import measure_ceilings
    from attnlab.bench.timing import attention_flops

    shape, dims = _family_shape(family, shape)
    (dtype_name,) = parse_dtypes(dtype)
    if family == "attention":
        flops = attention_flops(dims[0], dims[3], dims[1], dims[2], dims[4])
    else:
        flops = (2.0 * dims[0] * dims[1] * dims[2] if family == "gemm"
                 else 2.0 * dims[0] * dims[2] ** 2 * dims[1] ** 2 * 9)
    require_gpu()
    with console.status("measuring ceilings"):
        ceilings = measure_ceilings()
    if family == "attention":
        profiled = []
        for i, config in enumerate(configs or ["k07"]):
            with console.status(f"profiling {config}"):
                profiled += [(config if p.impl == "attnlab" else p.impl, p) for p in
                             _profile_all(config, dims, dtype_name,
                                          ["sdpa_flash"] if i == 0 else [])]
    else:
        with console.status(f"profiling the {family} family"):
            profiled = [(f"attnlab {family}" if p.impl == "attnlab" else p.impl, p)
                        for p in _profile_family(family, shape, dtype_name)]
    points = []
    for name, p in profiled:
        m = p.metrics
        points.append(RooflinePoint(name, flops, m["duration_ns"] * 1e-9,
                                    m["dram_read_bytes"] + m["dram_write_bytes"],
                                    m["l2_bytes"]))
    out.mkdir(parents=True, exist_ok=True)
    png = plot_roofline(points, ceilings.dram_bytes_per_s, ceilings.l2_bytes_per_s,
                        ceilings.matmul_flops_per_s, out / "roofline.png",
                        f"{torch.cuda.get_device_name()} {dtype_name} shape {shape}",
                        mma_sync_flops_per_s=ceilings.mma_sync_flops_per_s)
    table = Table(title="roofline points (ncu)")
    for column in ("kernel", "TFLOP/s", "of mma.sync", "DRAM FLOP/B", "L2 FLOP/B"):
        table.add_column(column, justify="right")
    for p in points:
        table.add_row(p.name, f"{p.flops_per_s / 1e12:.1f}",
                      f"{p.flops_per_s / ceilings.mma_sync_flops_per_s:.0%}",
                      f"{p.dram_intensity:.0f}", f"{p.l2_intensity:.0f}")
    console.print(table)
    console.print(f"ceilings: {ceilings.to_dict()}")
    (out / "roofline.json").write_text(json.dumps(
        {"ceilings": ceilings.to_dict(), "points": [p.__dict__ for p in points]}, indent=1))
    console.print(f"wrote {png}")
