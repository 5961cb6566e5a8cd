"""``attnlab sass``, ``attnlab banks``, ``attnlab occupancy``: explaining a config, no GPU needed.

Thin commands: resolve the config, cross-compile it when the SASS is needed, and print what
``attnlab.analysis`` computes (rich tables, or ``--json``). Every count is static (build-time).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from attnlab.analysis import banks as bank_model
from attnlab.analysis.control_codes import control_codes
from attnlab.analysis.occupancy import GPU_SPECS, GpuSpec, Occupancy, get_spec, occupancy
from attnlab.analysis.resources import Resources, kernel_resources
from attnlab.analysis.sass import DiffRow, Instruction, SassReport, build_report, diff, parse
from attnlab.analysis.sass import disassemble as disassemble_cubin
from attnlab.analysis.tools import ToolNotFound
from attnlab.cli import app
from attnlab.cli.measure import OUT_OPTION
from attnlab.compile import DEFAULT_ARTIFACT_DIR, compile_config, compile_spec
from attnlab.config import (
    SMEM_CAPACITY,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    ConfigError,
    FlashConfig,
)
from attnlab.conv.ladder import CONV_STEPS
from attnlab.gemm.ladder import GEMM_STEPS
from attnlab.gemm.online import ONLINE_CONFIG
from attnlab.gemm.sparse import SPARSE_CONFIG
from attnlab.gemm_config import GemmConfig, MmaGemmConfig
from attnlab.kernels.conv.abi import ImplicitConvSpec
from attnlab.kernels.gemm.abi import GemmSpec
from attnlab.ladder import resolve

#: The mma.sync kernel's library forms by name, at their default tiles.
MMA_SYNC_FORMS = {"sparse24": SPARSE_CONFIG, "online_int8": ONLINE_CONFIG}

STATIC = "static (build-time) counts: each instruction once, however often it runs"

CONFIG_ARG = typer.Argument(..., metavar="CONFIG",
                            help="A ladder name (k01..k16, pad8, ...), a FlashConfig JSON file, "
                            "or a GEMM config: gemm[:BMxBNxBK], igemm[:BMxBNxBK] (sm_90a), "
                            "a GEMM ladder step g01..g09, the mma.sync kernel's sparse24 "
                            "(2:4 sparse A) or online_int8; or an implicit-GEMM "
                            "convolution: conv[:BMxBNxBK] (3 x 3, stride 1, padding 1, "
                            "bias) or a conv ladder step c03..c06.")
VS_OPTION = typer.Option(None, "--vs", metavar="CONFIG2", help="A second config to compare.")
ARCH_OPTION = typer.Option("sm_90a", "--arch", help=f"Target: {', '.join(SMEM_CAPACITY)}.")
DTYPE_OPTION = typer.Option("bfloat16", "--dtype", help="float16 or bfloat16.")
HEAD_DIM_OPTION = typer.Option(128, "--head-dim", help="Head dimension: "
                               f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))}.")
JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of tables.")
MASKED_OPTION = typer.Option(False, "--masked",
                             help="An attention config's causal / sliding-window kernel (the "
                             "mask's code and registers are its own).")
ARTIFACTS_OPTION = typer.Option(None, "--artifacts",
                                help="Folder for the cubins (default: a cache in the temp dir).")


def _console() -> Console:
    # Markup off: control codes such as [B-12---:R-:W-:-:S08] are not rich tags.
    return Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 140)


def _choice(value: str, choices: Sequence[str], hint: str) -> None:
    if value not in choices:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}", param_hint=hint)


def _resolve(spec: str, hint: str) -> tuple[str, FlashConfig | GemmConfig | MmaGemmConfig]:
    """A config and its label from a ladder name, a JSON file, a GEMM name
    (``gemm[:BMxBNxBK]``, ``igemm[:...]``, a GEMM ladder step ``g01``..``g09``) or an
    implicit-GEMM convolution (``conv[:BMxBNxBK]``: 3 x 3, stride 1, padding 1, with a bias;
    a conv ladder step ``c03``..``c06``), or a clear error."""
    try:
        if spec.split(":")[0] in ("gemm", "igemm"):
            return spec, GemmConfig.from_name(spec)[0]
        if spec.split(":")[0] == "conv":
            return spec, GemmConfig.from_name("gemm" + spec.removeprefix("conv"))[0]
        if spec in GEMM_STEPS:
            return spec, GEMM_STEPS[spec][0]
        if spec in MMA_SYNC_FORMS:
            return spec, MMA_SYNC_FORMS[spec]
        if spec in CONV_STEPS:
            options = CONV_STEPS[spec][0]
            if "config" not in options:
                raise ValueError(f"{spec} ({options['algorithm']}) is not an implicit-GEMM "
                                 f"step: the explain tools take c03-c06 (its GEMM is gemm)")
            return spec, options["config"]
        config = resolve(spec)
    except (KeyError, ConfigError, TypeError, ValueError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
        raise typer.BadParameter(message, param_hint=hint) from None
    return (Path(spec).stem if spec.endswith(".json") else spec), config


def _gpu(name: str) -> GpuSpec:
    try:
        return get_spec(name)
    except KeyError as exc:
        raise typer.BadParameter(exc.args[0], param_hint="--gpu") from None


@dataclass(frozen=True)
class _Kernel:
    """One compiled config and everything the commands print about it."""

    label: str
    config: FlashConfig | GemmConfig | MmaGemmConfig
    instructions: list[Instruction]
    report: SassReport
    resources: Resources


def _build(spec: str, hint: str, arch: str, dtype: str, head_dim: int,
           artifacts: Path | None, masked: bool = False) -> _Kernel:
    """Resolve, cross-compile (with a spinner) and analyse one config (``masked``: an
    attention config's causal / sliding-window kernel)."""
    label, config = _resolve(spec, hint)
    if masked and not isinstance(config, FlashConfig):
        raise typer.BadParameter("--masked selects an attention kernel's masked variant; "
                                 f"{label} is not an attention config", param_hint=hint)
    try:
        config.check_problem(head_dim, arch)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    with Console(stderr=True).status(f"compiling {label} for {arch} (CuTe DSL, ~2 s) ..."):
        if label.startswith("conv") or label in CONV_STEPS:
            # The TMA kernel with its bias epilogue; the mma.sync one has none.
            built = compile_spec(ImplicitConvSpec(config, arch, dtype,
                                                  bias=isinstance(config, GemmConfig)),
                                 artifacts)
        elif isinstance(config, GemmConfig | MmaGemmConfig):
            # INT8 writes a 16-bit C: the HGEMM's dtype option names it.
            in_dtype = "int8" if label.startswith("igemm") else dtype
            # The s8 wgmma and the mma.sync ladder read B K-major (a transposed weight).
            b_major = ("k" if in_dtype == "int8" or isinstance(config, MmaGemmConfig)
                       else "n")
            built = compile_spec(GemmSpec(config, arch, in_dtype, dtype, "k", b_major,
                                          dequant="scale" if in_dtype == "int8" else "none",
                                          sparse=label == "sparse24",
                                          online_int8=label == "online_int8"),
                                 artifacts)
        else:
            built = compile_config(config, arch, dtype=dtype, head_dim=head_dim,
                                   windowed=masked, out_dir=artifacts)
    try:
        text = disassemble_cubin(built.cubin, encodings=True)
        resources = kernel_resources(built, text)
    except ToolNotFound as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=1) from None
    instructions = parse(text)
    return _Kernel(label, config, instructions,
                   build_report(instructions, label=label, arch=arch, sass_text=text),
                   resources)


def _occupancy(kernel: _Kernel, gpu: GpuSpec) -> Occupancy:
    return occupancy(gpu, kernel.config.num_threads, kernel.resources.registers,
                     kernel.resources.shared_bytes)


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
Cell = float | int | str


def _fmt(value: Cell) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def _table(title: str, key: str, labels: Sequence[str],
           rows: Sequence[tuple[str, Sequence[Cell]]], *, ratios: bool = True) -> Table:
    """One row per statistic, one column per kernel; with two kernels (and ``ratios``), Δ and
    the ratio (second / first) of the numeric rows too."""
    table = Table(title=title, title_justify="left")
    table.add_column(key, no_wrap=True)
    for label in labels:
        table.add_column(label, justify="right")
    compare = ratios and len(labels) == 2
    if compare:
        table.add_column("Δ", justify="right")
        table.add_column("ratio", justify="right")
    for name, values in rows:
        cells = [_fmt(v) for v in values]
        if compare:
            if all(isinstance(v, int | float) for v in values):
                row = DiffRow("", name, *values)  # type: ignore[arg-type]
                cells += [f"{row.delta:+g}", "-" if row.ratio is None else f"{row.ratio:.2f}x"]
            else:
                cells += ["", ""]
        table.add_row(name, *cells)
    return table


def _diff_rows(rows: list[DiffRow], section: str) -> list[tuple[str, list[Cell]]]:
    return [(row.name, [row.a, row.b]) for row in rows if row.section == section]


def _stall_text(counts: dict[int, int], shown: int = 4) -> str:
    """``{8: 48, 1: 47, ...}`` -> ``"S08x48 S01x47 ..."``, the most frequent first."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = " ".join(f"S{stall:02d}x{n}" for stall, n in ordered[:shown])
    return text + (" ..." if len(ordered) > shown else "")


def _interval_text(intervals: dict[int, int]) -> str:
    if not intervals:
        return "-"
    shortest = min(intervals)
    return f"min {shortest} ({intervals[shortest]} of {sum(intervals.values())} at min)"


def _stall_rows(kernels: Sequence[_Kernel], top: int) -> list[tuple[str, list[Cell]]]:
    opcodes = list(kernels[0].report.stalls)[:top]
    rows: list[tuple[str, list[Cell]]] = [
        (op, [_stall_text(k.report.stalls.get(op, {})) for k in kernels]) for op in opcodes]
    rows.append(("HMMA -> HMMA cycles",
                 [_interval_text(k.report.hmma_intervals) for k in kernels]))
    return rows


def _resource_rows(kernels: Sequence[_Kernel], gpu: GpuSpec) -> list[tuple[str, list[Cell]]]:
    res = [k.resources for k in kernels]
    occ = [_occupancy(k, gpu) for k in kernels]
    return [
        ("registers/thread", [r.registers for r in res]),
        ("stack frame (bytes)", [r.stack_bytes for r in res]),
        ("spill stores (STL)", [r.spill_stores for r in res]),
        ("spill loads (LDL)", [r.spill_loads for r in res]),
        ("static smem (bytes)", [r.static_shared_bytes for r in res]),
        ("dynamic smem (bytes)", [r.dynamic_shared_bytes for r in res]),
        (f"CTAs/SM on {gpu.name}", [o.ctas_per_sm for o in occ]),
        ("warps/SM", [o.warps_per_sm for o in occ]),
        ("occupancy %", [round(o.occupancy_pct, 1) for o in occ]),
        ("limited by", [", ".join(o.limited_by) for o in occ]),
    ]


def _print_controls(console: Console, kernel: _Kernel) -> None:
    console.print(f"\nControl codes of {kernel.label} ({kernel.report.arch}):")
    for instr, code in control_codes(kernel.instructions):
        console.print(f"  {instr.address:05x}  {code}  {instr.predicate:>5} {instr.opcode} "
                      f"{instr.operands}")


# ---------------------------------------------------------------------------------------------
# attnlab sass
# ---------------------------------------------------------------------------------------------
GPU_OPTION = typer.Option("H100", "--gpu", help=f"Occupancy on: {', '.join(GPU_SPECS)}, current.")
TOP_OPTION = typer.Option(15, "--top", min=1, help="Opcode rows to show.")
CONTROLS_OPTION = typer.Option(False, "--controls",
                               help="Also list every instruction with its control code.")


@app.command()
def sass(
    config: str = CONFIG_ARG,
    vs: str | None = VS_OPTION,
    arch: str = ARCH_OPTION,
    dtype: str = DTYPE_OPTION,
    head_dim: int = HEAD_DIM_OPTION,
    gpu: str = GPU_OPTION,
    top: int = TOP_OPTION,
    controls: bool = CONTROLS_OPTION,
    masked: bool = MASKED_OPTION,
    as_json: bool = JSON_OPTION,
    artifacts: Path | None = ARTIFACTS_OPTION,
) -> None:
    """Static SASS of a config: instruction groups, the seeds' evidence, control codes,
    resources and occupancy; with --vs, side by side with ratios."""
    _choice(arch, list(SMEM_CAPACITY), "--arch")
    _choice(dtype, SUPPORTED_DTYPES, "--dtype")
    spec = _gpu(gpu)
    kernels = [_build(config, "CONFIG", arch, dtype, head_dim, artifacts, masked)]
    if vs is not None:
        kernels.append(_build(vs, "--vs", arch, dtype, head_dim, artifacts, masked))
    rows = diff(kernels[0].report, kernels[1].report) if vs is not None else None

    if as_json:
        payload: dict[str, object] = {"counts": "static (build-time)", "arch": arch,
                                      "dtype": dtype, "head_dim": head_dim, "masked": masked,
                                      "kernels": [
            {"label": k.label, "config": k.config.to_dict(), "sass": k.report.to_dict(),
             "resources": k.resources.to_dict(),
             "occupancy": _occupancy(k, spec).to_dict()} for k in kernels]}
        if rows is not None:
            payload["diff"] = [row.to_dict() for row in rows]
        if controls:
            for entry, k in zip(payload["kernels"], kernels, strict=True):  # type: ignore[arg-type]
                entry["controls"] = [{"address": i.address, "instruction": f"{i.opcode} "
                                      f"{i.operands}", **code.to_dict()}
                                     for i, code in control_codes(k.instructions)]
        typer.echo(json.dumps(payload, indent=2))
        return

    console = _console()
    labels = [k.label for k in kernels]
    for k in kernels:
        console.print(f"{k.label}: {k.config.short_name()}")
    problem = ("" if isinstance(kernels[0].config, GemmConfig | MmaGemmConfig)
               else f", head_dim {head_dim}{', masked' if masked else ''}")
    console.print(f"{arch}, {dtype}{problem}; {STATIC}\n")
    if rows is None:
        report = kernels[0].report
        console.print(_table("Instruction groups", "group", labels,
                             [(n, [v]) for n, v in report.groups.items()]))
        console.print(_table("Seed evidence", "statistic", labels,
                             [(n, [v]) for n, v in report.evidence().items()]))
        console.print(_table(f"Top {top} opcodes", "opcode (with modifiers)", labels,
                             [(n, [v]) for n, v in
                              list(report.opcodes_with_modifiers.items())[:top]]))
    else:
        console.print(_table("Instruction groups", "group", labels, _diff_rows(rows, "group")))
        console.print(_table("Seed evidence", "statistic", labels,
                             _diff_rows(rows, "evidence")))
        moved = sorted((r for r in rows if r.section == "opcode" and r.delta),
                       key=lambda r: -abs(r.delta))[:top]
        console.print(_table("Largest opcode changes (with modifiers)", "opcode", labels,
                             [(r.name, [r.a, r.b]) for r in moved]))
    console.print(_table("Stall cycles per opcode (decoded control codes)", "opcode", labels,
                         _stall_rows(kernels, 6), ratios=False))
    console.print(_table(f"Resources and occupancy ({spec.name}; registers from {arch})",
                         "resource", labels, _resource_rows(kernels, spec)))
    for k in kernels:
        console.print(f"next cliff ({k.label}): {_occupancy(k, spec).next_cliff}")
    if controls:
        for k in kernels:
            _print_controls(console, k)


# ---------------------------------------------------------------------------------------------
# attnlab banks
# ---------------------------------------------------------------------------------------------
TRADEOFF_GPU_OPTION = typer.Option(
    None, "--gpu", help="With --vs: predict CONFIG2's speedup over CONFIG on this GPU from "
    "their conflicts and occupancy (seed 004's Observation O trade-off; compiles both).")


@app.command()
def banks(
    config: str = CONFIG_ARG,
    vs: str | None = VS_OPTION,
    head_dim: int = HEAD_DIM_OPTION,
    as_json: bool = JSON_OPTION,
    gpu: str | None = TRADEOFF_GPU_OPTION,
    artifacts: Path | None = ARTIFACTS_OPTION,
) -> None:
    """Static bank-conflict model of every shared-memory access of a config: wavefronts per
    instruction (ideal in brackets) and conflict ways per phase."""
    specs = [(config, "CONFIG")] + ([(vs, "--vs")] if vs is not None else [])
    configs = [_resolve(spec, hint) for spec, hint in specs]
    stats = []
    for (_, cfg), (_, hint) in zip(configs, specs, strict=True):
        try:
            if isinstance(cfg, MmaGemmConfig):  # a GEMM ladder step or the conv's c03
                stats.append(bank_model.gemm_from_config(cfg))
                continue
            if isinstance(cfg, GemmConfig):
                raise ConfigError("the bank model covers mma.sync kernels; the wgmma GEMM's "
                                  "tiles are written by TMA and read by wgmma (swizzled)")
            cfg.check_problem(head_dim)
            stats.append(bank_model.from_config(cfg, head_dim))
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint=hint) from None
    labels = [label for label, _ in configs]

    if as_json:
        typer.echo(json.dumps({"head_dim": head_dim, "kernels": [
            {"label": label, "config": cfg.to_dict(), "accesses": [s.to_dict() for s in st]}
            for (label, cfg), st in zip(configs, stats, strict=True)]}, indent=2))
        return

    console = _console()
    for (label, cfg), st in zip(configs, stats, strict=True):
        console.print(f"{label}: {cfg.short_name()}; smem layout: {st[0].layout}")
    problem = (f" (head_dim {head_dim})" if any(isinstance(cfg, FlashConfig)
                                                 for _, cfg in configs) else "")
    table = Table(title=f"Shared-memory wavefronts per warp instruction, ideal in brackets"
                        f"{problem}", title_justify="left")
    table.add_column("access", no_wrap=True)
    table.add_column("instr/warp", justify="right")
    for label in labels:
        table.add_column(f"{label} wavefronts", justify="right", no_wrap=True)
        table.add_column(f"{label} ways/phase", justify="right", no_wrap=True)
    if len(labels) == 2:
        table.add_column("ratio", justify="right")
    for per_kernel in zip(*stats, strict=True):
        cells = [" / ".join(dict.fromkeys(str(s.instructions) for s in per_kernel))]
        for s in per_kernel:
            cells += [f"{s.wavefronts_per_instruction:g} ({s.ideal_per_instruction:g})",
                      "/".join(map(str, s.phase_ways))]
        if len(per_kernel) == 2:
            first, second = per_kernel
            ratio = second.wavefronts_per_instruction / first.wavefronts_per_instruction
            cells.append(f"{ratio:.3g}x")
        table.add_row(per_kernel[0].name, *cells)
    console.print(table)
    console.print("ideal: one wavefront per phase. ways/phase: wavefronts of each phase of one "
                  "instruction; 1 = conflict-free, 8 = the seeds' 8-way conflicts. Static model.")
    if gpu is not None and vs is not None:
        _print_tradeoff(console, [spec for spec, _ in specs], _gpu(gpu), head_dim, artifacts)


def _print_tradeoff(console: Console, names: list[str], gpu: GpuSpec, head_dim: int,
                    artifacts: Path | None) -> None:
    from attnlab.analysis.padding import layout_cost, pad_tradeoff

    arch = _compile_arch(gpu)
    built = [_build(name, hint, arch, "bfloat16", head_dim, artifacts)
             for name, hint in zip(names, ("CONFIG", "--vs"), strict=True)]
    costs = [layout_cost(k.label, k.config, head_dim, gpu, k.resources.registers,
                         k.resources.shared_bytes) for k in built]
    prediction = pad_tradeoff(*costs, gpu)
    table = Table(title=f"Observation O's trade-off on {gpu.name} ({arch}): per warp and K/V "
                  "block", title_justify="left")
    for column in ("config", "warps/SM", "smem wavefronts", "MMAs", "modelled cycles",
                   "limited by"):
        table.add_column(column, justify="left" if column in ("config", "limited by")
                         else "right")
    for c in costs:
        table.add_row(c.label, str(c.warps_per_sm), str(c.wavefronts), str(c.mmas),
                      f"{c.cycles:.0f}", c.limited_by)
    console.print(table)
    console.print(f"predicted speedup of {costs[1].label} over {costs[0].label}: "
                  f"{prediction.speedup:.2f}x (a screening model: analysis/padding.py)")


# ---------------------------------------------------------------------------------------------
# attnlab occupancy
# ---------------------------------------------------------------------------------------------
def _compile_arch(gpu: GpuSpec) -> str:
    """The target to build for a GPU: Hopper parts get the arch-specific sm_90a."""
    return "sm_90a" if gpu.arch == "sm_90" else gpu.arch


GPUS_OPTION = typer.Option(None, "--gpu", help="GPU(s) to show (repeatable); default: all of "
                           f"{', '.join(GPU_SPECS)}.")
OWN_ARCH_OPTION = typer.Option(None, "--arch", help="Build target for the register count; "
                               "default: each GPU's own.")


@app.command("occupancy")
def occupancy_command(
    config: str = CONFIG_ARG,
    gpu: list[str] | None = GPUS_OPTION,
    arch: str | None = OWN_ARCH_OPTION,
    dtype: str = DTYPE_OPTION,
    head_dim: int = HEAD_DIM_OPTION,
    masked: bool = MASKED_OPTION,
    as_json: bool = JSON_OPTION,
    artifacts: Path | None = ARTIFACTS_OPTION,
) -> None:
    """CTAs and warps per SM of a config on each GPU, the binding limit and the next cliff."""
    if arch is not None:
        _choice(arch, list(SMEM_CAPACITY), "--arch")
    _choice(dtype, SUPPORTED_DTYPES, "--dtype")
    gpus = [_gpu(name) for name in gpu] if gpu else list(GPU_SPECS.values())
    built: dict[str, _Kernel] = {}
    results = []
    for spec in gpus:
        target = arch or _compile_arch(spec)
        if target not in built:
            built[target] = _build(config, "CONFIG", target, dtype, head_dim, artifacts,
                                   masked)
        results.append((spec, target, _occupancy(built[target], spec)))

    if as_json:
        typer.echo(json.dumps([{"gpu": spec.to_dict(), "arch": target,
                                "resources": built[target].resources.to_dict(),
                                **occ.to_dict()} for spec, target, occ in results], indent=2))
        return
    console = _console()
    kernel = next(iter(built.values()))
    console.print(f"{kernel.label}: {kernel.config.short_name()}; {kernel.config.num_threads} "
                  f"threads/CTA, {kernel.resources.shared_bytes} bytes smem/CTA\n")
    table = Table(title="Occupancy per SM", title_justify="left")
    for column in ("GPU", "arch", "regs", "CTAs/SM", "warps/SM", "occupancy", "limited by",
                   "limits (CTAs: regs/smem/warps/slots)"):
        table.add_column(column)
    for spec, target, occ in results:
        table.add_row(spec.name, target, str(built[target].resources.registers),
                      str(occ.ctas_per_sm), f"{occ.warps_per_sm}/{spec.max_warps_per_sm}",
                      f"{occ.occupancy_pct:.1f}%", ", ".join(occ.limited_by),
                      "/".join(str(v) for v in occ.limits.values()))
    console.print(table)
    for spec, _, occ in results:
        console.print(f"next cliff on {spec.name}: {occ.next_cliff}")


FAMILY_OPTION = typer.Option(None, "--family", help="Audit only this family (repeatable); "
                             "default all.")


@app.command("audit")
def audit_command(
    arch: str = ARCH_OPTION,
    family: list[str] | None = FAMILY_OPTION,
    artifacts: Path | None = ARTIFACTS_OPTION,
    out: Path = OUT_OPTION,
) -> None:
    """Every kernel attnlab builds for ARCH, cross-compiled: useful_pct, registers and spills
    per kernel and per family (seed 004's Observations AA and CC), as a table, JSON and PNG."""
    from attnlab.analysis.audit import inventory, plot, run_audit, summarize
    from attnlab.cli.measure import progress_bar

    _choice(arch, list(SMEM_CAPACITY), "--arch")
    known = inventory(arch)
    chosen = family or list(known)
    for name in chosen:
        _choice(name, list(known), "--family")
    from attnlab.kernel_cache import fingerprint

    # Under the sources' fingerprint, as compile_config keeps them: an edit compiles anew.
    folder = artifacts if artifacts is not None else DEFAULT_ARTIFACT_DIR / fingerprint()
    total = sum(len(known[name]) for name in chosen)
    with progress_bar() as progress:
        task = progress.add_task(f"cross-compiling for {arch}", total=total)
        rows = run_audit(arch, folder, chosen, lambda _: progress.advance(task))
    console = _console()
    table = Table(title=f"static audit, {arch}: useful_pct (Observation AA), registers and "
                  "spills (CC)", title_justify="left")
    for column in ("family", "kernels", "useful_pct mean", "median", "max", "registers max",
                   "kernels that spill"):
        table.add_column(column, justify="left" if column == "family" else "right")
    for s in summarize(rows):
        table.add_row(s.family, str(s.kernels), f"{s.useful_pct_mean:.1f}",
                      f"{s.useful_pct_median:.1f}", f"{s.useful_pct_max:.1f}",
                      str(s.registers_max), str(s.spilling))
    console.print(table)
    spills = sorted((r for r in rows if r.spill_stores), key=lambda r: -r.spill_stores)
    for r in spills[:10]:
        console.print(f"spills: {r.label} ({r.family}): {r.spill_stores} stores, "
                      f"{r.spill_loads} loads, {r.registers} registers")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"audit_{arch}.json").write_text(json.dumps(
        {"arch": arch, "counts": "static (build-time)",
         "families": [s.__dict__ for s in summarize(rows)],
         "kernels": [r.to_dict() for r in rows]}, indent=1))
    console.print(f"wrote {out / f'audit_{arch}.json'} and "
                  f"{plot(rows, out / f'audit_{arch}.png')}")
