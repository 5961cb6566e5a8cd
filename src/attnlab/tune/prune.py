"""Static pruning: drop the configs that cannot win before spending GPU time on them.

The seeds' rules (kernel 7): a config that fails to compile, spills registers (more than a
few values, see ``SPILL_TOLERANCE_BYTES``), needs more shared memory than the GPU offers per
block, or keeps fewer warps per SM than a floor.
Everything here reads cross-compiled artifacts, so it runs in worker processes, GPU or not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from attnlab.analysis.occupancy import GpuSpec, occupancy
from attnlab.config import FlashConfig

#: Fewer resident warps than this per SM leaves too little to hide latency.
MIN_WARPS_PER_SM = 4
#: Spill stack a candidate may keep. At -O3 ptxas spills a few values per K/V block from the
#: 32-rows-per-warp tiles (the Hopper defaults: 8-88 B), and every spill-free build of those
#: tiles measured slower (docs/ladder.md, "Zero spills"); tiles that spill hundreds of bytes
#: lost everywhere they were timed.
SPILL_TOLERANCE_BYTES = 96


@dataclass(frozen=True)
class Inspection:
    """What cross-compiling one candidate told us."""

    config: FlashConfig
    error: str | None = None
    registers: int = 0
    stack_bytes: int = 0
    spills: bool = False
    smem_bytes: int = 0


def inspect_config(config: FlashConfig, arch: str, dtype: str, head_dim: int,
                   out_dir: str, windowed: bool = False) -> Inspection:
    """Cross-compile and read resources (a top-level function, so worker processes can run it).

    ``windowed``: inspect the causal / sliding-window kernel, whose registers differ.
    """
    from attnlab.analysis.resources import read_resources
    from attnlab.compile import compile_config

    try:
        art = compile_config(config, arch, dtype=dtype, head_dim=head_dim, windowed=windowed,
                             out_dir=Path(out_dir))
        res = read_resources(art.cubin)
    except Exception as exc:  # any failure to build is a prune reason, reported by name
        return Inspection(config, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    return Inspection(config, None, res.registers, res.stack_bytes, res.spills,
                      config.smem_bytes(head_dim))


def prune_reason(item: Inspection, spec: GpuSpec, min_warps_per_sm: int = MIN_WARPS_PER_SM
                 ) -> str | None:
    """Why a candidate is dropped (``None``: keep it)."""
    if item.error is not None:
        return "compile error"
    if item.spills and item.stack_bytes > SPILL_TOLERANCE_BYTES:
        return "register spills"
    if item.smem_bytes > spec.smem_per_cta_optin:
        return "shared memory"
    occ = occupancy(spec, item.config.num_threads, item.registers, item.smem_bytes)
    if occ.warps_per_sm < min_warps_per_sm:
        return "occupancy"
    return None


def prune(items: list[Inspection], spec: GpuSpec, min_warps_per_sm: int = MIN_WARPS_PER_SM
          ) -> tuple[list[Inspection], Counter[str]]:
    """The survivors, and how many candidates each rule removed."""
    survivors, reasons = [], Counter()
    for item in items:
        reason = prune_reason(item, spec, min_warps_per_sm)
        if reason is None:
            survivors.append(item)
        else:
            reasons[reason] += 1
    return survivors, reasons
