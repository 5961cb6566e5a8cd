"""Observation O's trade-off: does a layout that removes bank conflicts pay for the occupancy
its shared memory may cost? A screening model, as the seed's ``pad_tradeoff()`` was.

Per K/V block, each resident warp of an ``mma.sync`` kernel issues ``W`` shared-memory
wavefronts (its K and V copies, its Q, K and V ``ldmatrix``: ``banks.from_config``) and ``M``
tensor-core MMAs (S = Q K^T and O += P V over its rows). The SM's shared-memory pipe serves one
wavefront per cycle and its tensor pipe one m16n8k16 MMA per ``MMA_CYCLES[arch]``, both shared
by the resident warps, so a warp's block costs the SM ``max(W, M x MMA_CYCLES)`` cycles when
the two overlap. Below ``HIDING_WARPS`` resident warps the latencies no longer hide behind the
other warps' work, and the cost stretches by ``HIDING_WARPS / warps``. The predicted speedup
of one layout over another is the ratio of the two costs; occupancy enters through the warps
per SM that ``occupancy`` finds for each (registers, shared memory).

Checked against measurement (``docs/tools.md``): it gets the direction of both of our measured
pairs (and the seed's loss, on which ``HIDING_WARPS`` is calibrated), and overstates the size
of a conflict win (global loads and the softmax also take time, which it leaves out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnlab.analysis.banks import from_config
from attnlab.analysis.occupancy import GpuSpec, occupancy
from attnlab.config import FRAG_COLS, MMA_K, MMA_M, FlashConfig

#: Cycles of the SM's tensor pipe per m16n8k16 MMA: sm_80 (A100) 2048 FLOP per cycle and SM;
#: sm_86/89 (GA10x, AD10x) half that; sm_90 ``mma.sync`` 640 TFLOP/s measured on the H100's
#: 132 SMs at 1.755 GHz (``attnlab roofline``), about 2,760 FLOP per cycle.
MMA_CYCLES = {"sm_80": 2.0, "sm_86": 4.0, "sm_89": 4.0, "sm_90": 1.5}
#: Resident warps under which latency shows, calibrated on seed 004's one measured occupancy
#: loss (its regpv kernel, tensor-bound with conflicts hidden at 12 warps, ran 0.81x at 8
#: warps once padding cost it a CTA: 10 / 8 = 1.25 -> 0.80x predicted).
HIDING_WARPS = 10
#: Accesses of the main loop (per K/V block); the Q/O epilogue runs once per tile.
_MAIN_LOOP = ("K cp.async", "V cp.async", "Q ldmatrix", "K ldmatrix", "V ldmatrix")


@dataclass(frozen=True)
class LayoutCost:
    """One config on one GPU: resident warps, and per warp and K/V block its shared-memory
    wavefronts, MMAs and modelled cycles."""

    label: str
    warps_per_sm: int
    wavefronts: int
    mmas: int
    cycles: float
    limited_by: str


@dataclass(frozen=True)
class PadPrediction:
    gpu: str
    base: LayoutCost
    other: LayoutCost
    #: Predicted time of ``base`` over ``other``: above 1, ``other`` is faster.
    speedup: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def layout_cost(label: str, config: FlashConfig, head_dim: int, gpu: GpuSpec,
                registers: int, smem_bytes: int) -> LayoutCost:
    """The model's cost of one warp's K/V block (see the module docstring)."""
    wavefronts = sum(s.wavefronts for s in from_config(config, head_dim)
                     if s.name.startswith(_MAIN_LOOP))
    row_tiles = config.block_m // config.num_warps // MMA_M
    mmas = row_tiles * (config.block_n // FRAG_COLS * head_dim // MMA_K
                        + head_dim // FRAG_COLS * config.block_n // MMA_K)
    warps = occupancy(gpu, config.num_threads, registers, smem_bytes).warps_per_sm
    tensor = mmas * MMA_CYCLES[gpu.arch]
    cycles = max(wavefronts, tensor) * max(1.0, HIDING_WARPS / max(warps, 1))
    limited = "shared memory" if wavefronts > tensor else "tensor pipe"
    if warps < HIDING_WARPS:
        limited += f", latency ({warps} warps/SM)"
    return LayoutCost(label, warps, wavefronts, mmas, cycles, limited)


def pad_tradeoff(base: LayoutCost, other: LayoutCost, gpu: GpuSpec) -> PadPrediction:
    """``other``'s predicted speedup over ``base`` on ``gpu``."""
    return PadPrediction(gpu.name, base, other, base.cycles / other.cycles)
