"""``attnlab bench``, ``attnlab ladder``, ``attnlab tune``: measuring against the reference.

Thin commands: argument parsing, progress bars and printing. The work is in
``attnlab.bench`` and ``attnlab.tune``, which the tests call directly.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from attnlab.cli import app

console = Console()

FULL_SEQLENS = "512,1024,2048,4096,8192,16384"
QUICK_SEQLENS = "1024,4096"


def parse_ints(text: str, option: str) -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]``, or a clear error naming the option."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}",
                                 param_hint=option) from None
    if not values or any(v <= 0 for v in values):
        raise typer.BadParameter(f"expected positive integers, got {text!r}", param_hint=option)
    return values


def parse_dtypes(text: str, int8: bool = False) -> list[str]:
    """``"bf16,fp16"`` -> dtype names; ``int8`` admits ``int8`` too (the GEMM family)."""
    aliases = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
               "float16": "float16", "half": "float16"}
    if int8:
        aliases["int8"] = "int8"
    try:
        return [aliases[part.strip()] for part in text.split(",") if part.strip()]
    except KeyError as exc:
        choices = "bf16, fp16 and/or int8" if int8 else "bf16 and/or fp16"
        raise typer.BadParameter(f"unknown dtype {exc.args[0]!r}; use {choices}",
                                 param_hint="--dtypes") from None


def require_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        console.print("[red]error:[/red] this command times kernels and needs a CUDA GPU "
                      "(torch.cuda.is_available() is False)")
        raise typer.Exit(code=2)


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    console=console, transient=False)


OUT_OPTION = typer.Option(Path("attnlab-results"), "--out", help="Folder for the JSON and PNG.")


MASK_MODES = {"full": (False,), "causal": (True,), "both": (False, True)}


def parse_mode(mode: str) -> tuple[bool, ...]:
    try:
        return MASK_MODES[mode]
    except KeyError:
        raise typer.BadParameter(f"expected one of {', '.join(MASK_MODES)}, got {mode!r}",
                                 param_hint="--mode") from None


def parse_window(text: str) -> tuple[int, int]:
    """``LEFT,RIGHT`` keys of a sliding window, each -1 (unbounded) or more, not both -1."""
    try:
        left, right = (int(side) for side in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected LEFT,RIGHT (two integers), got {text!r}",
                                 param_hint="--window") from None
    if min(left, right) < -1 or (left, right) == (-1, -1):
        raise typer.BadParameter(f"each side is -1 (unbounded) or a key count >= 0, and one is "
                                 f"bounded; got {text!r}", param_hint="--window")
    return left, right


# ---------------------------------------------------------------------------------------------
@app.command()
def bench(
    seqlens: str = typer.Option(FULL_SEQLENS, help="Comma-separated sequence lengths."),
    head_dims: str = typer.Option("64,128", "--head-dims", help="Comma-separated head dims."),
    dtypes: str = typer.Option("bf16,fp16", help="bf16 and/or fp16."),
    tokens: int = typer.Option(16384, help="Tokens per batch: batch = tokens / seqlen."),
    hidden: int = typer.Option(2048, help="Model width: heads = hidden / head_dim."),
    config: str = typer.Option(None, help="attnlab config (ladder name or JSON); default: "
                                          "what attention() picks."),
    impls: str = typer.Option(None, help="Comma-separated subset of implementations."),
    mode: str = typer.Option(None, help="full, causal or both (causal FLOPs are halved); "
                             "default both."),
    window: str = typer.Option(None, help="A sliding window LEFT,RIGHT in keys (-1: a side "
                               "unbounded) as every point's mask, replacing --mode; FLOPs count "
                               "the pairs inside it, ratios are to FA4 (torch SDPA, which has "
                               "no sliding window, is left out)."),
    gqa: int = typer.Option(1, min=1, help="Query heads per K/V head (GQA); 1 is MHA."),
    quick: bool = typer.Option(False, help=f"seqlens {QUICK_SEQLENS}, hd128, bf16, full, "
                                           "20 runs."),
    runs: int = typer.Option(30, min=20, help="Timed runs per measurement (median reported)."),
    host: bool = typer.Option(False, help="Time the host side instead: microseconds per call "
                              "on small problems, and a fresh process's first call."),
    backward: bool = typer.Option(False, help="Time training instead: forward + backward, and "
                                  "the backward alone (3.5x and 2.5x the forward's FLOPs)."),
    decode: bool = typer.Option(False, help="Time decoding steps against a KV cache instead: "
                                "--batches x --cache-lens x GQA 32/8 and 8/1, hd128, in GB/s "
                                "of K/V read and % of the DRAM read rate."),
    cross: bool = typer.Option(False, help="Cross-attention instead: seed 004's Sq x Sk shapes "
                               "(256 x 77, 1024 x 256, 4096 x 77), batch 8, 8 heads, "
                               "--head-dims."),
    family: str = typer.Option("attention", help="attention; gemm: attnlab.gemm.matmul "
                               "against cuBLAS on the lab's shapes and an LLM projection set "
                               "(--dtypes bf16,fp16,int8; --shapes); sparse: the 2:4 sparse "
                               "HGEMM and the online INT8 GEMM against the dense kernels and "
                               "torch's semi-structured sparse; conv: attnlab.conv.conv2d "
                               "against cuDNN at the SD-UNet shapes."),
    shapes: str = typer.Option(None, help="With --family gemm: MxNxK shapes, comma-separated "
                               "(a trailing 't' takes B as a transposed [N, K] weight)."),
    batches: str = typer.Option("1,8,64", help="With --decode: comma-separated batches."),
    cache_lens: str = typer.Option("4096,32768", "--cache-lens",
                                   help="With --decode: comma-separated cache lengths."),
    out: Path = OUT_OPTION,
) -> None:
    """attnlab against torch SDPA (flash, cudnn, efficient), FA4 and other installed peers.

    TFLOP/s end to end (host and device, back-to-back eager calls: what a user sees), with the
    device-only figure beside it."""
    import dataclasses

    from attnlab.bench.report import bench_table, plot_bench, write_json
    from attnlab.bench.runner import (
        REFERENCE,
        cross_grid,
        measure_grid,
        tokens_grid,
        training_impl,
    )

    if family == "gemm":
        from attnlab.cli.gemm import bench_gemm

        bench_gemm(shapes, dtypes, runs, out)
        return
    if family == "sparse":
        from attnlab.cli.gemm import bench_sparse

        bench_sparse(shapes, dtypes, runs, out)
        return
    if family == "conv":
        from attnlab.cli.conv import bench_conv

        bench_conv(dtypes, runs, out)
        return
    if family != "attention":
        raise typer.BadParameter(f"expected attention, gemm, sparse or conv, got {family!r}",
                                 param_hint="--family")
    if window is not None and (decode or host):
        raise typer.BadParameter("--window sets the mask of the forward grid; --decode and "
                                 "--host time other problems: drop it", param_hint="--window")
    if window is not None and mode is not None:
        raise typer.BadParameter("--window is every point's mask and replaces --mode: give "
                                 "one of them", param_hint="--window")
    mode = mode or "both"
    if decode:
        _bench_decode(parse_ints(batches, "--batches"), parse_ints(cache_lens, "--cache-lens"),
                      impls, runs, out)
        return
    if host:
        if backward:
            raise typer.BadParameter("--host times forward calls; drop --backward",
                                     param_hint="--backward")
        _bench_host(_bench_impls(config, impls), out)
        return
    if quick:
        seqlens, head_dims, dtypes, runs, mode = QUICK_SEQLENS, "128", "bf16", 20, "full"
    sliding = parse_window(window) if window is not None else None
    if cross:
        points = cross_grid(8, 8, parse_ints(head_dims, "--head-dims"), parse_dtypes(dtypes))
    else:
        points = tokens_grid(tokens, hidden, parse_ints(seqlens, "--seqlens"),
                             parse_ints(head_dims, "--head-dims"), parse_dtypes(dtypes),
                             (False,) if sliding else parse_mode(mode), gqa)
    implementations = _bench_impls(config, impls)
    reference = REFERENCE
    if sliding:
        points = [dataclasses.replace(p, window=sliding) for p in points]
        implementations = {name: fn for name, fn in implementations.items()
                           if not name.startswith("sdpa_")}
        reference = "fa4"
    require_gpu()
    out.mkdir(parents=True, exist_ok=True)
    # Each kind of work times every implementation wrapped for it, on its own points.
    works = ("forward+backward", "backward") if backward else ("forward",)
    with progress_bar() as progress:
        task = progress.add_task("bench", total=len(points) * len(works))
        results = []
        for work in works:
            wrapped = implementations if work == "forward" else {
                name: training_impl(fn, work) for name, fn in implementations.items()}
            results += measure_grid([dataclasses.replace(p, work=work) for p in points],
                                    wrapped, runs=runs,
                                    on_point=lambda p: progress.advance(task))
    console.print(bench_table(results, title=_device_title("attnlab bench"),
                              reference=reference))
    json_path = write_json(out / "bench.json", "bench", results)
    png_path = plot_bench(results, out / "bench.png")
    console.print(f"wrote {json_path} and {png_path}")


def _bench_decode(batches: list[int], cache_lens: list[int], impls: str | None, runs: int,
                  out: Path) -> None:
    import json

    import torch
    from rich.table import Table

    from attnlab import device
    from attnlab.bench.baselines import available_peers
    from attnlab.bench.ceilings import dram_read_rate
    from attnlab.bench.decode import (
        bandwidth_gbs,
        decode_points,
        measure_decode,
        paged_over_contiguous,
    )

    require_gpu()
    points = decode_points(batches, cache_lens, [(32, 8), (8, 1)])
    peers = {name: fn for name, fn in available_peers().items()
             if name in ("sdpa_flash", "sdpa_cudnn", "fa4")}
    if impls:
        wanted = impls.split(",")
        peers = {name: fn for name, fn in peers.items() if name in wanted}
    out.mkdir(parents=True, exist_ok=True)
    roof = dram_read_rate() / 1e9
    with progress_bar() as progress:
        task = progress.add_task("decode", total=len(points))
        results = measure_decode(points, peers, device.info(torch.device("cuda")).l2_bytes,
                                 runs=runs, on_point=lambda p: progress.advance(task))
    names = list(dict.fromkeys(r.impl for r in results))
    table = Table(title=_device_title(f"attnlab bench --decode: GB/s of K/V read end to end "
                                      f"(device only), % of the {roof:.0f} GB/s DRAM read "
                                      "rate; ratio to sdpa_flash"), title_justify="left")
    table.add_column("point")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("paged / contiguous", justify="right")
    rows = []
    for point in dict.fromkeys(r.point for r in results):
        mine = {r.impl: r for r in results if r.point == point}
        base = bandwidth_gbs(mine["sdpa_flash"]) if "sdpa_flash" in mine else None
        cells = []
        for name in names:
            r = mine.get(name)
            gbs = bandwidth_gbs(r) if r is not None else None
            if gbs is None:
                cells.append("-")
                continue
            ratio = f" {gbs / base:.2f}x" if base else ""
            cells.append(f"{gbs:.0f} ({bandwidth_gbs(r, device=True):.0f}) "
                         f"{100 * gbs / roof:.0f}%{ratio}")
        paged = paged_over_contiguous(mine)
        cells.append("-" if paged is None else f"{paged[0]:.3f} ({paged[1]:.3f})")
        table.add_row(f"B={point.batch} L={point.seqlen_k} {point.heads}/{point.kv_heads}",
                      *cells)
        rows += [{**r.to_dict(), "gbs": bandwidth_gbs(r),
                  "device_gbs": bandwidth_gbs(r, device=True)} for r in mine.values()]
    console.print(table)
    for point in dict.fromkeys(r.point for r in results if r.error):
        errors = {r.impl: r.error for r in results if r.point == point and r.error}
        # A point skipped as a whole (its inputs do not fit) says why once.
        whole = len(errors) == len(names) and len(set(errors.values())) == 1
        console.print(f"B={point.batch} L={point.seqlen_k} {point.heads}/{point.kv_heads}: "
                      + (next(iter(errors.values())) if whole else
                         "; ".join(f"{name}: {error}" for name, error in errors.items())))
    path = out / "decode.json"
    path.write_text(json.dumps({"dram_read_gbs": roof, "results": rows}, indent=1))
    console.print(f"wrote {path}")


def _bench_host(implementations: dict, out: Path) -> None:
    import json

    from attnlab.bench.host import HOST_POINTS, first_call_seconds, measure_host
    from attnlab.bench.report import host_table

    require_gpu()
    out.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        task = progress.add_task("host", total=len(HOST_POINTS) + 1)
        results = measure_host(HOST_POINTS, implementations,
                               on_point=lambda p: progress.advance(task))
        first = first_call_seconds()
        progress.advance(task)
    console.print(host_table(results, first, _device_title("attnlab bench --host")))
    path = out / "host.json"
    path.write_text(json.dumps({"results": [r.to_dict() for r in results],
                                "first_call": first}, indent=1))
    console.print(f"wrote {path}")


def _bench_impls(config: str | None, subset: str | None) -> dict:
    from attnlab.bench.baselines import available_peers
    from attnlab.bench.runner import REFERENCE, attnlab_impl
    from attnlab.ladder import resolve

    impls = {"attnlab": attnlab_impl(_resolve(resolve, config) if config else None)}
    impls.update(available_peers())
    if subset:
        wanted = [name.strip() for name in subset.split(",") if name.strip()]
        unknown = sorted(set(wanted) - set(impls))
        if unknown:
            raise typer.BadParameter(f"unknown {unknown}; available: {', '.join(impls)}",
                                     param_hint="--impls")
        # The reference is always measured: every ratio needs it from the same run.
        impls = {name: fn for name, fn in impls.items() if name in wanted or name == REFERENCE}
    return impls


def _resolve(resolve, spec: str):
    try:
        return resolve(spec)
    except (KeyError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="CONFIG") from None


def _device_title(what: str) -> str:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{what} on {name} (ratios measured in the same run)"


# ---------------------------------------------------------------------------------------------
#: Peers shown as rows of the Hopper ladder.
PEER_ROWS = {"sdpa_cudnn": "peer: cuDNN (torch SDPA)", "fa4": "peer: FA4 (flash-attn-4)"}


@app.command()
def ladder(
    seqlens: str = typer.Option(FULL_SEQLENS, help="Sequence lengths of the harmonic mean."),
    anchor: int = typer.Option(4096, help="The seqlen of the '% at' column."),
    head_dim: int = typer.Option(128, "--head-dim"),
    dtype: str = typer.Option("bf16", help="bf16 or fp16."),
    tokens: int = typer.Option(16384),
    hidden: int = typer.Option(2048),
    runs: int = typer.Option(30, min=20),
    family: str = typer.Option("seeds", help="seeds: k01-k16, the lab's variants and the "
                               "sm_90 mma.sync steps; sm90: the wgmma kernel's steps, with "
                               "cuDNN and FA4 as rows; gemm: the lab's HGEMM steps (g01-g09) "
                               "against cuBLAS at --shapes; sparse: the 2:4 sparse "
                               "kernels (s01-s05) beside the dense ones they are built on, "
                               "at --shapes; conv: the lab's convolution "
                               "steps (c01-c05) against cuDNN at SD-UNet shapes."),
    shapes: str = typer.Option("4096x4096x4096,2048x2048x2048", help="With --family gemm "
                               "or sparse: MxNxK shapes (whole 128 x 256 x 64 tiles)."),
    out: Path = OUT_OPTION,
) -> None:
    """The seeds' table: percent of SDPA flash per ladder step and lab variant, at ANCHOR and
    as a harmonic mean over the seqlens; each row's delta to its base (``ladder.BASES``).
    With ``--family sm90``, the Hopper ladder beside the peers it is measured against."""
    from attnlab import ladder as ladder_configs
    from attnlab.bench.baselines import available_peers, sdpa
    from attnlab.bench.report import (
        ladder_rows,
        ladder_table,
        plot_ladder,
        reference_tflops,
        write_json,
    )
    from attnlab.bench.runner import REFERENCE, attnlab_impl, measure_grid, tokens_grid

    if family == "gemm":
        from attnlab.cli.gemm import ladder_gemm

        ladder_gemm(shapes, dtype, runs, out)
        return
    if family == "sparse":
        from attnlab.cli.gemm import ladder_sparse

        ladder_sparse(shapes, dtype, runs, out)
        return
    if family == "conv":
        from attnlab.cli.gemm import ladder_conv

        ladder_conv(dtype, runs, out)
        return
    if family not in ladder_configs.FAMILIES:
        raise typer.BadParameter(
            f"{family!r} is not one of {', '.join(ladder_configs.FAMILIES)}",
            param_hint="--family")
    lengths = parse_ints(seqlens, "--seqlens")
    if anchor not in lengths:
        raise typer.BadParameter(f"{anchor} is not one of --seqlens {lengths}",
                                 param_hint="--anchor")
    (dtype_name,) = parse_dtypes(dtype)
    points = tokens_grid(tokens, hidden, lengths, [head_dim], [dtype_name])
    require_gpu()
    import torch

    from attnlab.device import arch_of

    configs = ladder_configs.named_for(arch_of(torch.device("cuda")), head_dim, family)
    impls = {REFERENCE: sdpa(REFERENCE)}
    impls.update({name: attnlab_impl(cfg) for name, cfg in configs.items()})
    # The Hopper ladder's peers, as rows of their own (no base: no delta).
    peers = ({name: fn for name, fn in available_peers().items() if name in PEER_ROWS}
             if family == "sm90" else {})
    impls.update(peers)
    out.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        task = progress.add_task("ladder", total=len(points))
        results = measure_grid(points, impls, runs=runs,
                               on_point=lambda p: progress.advance(task))
    steps = {name: ladder_configs.STEP_NAMES[name] for name in configs}
    steps.update({name: PEER_ROWS[name] for name in peers})
    bases = {**ladder_configs.BASES, **dict.fromkeys(peers, "")}
    rows = ladder_rows(results, steps, anchor, bases=bases)
    ref = reference_tflops(results, anchor)
    console.print(ladder_table(rows, ref, _device_title(
        f"attnlab ladder, {dtype_name} hd{head_dim}"), anchor))
    if family == "sm90":
        console.print(ladder_table(
            ladder_rows(results, steps, anchor, bases=bases, device=True), None,
            _device_title(f"the same, device only, {dtype_name} hd{head_dim}"), anchor))
    stem = f"ladder_{'' if family == 'seeds' else family + '_'}{dtype_name}_hd{head_dim}"
    json_path = write_json(out / f"{stem}.json", "ladder", results, rows=rows,
                           configs={n: c.to_dict() for n, c in configs.items()})
    png_path = plot_ladder(rows, out / f"{stem}.png", anchor)
    console.print(f"wrote {json_path} and {png_path}")


# ---------------------------------------------------------------------------------------------
@app.command()
def tune(
    seqlens: str = typer.Option("4096", help="Sequence lengths to tune (one cache entry each)."),
    head_dim: int = typer.Option(128, "--head-dim"),
    dtype: str = typer.Option("bf16", help="bf16 or fp16."),
    tokens: int = typer.Option(16384),
    hidden: int = typer.Option(2048),
    workers: int = typer.Option(0, help="Compile workers (0: one per CPU)."),
    max_timed: int = typer.Option(24, min=1, help="Time at most this many survivors."),
    runs: int = typer.Option(20, min=5),
    wide: bool = typer.Option(False, help="Also vary K/V sub-tiles apart and try pad8."),
    refine: bool = typer.Option(True, help="Then time the best tile with each row-sum chain "
                                "count and K/V walk direction."),
    mode: str = typer.Option("full", help="full, causal or both: the mask of the entries (a "
                             "causal entry also serves sliding windows)."),
    show: bool = typer.Option(False, help="Print the cache and exit."),
    clear: bool = typer.Option(False, help="Empty the cache and exit."),
    family: str = typer.Option("attention", help="attention, or gemm: time GEMM configs at "
                               "--shapes (--dtype bf16, fp16 or int8) and keep each shape's "
                               "best for attnlab.gemm."),
    shapes: str = typer.Option("4096x4096x4096", help="With --family gemm: MxNxK shapes (a "
                               "trailing 't': B as a transposed weight)."),
) -> None:
    """Search kernel configs for this GPU; store the best per problem class in the cache."""
    from attnlab.tune.cache import TuneCache

    cache = TuneCache()
    if show:
        console.print(_cache_table(cache))
        return
    if clear:
        console.print(f"removed {cache.clear()} entries from {cache.path}")
        return
    if family == "gemm":
        from attnlab.cli.gemm import tune_gemm

        tune_gemm(cache, shapes, dtype, runs)
        return
    lengths = parse_ints(seqlens, "--seqlens")
    (dtype_name,) = parse_dtypes(dtype)
    masks = parse_mode(mode)
    require_gpu()
    _run_tuning(cache, lengths, head_dim, dtype_name, tokens, hidden,
                workers or os.cpu_count() or 1, max_timed, runs, wide, refine, masks)


def _run_tuning(cache, lengths, head_dim, dtype_name, tokens, hidden, workers, max_timed,
                runs, wide, refine, masks=(False,)) -> None:
    import tempfile

    import torch

    from attnlab import api, device, dispatch
    from attnlab.analysis.occupancy import current_device_spec
    from attnlab.bench.runner import tokens_grid
    from attnlab.kernel_cache import dsl_version
    from attnlab.policy import default_for
    from attnlab.tune.cache import seqlen_bucket
    from attnlab.tune.search import prune_space, time_candidates
    from attnlab.tune.space import knob_neighbours, search_space

    gpu = device.info(torch.device("cuda"))
    arch = gpu.arch
    space = search_space(wide, arch)
    outcomes = []
    with progress_bar() as progress, tempfile.TemporaryDirectory() as artifacts:
        for causal in masks:
            # A masked problem runs a kernel of its own (registers, spills): prune and time it
            # against its own default.
            label = "causal" if causal else "full"
            task = progress.add_task(f"{label}: compile + prune ({workers} workers)",
                                     total=len(space))
            chosen, summary = prune_space(space, current_device_spec(), arch, dtype_name,
                                          head_dim, Path(artifacts), workers, max_timed,
                                          on_done=lambda t=task: progress.advance(t),
                                          windowed=causal)
            console.print(_summary_table(summary, label))
            for point in tokens_grid(tokens, hidden, lengths, [head_dim], [dtype_name],
                                     causal=(causal,)):
                timing = progress.add_task(f"{label}: time seq {point.seqlen_q}",
                                           total=len(chosen) + 1)
                # The masked default depends on the query length's bucket, as dispatch
                # looks it up (policy.default_for).
                default = default_for(arch, head_dim, windowed=causal, dtype=dtype_name,
                                      seqlen=seqlen_bucket(point.seqlen_q))
                outcome = time_candidates(point, default, chosen, runs=runs,
                                          on_impl=lambda name, t=timing: progress.advance(t))
                if refine:
                    # A second timing round of the best tile's knobs, against the default.
                    around = [c for c in knob_neighbours(outcome.best, arch, head_dim, causal)
                              if c != default]
                    timing = progress.add_task(f"{label}: refine seq {point.seqlen_q}",
                                               total=len(around) + 1)
                    outcome = time_candidates(point, default, around, runs=runs,
                                              on_impl=lambda name, t=timing: progress.advance(t))
                outcomes.append(outcome)
    for outcome in outcomes:
        point = outcome.point
        cache.put(dispatch.tune_key(gpu, dtype_name, head_dim, point.seqlen_q, point.causal),
                  outcome.best, best_ms=outcome.best_ms, default_ms=outcome.default_ms,
                  shape=point.label(), dsl_version=dsl_version())
    path = cache.save()
    dispatch.reload_tune_cache()
    api.forget_calls()
    console.print(_outcome_table(outcomes))
    console.print(f"cache: {path}")


def _summary_table(summary: dict[str, int], label: str) -> Table:
    table = Table(title=f"pruning, {label} kernel (static, from cross-compiled cubins)")
    table.add_column("")
    table.add_column("configs", justify="right")
    for reason, count in summary.items():
        table.add_row(reason, str(count))
    return table


def _outcome_table(outcomes) -> Table:
    table = Table(title="tuned vs default (same run, same inputs)")
    for column in ("problem", "best config", "best ms", "default ms", "speedup"):
        table.add_column(column, justify="right" if column.endswith(("ms", "speedup")) else
                         "left")
    for o in outcomes:
        table.add_row(o.point.label(), o.best.short_name(), f"{o.best_ms:.3f}",
                      f"{o.default_ms:.3f}", f"{o.speedup:.3f}x")
    return table


def _cache_table(cache) -> Table:
    from attnlab.config import FlashConfig
    from attnlab.gemm_config import GemmConfig

    table = Table(title=f"tuning cache {cache.path}")
    for column in ("key", "config", "best ms", "default ms"):
        table.add_column(column)
    for key, entry in sorted(cache.entries.items()):
        knobs = entry["config"]
        cfg = (GemmConfig(**knobs) if key.startswith("gemm|")  # type: ignore[arg-type]
               else FlashConfig.from_dict(knobs))
        table.add_row(key, cfg.short_name(), f"{entry.get('best_ms', float('nan')):.3f}",
                      f"{entry.get('default_ms', float('nan')):.3f}")
    if not cache.entries:
        table.caption = "empty: run `attnlab tune` on a GPU"
    return table
