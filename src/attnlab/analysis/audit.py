"""Audits across every kernel attnlab builds: seed 004's Observation AA (useful_pct, the share
of instructions doing arithmetic, per kernel and per family) and Observation CC (registers and
spills), from cross-compiled binaries (no GPU).

The inventory is what the library ships, per architecture: the forward ladder's configs
(each step and lab variant at hd128), the forward kernels ``attention()`` runs by default
(``policy.default_specs``), the backward kernels and their preprocess
(``policy.default_backward_specs``), the decoding kernels, the GEMM kernels the dispatch
builds (``gemm.dispatch.default_specs``: sm_90a), the lab's HGEMM steps on ``mma.sync``
(``gemm.ladder``) and the convolution family (``conv_specs``: the implicit-GEMM kernels of the
conv dispatch's tiles on sm_90a, GroupNorm + SiLU's two stages at the SD-UNet's group widths,
the direct FFMA convolution). Every count is static (build time), as the seed's were.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab import ladder, policy
from attnlab.gemm.dispatch import default_specs as gemm_specs
from attnlab.gemm.ladder import GEMM_STEPS
from attnlab.gemm_config import MmaGemmConfig
from attnlab.kernels.abi import (
    BackwardSpec,
    CombineSpec,
    DecodeSpec,
    ForwardSpec,
    PreprocessSpec,
)
from attnlab.kernels.conv.abi import DirectConvSpec, GroupNormSiluSpec, ImplicitConvSpec
from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec

Spec = (ForwardSpec | BackwardSpec | PreprocessSpec | DecodeSpec | CombineSpec | GemmSpec
        | ImplicitConvSpec | GroupNormSiluSpec | DirectConvSpec)
#: The SD-UNet's GroupNorm widths (channels per group at 32 groups: C = 64 ... 640).
SD_GROUP_WIDTHS = (2, 4, 8, 10, 16, 20)


def conv_specs(arch: str) -> list[Spec]:
    """The convolution family's kernels on ``arch``: implicit GEMM on sm_90a at every tile of
    the conv dispatch (3 x 3, stride 1, padding 1, with a bias) and a 1 x 1 stride-2 one, the
    ``mma.sync`` implicit GEMM of the conv ladder (coordinate tables, every arch), GroupNorm +
    SiLU's stages at the SD-UNet's group widths, and the direct convolution."""
    from attnlab.conv.api import CONV_TILES
    from attnlab.conv.ladder import CONV_STEPS
    from attnlab.gemm_config import GemmConfig

    specs: list[Spec] = [ImplicitConvSpec(CONV_STEPS["c03"][0]["config"], arch, "bfloat16")]
    if arch == "sm_90a":
        specs += [ImplicitConvSpec(GemmConfig(block_m=bm, block_n=bn), arch, "bfloat16",
                                   bias=True) for bm, bn in CONV_TILES]
        specs.append(ImplicitConvSpec(GemmConfig(block_m=128, block_n=128), arch, "bfloat16",
                                      1, 1, 2, 2, 0, 0))
    specs += [GroupNormSiluSpec(arch, "bfloat16", width, stage)
              for width in SD_GROUP_WIDTHS for stage in ("stats", "apply")]
    specs.append(DirectConvSpec(arch, "bfloat16"))
    return specs


def _label(spec: Spec) -> str:
    if isinstance(spec, ImplicitConvSpec | GroupNormSiluSpec | DirectConvSpec):
        return f"{spec.label} {spec.dtype}{spec.variant()}"
    if isinstance(spec, GemmSpec | ReduceSpec):
        dtypes = (f"{spec.dtype}->{spec.out_dtype}" if isinstance(spec, GemmSpec)
                  else spec.out_dtype)
        return f"{spec.label} {dtypes}{spec.variant()}"
    head = f"{spec.dtype} hd{spec.head_dim}"
    if isinstance(spec, PreprocessSpec):
        return f"preprocess {head}{' varlen' if spec.varlen else ''}" \
               f"{' dlse' if spec.with_dlse else ''}"
    if isinstance(spec, (DecodeSpec, CombineSpec)):
        return f"{spec.label} {head}{spec.variant()}"
    return f"{spec.config.short_name()} {head}{spec.variant()}"


def inventory(arch: str) -> dict[str, dict[str, Spec]]:
    """Family -> {label: spec} of every kernel attnlab builds for ``arch``."""
    families: dict[str, dict[str, Spec]] = {
        "forward ladder": {f"{name} hd128": ForwardSpec(config, arch, "bfloat16", 128, False)
                           for name, config in ladder.named_for(arch, 128).items()},
        "forward defaults": {_label(s): s for s in policy.default_specs(arch)},
        "backward": {}, "backward preprocess": {},
        "decode": {_label(s): s for s in policy.decode_specs(arch)},
        "gemm": {_label(s): s for s in gemm_specs(arch)},
        "gemm ladder": {name: GemmSpec(config, arch, "bfloat16", "bfloat16", "k", "k")
                        for name, (config, _) in GEMM_STEPS.items()
                        if isinstance(config, MmaGemmConfig)},
        "conv": {_label(s): s for s in conv_specs(arch)}}
    for spec in policy.default_backward_specs(arch):
        family = "backward preprocess" if isinstance(spec, PreprocessSpec) else "backward"
        families[family][_label(spec)] = spec
    return families


@dataclass(frozen=True)
class KernelAudit:
    """One kernel's static counts."""

    family: str
    label: str
    arch: str
    instructions: int
    useful_pct: float
    registers: int
    spill_stores: int
    spill_loads: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def audit_kernel(family: str, label: str, spec: Spec, folder: Path) -> KernelAudit:
    """Cross-compile ``spec`` (cached in ``folder``) and count."""
    from attnlab.analysis.resources import read_resources
    from attnlab.analysis.sass import disassemble, parse, useful_pct
    from attnlab.compile import compile_spec

    cubin = compile_spec(spec, folder).cubin
    text = disassemble(cubin)
    instructions = parse(text)
    resources = read_resources(cubin, text)
    return KernelAudit(family, label, spec.arch, len(instructions),
                       round(useful_pct(instructions), 2), resources.registers,
                       resources.spill_stores, resources.spill_loads)


def run_audit(arch: str, folder: Path, families: Iterable[str] | None = None,
              on_done: Callable[[KernelAudit], None] | None = None) -> list[KernelAudit]:
    """Audit every kernel of ``families`` (all when None) on ``arch``."""
    known = inventory(arch)
    chosen = list(known) if families is None else list(families)
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {sorted(known)}")
    rows = []
    for family in chosen:
        for label, spec in known[family].items():
            rows.append(audit_kernel(family, label, spec, folder))
            if on_done is not None:
                on_done(rows[-1])
    return rows


@dataclass(frozen=True)
class FamilySummary:
    """Observation AA's per-family table, with Observation CC's registers and spills."""

    family: str
    kernels: int
    useful_pct_mean: float
    useful_pct_median: float
    useful_pct_max: float
    registers_max: int
    spilling: int


def summarize(rows: list[KernelAudit]) -> list[FamilySummary]:
    """Per family, in the order the rows first name it."""
    summaries = []
    for family in dict.fromkeys(r.family for r in rows):
        mine = [r for r in rows if r.family == family]
        useful = [r.useful_pct for r in mine]
        summaries.append(FamilySummary(
            family, len(mine), round(statistics.mean(useful), 2),
            round(statistics.median(useful), 2), max(useful),
            max(r.registers for r in mine), sum(1 for r in mine if r.spill_stores)))
    return summaries


def plot(rows: list[KernelAudit], path: Path) -> Path:
    """useful_pct and registers per kernel, grouped by family (one dot per kernel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(dict.fromkeys(r.family for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(families) + 2.2), sharey=True)
    for axis, field, title in ((axes[0], "useful_pct", "useful_pct (% of instructions)"),
                               (axes[1], "registers", "registers per thread")):
        for y, family in enumerate(families):
            mine = [r for r in rows if r.family == family]
            axis.scatter([getattr(r, field) for r in mine], [y] * len(mine), alpha=0.6,
                         c=["tab:red" if r.spill_stores else "tab:blue" for r in mine], s=18)
        axis.set_title(title)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(families)), families)
    fig.suptitle(f"static audit, {rows[0].arch}: {len(rows)} kernels (red: spills)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
