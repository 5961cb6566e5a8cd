"""Observation O's padding-versus-occupancy trade-off model (``analysis/padding.py``), on CPU:
the wavefront and MMA counts it reads, and the three cases it must tell apart."""

from __future__ import annotations

from attnlab import ladder
from attnlab.analysis.occupancy import get_spec
from attnlab.analysis.padding import HIDING_WARPS, layout_cost, pad_tradeoff

H100, GA104 = get_spec("H100"), get_spec("RTX3070Ti")


def test_conflicts_decide_when_occupancy_is_equal():
    """k01's 8-way ldmatrix conflicts against k02's swizzle, same registers and smem: the
    shared-memory pipe binds k01 (2,368 wavefronts per warp and block) and k02 is predicted
    faster by the wavefront ratio (measured 4.6-4.7x on the H100/H200: the model overstates)."""
    k01 = layout_cost("k01", ladder.k01, 128, H100, 232, 49152)
    k02 = layout_cost("k02", ladder.k02, 128, H100, 232, 49152)
    assert (k01.wavefronts, k02.wavefronts, k01.mmas) == (2368, 352, 128)
    assert k01.limited_by.startswith("shared memory")
    assert pad_tradeoff(k01, k02, H100).speedup == 2368 / 352


def test_conflict_free_either_way_predicts_a_tie():
    """pad8 against the swizzle at k07: both conflict-free, same warps: 1.0 (measured 0.95-1.06)."""
    k07 = layout_cost("k07", ladder.k07, 128, H100, 246, 65536)
    pad8 = layout_cost("pad8", ladder.LAB_VARIANTS["pad8"], 128, H100, 243, 69632)
    assert k07.limited_by == pad8.limited_by and k07.limited_by.startswith("tensor pipe")
    assert pad_tradeoff(k07, pad8, H100).speedup == 1.0


def test_padding_that_costs_a_cta_loses_when_the_tensor_pipe_binds():
    """On GA104 (99 KiB of shared memory) k02's padded rows take 51 KiB a CTA: one CTA (4
    warps) instead of two, below HIDING_WARPS, and nothing to gain from conflicts."""
    k02 = layout_cost("k02", ladder.k02, 128, GA104, 232, 49152)
    padded = layout_cost("k02 pad8", ladder.k02.replace(swizzle="pad8"), 128, GA104, 232,
                         52224)
    assert (k02.warps_per_sm, padded.warps_per_sm) == (8, 4)
    assert "latency" in padded.limited_by
    speedup = pad_tradeoff(k02, padded, GA104).speedup
    assert speedup == max(1.0, HIDING_WARPS / 8) / (HIDING_WARPS / 4) < 1
