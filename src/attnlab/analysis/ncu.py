"""Nsight Compute on one launch of a kernel: the seeds' metric sets, side by side.

``profile`` runs ``ncu --clock-control none`` (the clocks are left as found) on a child Python
process that launches the target exactly once (``attnlab.bench.profile_target``), filtered
to the target's kernel by name, and parses ncu's raw CSV page.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.analysis.tools import find_tool

#: The seeds' evidence, grouped as the reports show it.
METRIC_SETS: dict[str, dict[str, str]] = {
    "time": {
        "duration_ns": "gpu__time_duration.sum",
        "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
        # With the clocks left as found, a kernel that draws more power may run slower
        # clocks: its SM clock is these cycles over the duration (``derived``).
        "sm_cycles_elapsed": "sm__cycles_elapsed.avg",
    },
    # A causal grid's tail: SMs idle while the last CTAs run show as avg well below max.
    "balance over SMs": {
        "sm_active_cycles_avg": "sm__cycles_active.avg",
        "sm_active_cycles_max": "sm__cycles_active.max",
        "issue_active_pct": "sm__inst_issued.avg.pct_of_peak_sustained_active",
    },
    "shared memory (seed 001)": {
        "bank_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "bank_conflicts_st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
        "wavefronts_ld": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
        "wavefronts_st": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
        "shared_ld_instructions": "smsp__inst_executed_op_shared_ld.sum",
        "shared_st_instructions": "smsp__inst_executed_op_shared_st.sum",
        "ldsm_instructions": "smsp__inst_executed_op_ldsm.sum",
    },
    "pipes (seed 003)": {
        "tensor_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "fma_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
        "alu_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
        "fp32_instructions": "smsp__sass_thread_inst_executed_op_fp32_pred_on.sum",
        "instructions": "smsp__inst_executed.sum",
    },
    "stalls per issued instruction (seed 001)": {
        f"stall_{reason}": f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
        for reason in ("short_scoreboard", "long_scoreboard", "mio_throttle", "barrier",
                       "math_pipe_throttle", "wait", "not_selected", "lg_throttle",
                       "sleeping", "membar", "dispatch_stall", "no_instruction",
                       "branch_resolving", "selected")
    },
    "memory": {
        "dram_read_bytes": "dram__bytes_read.sum",
        "dram_write_bytes": "dram__bytes_write.sum",
        "l2_bytes": "lts__t_bytes.sum",
        # Observation Z: a ratio metric under cp.async, checked against raw counts.
        "ldgsts_instructions": "smsp__inst_executed_op_ldgsts.sum",
        "l2_to_l1_read_bytes": "l1tex__m_xbar2l1tex_read_bytes.sum",
        "l1_hit_rate_pct": "l1tex__t_sector_hit_rate.pct",
    },
    "instructions by opcode (seed 003)": {
        "per_opcode_with_modifier": "sass__inst_executed_per_opcode_with_modifier_all",
    },
}

#: Opcodes (with modifiers) shown in the table: the seeds' scalar-overhead suspects.
OPCODES_SHOWN = ("HMMA.16816.F32.BF16", "HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4",
                 "FFMA", "FMUL", "FADD", "MUFU.EX2", "IMAD.MOV.U32", "MOV", "IMAD.SHL.U32",
                 "LOP3.LUT", "SHF.L.U32", "IADD3", "CS2R", "BAR.SYNC.DEFER_BLOCKING")

#: Kernel-name filters (ncu's ``regex:``) for each profiled implementation.
#: Each runs in its own process, so a filter only has to skip that process's input kernels.
KERNEL_FILTERS = {"attnlab": "regex:kernel_cutlass_kernel_attnlab", "sdpa_flash": "regex:flash",
                  "sdpa_cudnn": "regex:cudnn|sdpa", "fa4": "regex:flash",
                  "cublas": "regex:gemm|nvjet|xmma", "cudnn": "regex:fprop|conv|xmma"}


class ProfilerUnavailable(RuntimeError):
    """ncu is missing or cannot read the counters on this machine (said plainly, with why)."""


@dataclass
class KernelProfile:
    """One launch profiled: kernel name and the metrics by our short names."""

    impl: str
    kernel: str
    metrics: dict[str, float | str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"impl": self.impl, "kernel": self.kernel, "metrics": self.metrics}


def all_metrics() -> dict[str, str]:
    return {short: name for group in METRIC_SETS.values() for short, name in group.items()}


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw`` (header, then a units row, then one row per kernel)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return []
    header = rows[0]
    return [dict(zip(header, row, strict=False)) for row in rows[2:]]


_INSTANCE = re.compile(r"([A-Z][A-Z0-9_.]*)\s*:\s*([0-9][0-9,.]*)")


def _number(text: str) -> float | str | dict[str, float]:
    """A scalar metric as a float; an instanced one (``NAME: value; ...``) as a dict."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        pairs = _INSTANCE.findall(text)
        if pairs:
            return {name: float(value.replace(",", "")) for name, value in pairs}
        return text


def profile(impl: str, target_args: list[str], *, timeout: int = 600) -> KernelProfile:
    """Profile one launch of ``impl`` (``attnlab`` or a peer of ``KERNEL_FILTERS``) with the
    metric sets."""
    try:
        ncu = find_tool("ncu")
    except RuntimeError as exc:
        raise ProfilerUnavailable(f"Nsight Compute (ncu) is not installed: {exc}") from None
    wanted = all_metrics()
    command = [str(ncu), "--clock-control", "none", "--csv", "--page", "raw",
               "--print-metric-instances", "details", "--metrics", ",".join(wanted.values()),
               "-k", KERNEL_FILTERS[impl], "-c", "1",
               sys.executable, "-m", "attnlab.bench.profile_target", "--impl", impl,
               *target_args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    rows = parse_raw_csv(done.stdout)
    if done.returncode != 0 or not rows:
        detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ProfilerUnavailable(
            f"ncu could not profile {impl} (exit {done.returncode}): " + " | ".join(detail))
    row = rows[0]
    metrics = {short: _number(row[name]) for short, name in wanted.items() if name in row}
    missing = sorted(set(wanted) - set(metrics))
    if missing:
        metrics["unavailable"] = ", ".join(missing)
    return KernelProfile(impl, row.get("Kernel Name", "?"), metrics)


def derived(p: KernelProfile) -> dict[str, float]:
    """Ratios the seeds read: excess shared wavefronts, bytes per cp.async, conflict share."""
    m = p.metrics
    out: dict[str, float] = {}

    def num(key: str) -> float | None:
        value = m.get(key)
        return value if isinstance(value, float) else None

    conflicts, wavefronts = num("bank_conflicts_ld"), num("wavefronts_ld")
    if conflicts is not None and wavefronts:
        out["ld_conflict_share_pct"] = 100 * conflicts / wavefronts
    l2_bytes, ldgsts = num("l2_to_l1_read_bytes"), num("ldgsts_instructions")
    if l2_bytes is not None and ldgsts:
        # Each warp-level cp.async moves 16 B x 32 lanes; bypassing L1 (.cg), all of it must
        # come from L2, whatever the L1 hit-rate ratio metric says (seed 004, Observation Z).
        out["l2_bytes_per_ldgsts_byte"] = l2_bytes / (ldgsts * 512)
    cycles, duration = num("sm_cycles_elapsed"), num("duration_ns")
    if cycles is not None and duration:
        out["sm_clock_mhz"] = 1e3 * cycles / duration
    busy_avg, busy_max = num("sm_active_cycles_avg"), num("sm_active_cycles_max")
    if busy_avg is not None and busy_max:
        # 100 when every SM works until the last one finishes.
        out["sm_balance_pct"] = 100 * busy_avg / busy_max
    return out


def save_json(path: Path, profiles: list[KernelProfile]) -> Path:
    import json

    path.write_text(json.dumps([{**p.to_dict(), "derived": derived(p)} for p in profiles],
                               indent=1))
    return path


# ---- per-instruction stall sampling (the source page) ------------------------------------
#: The source page's column of all warp-state samples of an instruction.
SAMPLES_COLUMN = "Warp Stall Sampling (All Samples)"


@dataclass(frozen=True)
class StallSite:
    """One SASS instruction's warp-stall samples and its two largest reasons."""

    address: str
    sass: str
    samples: int
    reasons: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class StallReport:
    """ncu's warp-state sampling of one launch: samples in all, per reason, and the
    instructions that collect the most (where a kernel waits, and on what)."""

    impl: str
    total: int
    by_reason: tuple[tuple[str, int], ...]
    sites: tuple[StallSite, ...]

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _count(text: str) -> int:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def parse_source_csv(text: str, impl: str = "", top: int = 16) -> StallReport:
    """``ncu -i REP --page source --csv --print-source sass``: per SASS line its samples
    (``Warp Stall Sampling (All Samples)``) and per-reason counts (``stall_*`` columns, the
    not-issued duplicates left out), of the report's first launch."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    start = next(i for i, r in enumerate(rows) if SAMPLES_COLUMN in r)
    # A report of several launches repeats the name row and the header per launch: the
    # first launch's lines end at the next name row.
    header = rows[start]
    end = next((i for i in range(start + 1, len(rows)) if len(rows[i]) != len(header)),
               len(rows))
    data = rows[start + 1:end]
    samples = header.index(SAMPLES_COLUMN)
    reasons = [i for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name]
    by_reason: collections.Counter[str] = collections.Counter()
    for r in data:
        for i in reasons:
            by_reason[header[i]] += _count(r[i])
    sites = []
    for r in sorted(data, key=lambda r: -_count(r[samples]))[:top]:
        if not _count(r[samples]):
            break
        worst = sorted(((_count(r[i]), header[i]) for i in reasons), reverse=True)[:2]
        sites.append(StallSite(r[0].strip(), r[1].strip(), _count(r[samples]),
                               tuple((name, n) for n, name in worst if n)))
    return StallReport(impl, sum(_count(r[samples]) for r in data),
                       tuple(by_reason.most_common(10)), tuple(sites))


def stall_sampling(impl: str, target_args: list[str], *, timeout: int = 600,
                   top: int = 16) -> StallReport:
    """Warp-stall samples per instruction of one launch of ``impl`` (ncu's SourceCounters
    section, then its source page), as ``profile`` runs it."""
    try:
        ncu = find_tool("ncu")
    except RuntimeError as exc:
        raise ProfilerUnavailable(f"Nsight Compute (ncu) is not installed: {exc}") from None
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "stalls"
        command = [str(ncu), "--clock-control", "none", "--section", "SourceCounters",
                   "--section", "WarpStateStats", "-k", KERNEL_FILTERS[impl], "-c", "1",
                   "-o", str(report), sys.executable, "-m", "attnlab.bench.profile_target",
                   "--impl", impl, *target_args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        source = subprocess.run([str(ncu), "-i", f"{report}.ncu-rep", "--page", "source",
                                 "--csv", "--print-source", "sass"], capture_output=True,
                                text=True, timeout=timeout)
    if done.returncode != 0 or SAMPLES_COLUMN not in source.stdout:
        detail = (done.stderr or source.stderr or done.stdout).strip().splitlines()[-5:]
        raise ProfilerUnavailable(f"ncu could not sample {impl}'s stalls (exit "
                                  f"{done.returncode}): " + " | ".join(detail))
    return parse_source_csv(source.stdout, impl, top)

