"""Benchmark results as a person reads them: rich tables, a JSON file, PNG plots."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

from attnlab.bench.runner import REFERENCE, Point, Result, harmonic_mean, ratios

#: 2 added the device-only timing beside the end-to-end one; files of schema 1 (end to end
#: unknown: their ``timing`` was device only) still load, as device-only results.
SCHEMA_VERSION = 2
#: Bench plot panels per row: one row per dtype for the default grid (2 head dims x 2 masks).
PANELS_PER_ROW = 4


# ---------------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------------
def impl_names(results: Sequence[Result]) -> list[str]:
    """Implementations in first-seen order."""
    return list(dict.fromkeys(r.impl for r in results))


def one_line(label: str, results: Sequence[Result]) -> str:
    """A point's results on one line: ``label: impl e2e(device) ...`` (the sweep scripts'
    progress output)."""
    cells = "  ".join(f"{r.impl} {r.tflops:.0f}({r.device_tflops:.0f})" if r.tflops
                      else f"{r.impl} failed: {(r.error or '')[:80]}" for r in results)
    return f"{label}: {cells}"


def bench_table(results: Sequence[Result], title: str, reference: str = REFERENCE) -> Table:
    """One row per point: TFLOP/s of each implementation end to end (device only in
    parentheses), and each one's ratio to ``reference``, the same two ways."""
    names = impl_names(results)
    by_key = {(r.point, r.impl): r for r in results}
    ratio = ratios(results, reference)
    device_ratio = ratios(results, reference, device=True)
    table = Table(title=title, caption="end to end (device only)")
    table.add_column("problem")
    for name in names:
        table.add_column(f"{name}\nTFLOP/s", justify="right")
    for name in names:
        if name != reference:
            table.add_column(f"{name}\n/ {reference}", justify="right")
    for point in dict.fromkeys(r.point for r in results):
        cells = [point.label()]
        for name in names:
            r = by_key.get((point, name))
            cells.append(f"{r.tflops:.0f} ({r.device_tflops:.0f})" if r and r.tflops
                         and r.device_tflops else "[red]failed[/red]")
        for name in names:
            if name != reference:
                value, dev = ratio.get((point, name)), device_ratio.get((point, name))
                cells.append("" if value is None or dev is None
                             else f"{_ratio_text(value)} ({dev:.2f})")
        table.add_row(*cells)
    return table


def _ratio_text(value: float) -> str:
    color = "green" if value >= 1.0 else "yellow" if value >= 0.9 else "red"
    return f"[{color}]{value:.3f}x[/{color}]"


def plot_bench(results: Sequence[Result], path: Path) -> Path:
    """TFLOP/s vs seqlen, one line per implementation, one panel per (dtype, hd, mask,
    work)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r.point.dtype, r.point.head_dim, r.point.mask, r.point.work)
                                for r in results))
    cols = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (dtype, head_dim, mask, work) in zip(axes.flat, panels, strict=False):
        for name in impl_names(results):
            pts = sorted((r.point.seqlen_q, r.tflops) for r in results
                         if r.impl == name and r.tflops and r.point.dtype == dtype
                         and r.point.head_dim == head_dim and r.point.mask == mask
                         and r.point.work == work)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name,
                        linewidth=2.5 if name.startswith("attnlab") else 1.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        what = "" if work == "forward" else f", {work}"
        shown = f", window {mask}" if isinstance(mask, tuple) else ", causal" if mask else ""
        ax.set_title(f"{dtype}, head dim {head_dim}{shown}{what}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def host_table(results: Sequence[object], first_call: dict[str, float], title: str) -> Table:
    """Microseconds per call on small problems (``bench.host``), and the first-call seconds."""
    table = Table(title=title, caption=(
        "first call of a fresh process: "
        f"{first_call['cold_compile_first_call_s']:.2f} s compiling, "
        f"{first_call['warm_disk_cache_first_call_s']:.3f} s from the disk cache "
        f"(import attnlab {first_call['warm_disk_cache_import_s']:.3f} s)"))
    for column in ("problem", "implementation", "host us/call", "end to end us/call",
                   "device us/call"):
        table.add_column(column, justify="left" if column in ("problem", "implementation")
                         else "right")
    for r in results:
        cells = [f"{v:.1f}" if v is not None else "[red]failed[/red]"
                 for v in (r.host_us, r.end_to_end_us, r.device_us)]
        table.add_row(r.point.label(), r.impl, *cells)
    return table


# ---------------------------------------------------------------------------------------------
# ladder
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LadderRow:
    """One ladder step: its percent of the reference at the anchor seqlen and over all seqlens."""

    name: str
    step: str
    pct_at_anchor: float | None
    harmonic_mean_pct: float | None
    delta_pct: float | None  # change of pct_at_anchor from the previous step, in points


def ladder_rows(results: Sequence[Result], steps: dict[str, str], anchor: int = 4096,
                bases: dict[str, str] | None = None, *, device: bool = False
                ) -> list[LadderRow]:
    """Percent of the reference per config, in ``steps`` order, end to end (or with
    ``device``, device only). Each row's delta is against the previous row, or against
    ``bases[name]`` for a variant of a step (lab variants)."""
    ratio = ratios(results, device=device)
    bases = bases or {}
    rows, at = [], {}
    previous = None
    for name, step in steps.items():
        per_seq = {p.seqlen_q: v * 100 for (p, impl), v in ratio.items() if impl == name}
        at[name] = per_seq.get(anchor)
        hmean = harmonic_mean(list(per_seq.values())) if per_seq else None
        base = at.get(bases[name]) if name in bases else previous
        delta = None if at[name] is None or base is None else at[name] - base
        rows.append(LadderRow(name, step, at[name], hmean, delta))
        if name not in bases and at[name] is not None:
            previous = at[name]
    return rows


def reference_tflops(results: Sequence[Result], anchor: int = 4096) -> float | None:
    for r in results:
        if r.impl == REFERENCE and r.point.seqlen_q == anchor and r.tflops:
            return r.tflops
    return None


def ladder_table(rows: Sequence[LadderRow], ref_tflops: float | None, title: str,
                 anchor: int = 4096) -> Table:
    """The seed repository's table: iteration, % of reference at the anchor, harmonic mean."""
    table = Table(title=title)
    table.add_column("kernel")
    table.add_column("iteration")
    table.add_column(f"% of ref @ {anchor}", justify="right")
    table.add_column("Δ vs its base (ladder.BASES)", justify="right")
    table.add_column("harmonic mean %", justify="right")
    for row in rows:
        table.add_row(row.name, row.step, _pct(row.pct_at_anchor),
                      "" if row.delta_pct is None else f"{row.delta_pct:+.1f}",
                      _pct(row.harmonic_mean_pct))
    table.add_row(REFERENCE, "reference (TFLOP/s)",
                  "" if ref_tflops is None else f"{ref_tflops:.1f}", "", "", style="bold")
    return table


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def plot_ladder(rows: Sequence[LadderRow], path: Path, anchor: int = 4096) -> Path:
    """Bars: percent of the reference per step, at the anchor seqlen and as a harmonic mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(rows) + 2), 4.2))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r.pct_at_anchor or 0 for r in rows], width,
           label=f"% of {REFERENCE} @ seq {anchor}")
    ax.bar([x + width / 2 for x in xs], [r.harmonic_mean_pct or 0 for r in rows], width,
           label="harmonic mean over seqlens")
    ax.axhline(100, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("% of reference")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------
def environment() -> dict[str, object]:
    """What the numbers were measured on."""
    import torch

    from attnlab.kernel_cache import dsl_version

    env: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version(),
                              "cutlass_dsl": dsl_version()}
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    return env


def write_json(path: Path, kind: str, results: Sequence[Result], **extra: object) -> Path:
    """``{"schema": 2, "kind": ..., "environment": ..., "results": [...], ...extra}``."""
    payload = {"schema": SCHEMA_VERSION, "kind": kind, "environment": environment(),
               "reference": REFERENCE, "results": [r.to_dict() for r in results]}
    payload.update({k: [asdict(x) for x in v] if isinstance(v, list) else v
                    for k, v in extra.items()})
    path.write_text(json.dumps(payload, indent=1))
    return path


def load_results(path: Path) -> list[Result]:
    """Results back from a JSON file written by ``write_json``."""
    from attnlab.bench.timing import Timing

    payload = json.loads(Path(path).read_text())
    schema = payload.get("schema")
    if schema not in (1, SCHEMA_VERSION):
        raise ValueError(f"{path}: unsupported schema {schema!r}")

    def timing(r: dict, field: str) -> Timing | None:
        return Timing(**r[field]) if r.get(field) else None

    if schema == 1:
        return [Result(Point(**r["point"]), r["impl"], None, r["error"], timing(r, "timing"))
                for r in payload["results"]]
    return [Result(Point(**r["point"]), r["impl"], timing(r, "timing"), r["error"],
                   timing(r, "device_timing")) for r in payload["results"]]
