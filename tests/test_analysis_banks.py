"""The static bank-conflict model against the seeds' numbers (seed 001, seed 004 Observation W)
and against the kernel's own layouts (``from_config``)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab import ladder
from attnlab.analysis.banks import (
    SmemLayout,
    access_stats,
    fragment_store_coords,
    from_config,
    gemm_from_config,
    instruction_ways,
    layout_for,
    ldmatrix_coords,
    phase_wavefronts,
    row_copy_coords,
    warp_phases,
)
from attnlab.config import ConfigError


def ways(layout: SmemLayout, coords, width: int) -> list[int]:
    return instruction_ways([layout.byte_offset(r, c) for r, c in coords], width)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------
def test_phases_by_width():
    """Seed 001: 16-byte accesses in 4 phases of 8 threads, 8-byte in 2 of 16, 4-byte in one."""
    addresses = list(range(0, 32 * 16, 16))
    assert [len(p) for p in warp_phases(addresses, 16)] == [8, 8, 8, 8]
    assert [len(p) for p in warp_phases(addresses, 8)] == [16, 16]
    assert [len(p) for p in warp_phases(addresses, 4)] == [32]
    with pytest.raises(ValueError, match="4, 8 or 16"):
        warp_phases(addresses, 2)


def test_contiguous_and_broadcast_accesses_are_conflict_free():
    for width in (4, 8, 16):
        assert instruction_ways([width * t for t in range(32)], width) == [1] * (width // 4)
    assert instruction_ways([64] * 32, 4) == [1]  # one word for everyone: a broadcast


def test_strided_accesses_conflict():
    # 4-byte accesses 128 bytes apart all hit bank 0: 32 distinct words, 32-way.
    assert instruction_ways([128 * t for t in range(32)], 4) == [32]
    # 8-byte column access, rows 128 bytes apart: banks 0-1 each owe 16 words per phase.
    assert instruction_ways([128 * t for t in range(32)], 8) == [16, 16]
    # 16-byte accesses 256 bytes apart (seed 001's unswizzled rows): 8-way in every phase.
    assert instruction_ways([256 * t for t in range(32)], 16) == [8, 8, 8, 8]
    # Two threads, same bank group, different rows: 2-way.
    assert phase_wavefronts([(0, 16), (128, 16)]) == 2


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("swizzle", ["none", "xor", "pad8"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_layouts_are_one_to_one(swizzle, head_dim):
    layout = layout_for(swizzle, 64, head_dim)
    offsets = {layout.byte_offset(r, c) for r in range(64) for c in range(head_dim)}
    assert len(offsets) == 64 * head_dim
    assert max(offsets) < 64 * layout.stride * 2
    assert all(o % 2 == 0 for o in offsets)


@given(st.integers(0, 63), st.integers(0, 127))
def test_xor_swizzle_permutes_16_byte_chunks_by_row(row, col):
    """Swizzle<3,3,3>: the chunk index inside a 128-byte atom row is XORed with row % 8; the
    byte inside the chunk and the row stay."""
    layout = layout_for("xor", 64, 128)
    offset = layout.byte_offset(row, col)
    assert offset // 16 % 8 == (col // 8 % 8) ^ (row % 8)
    assert offset % 16 == col % 8 * 2
    assert offset // 128 % 64 == row  # atoms are tiled down the rows first


@given(st.integers(0, 63), st.integers(0, 95))
def test_narrow_xor_swizzle_spreads_rows_over_all_bank_groups(row, col):
    """Head dims that are no multiple of 64 use 32-column atoms and Swizzle<2,3,3>: two rows
    per 128 bytes, the chunk XORed with (row // 2) % 4."""
    layout = layout_for("xor", 64, 96)
    assert (layout.swizzle_bits, layout.atom_cols) == (2, 32)
    group = layout.byte_offset(row, col) // 16 % 8
    assert group == (row % 2) * 4 + ((col // 8 % 4) ^ (row // 2 % 4))


#: Tiles whose CuTe layouts the next test compares with the model (16 rows; every 4th column).
KERNEL_LAYOUTS = [(swizzle, 16, hd) for swizzle in ("none", "xor", "pad8")
                  for hd in (32, 64, 96, 128)]


def test_layouts_match_the_kernels_cute_layouts():
    """The model's layouts are the kernel's own: CuTe evaluates ``smem_tile_layout`` (static
    shapes give Python ints) while tracing a jit function."""
    cute = pytest.importorskip("cutlass.cute")
    from attnlab.kernels.common.layouts import smem_tile_layout

    offsets: dict[tuple, list[int]] = {}

    @cute.jit
    def trace():
        for swizzle, rows, head_dim in KERNEL_LAYOUTS:
            layout = smem_tile_layout(swizzle, rows, head_dim)
            offsets[(swizzle, rows, head_dim)] = [
                layout((r, c, 0)) for r in range(rows) for c in range(0, head_dim, 4)]

    with contextlib.suppress(Exception):  # without a GPU the DSL gives up after tracing
        cute.compile(trace, options="--gpu-arch sm_80")
    assert set(offsets) == set(KERNEL_LAYOUTS)
    for (swizzle, rows, head_dim), cute_offsets in offsets.items():
        model = layout_for(swizzle, rows, head_dim)
        assert cute_offsets == [model.byte_offset(r, c) // 2 for r in range(rows)
                                for c in range(0, head_dim, 4)], (swizzle, head_dim)


def test_layout_rejects_coordinates_outside_the_tile():
    with pytest.raises(IndexError):
        layout_for("none", 64, 64).byte_offset(64, 0)


def test_padded_rows_land_on_distinct_bank_groups():
    """Observation W: 144-byte rows put eight rows at {0, 16, ..., 112} modulo 128."""
    layout = layout_for("pad8", 64, 64)
    assert layout.stride * 2 == 144
    assert sorted(layout.byte_offset(r, 0) % 128 for r in range(8)) == list(range(0, 128, 16))


# ---------------------------------------------------------------------------------------------
# The seeds' numbers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
def test_ldmatrix_conflicts_by_layout(head_dim):
    """Seed 001 / Observation W: 8-way ldmatrix over unswizzled 128- and 256-byte rows, none
    with the XOR swizzle or with +8 halves of padding."""
    coords = ldmatrix_coords(8, 16)
    assert ways(layout_for("none", 64, head_dim), coords, 16) == [8, 8, 8, 8]
    assert ways(layout_for("xor", 64, head_dim), coords, 16) == [1, 1, 1, 1]
    assert ways(layout_for("pad8", 64, head_dim), coords, 16) == [1, 1, 1, 1]


def test_ldmatrix_x1_and_x2_are_one_and_two_phases():
    layout = layout_for("none", 64, 64)
    assert ways(layout, ldmatrix_coords(0, 0, num=1), 16) == [8]
    assert ways(layout, ldmatrix_coords(0, 0, num=2), 16) == [8, 8]
    with pytest.raises(ValueError):
        ldmatrix_coords(0, 0, num=3)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fragment_store_conflicts_and_swizzled_fix(head_dim):
    """Seed 001: 4-byte RF->SMEM stores of threads 4 apart hit the same bank (8-way); the
    swizzled base address (and padding) removes it."""
    coords = fragment_store_coords(0, 8)
    assert ways(layout_for("none", 64, head_dim), coords, 4) == [8]
    assert ways(layout_for("xor", 64, head_dim), coords, 4) == [1]
    assert ways(layout_for("pad8", 64, head_dim), coords, 4) == [1]


@pytest.mark.parametrize("swizzle", ["none", "xor", "pad8"])
def test_row_copies_are_conflict_free(swizzle):
    """Seed 001: GMEM <-> SMEM 16-byte copies, a row per phase, are conflict-free."""
    layout = layout_for(swizzle, 64, 128)
    for col in (0, 64):
        assert ways(layout, row_copy_coords(4, col, 16), 16) == [1, 1, 1, 1]


def test_access_stats_totals():
    layout = layout_for("none", 64, 64)
    stats = access_stats("K", layout, [ldmatrix_coords(r, 0) for r in (0, 16)], 16)
    assert (stats.instructions, stats.wavefronts, stats.ideal_wavefronts) == (2, 64, 8)
    assert (stats.max_ways, stats.phase_ways, stats.excess_wavefronts) == (8, (8, 8, 8, 8), 56)
    assert stats.wavefronts_per_instruction == 32
    with pytest.raises(ValueError, match="no instructions"):
        access_stats("K", layout, [], 16)


# ---------------------------------------------------------------------------------------------
# The kernel's accesses
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
def test_k01_vs_k02(head_dim):
    """Kernel 2's reason in numbers: every ldmatrix and fragment store of k01 is 8-way, k02 has
    no conflict anywhere; the copies were never the problem."""
    k01 = {s.name: s for s in from_config(ladder.k01, head_dim)}
    k02 = {s.name: s for s in from_config(ladder.k02, head_dim)}
    assert list(k01) == list(k02) and len(k01) == 8
    for name, stats in k01.items():
        conflicted = "ldmatrix" in name or "fragment" in name
        assert stats.max_ways == (8 if conflicted else 1), name
        assert stats.wavefronts == stats.ideal_wavefronts * stats.max_ways
        assert k02[name].max_ways == 1 and k02[name].excess_wavefronts == 0
    assert k01["Q ldmatrix.x4"].wavefronts_per_instruction == 32
    assert k01["O fragment st.shared (4 B)"].wavefronts_per_instruction == 8
    assert k01["V ldmatrix.x4.trans"].phase_ways == (8, 8, 8, 8)


@pytest.mark.parametrize("head_dim", [32, 96])
def test_narrow_rows_conflict_four_ways(head_dim):
    """64- and 192-byte rows put two rows' chunks in each bank group: k01's ldmatrix and
    fragment stores are 4-way at head dims 32 and 96, k02's 32-column swizzle clears them."""
    k01 = {s.name: s.max_ways for s in from_config(ladder.k01, head_dim)}
    assert k01["K ldmatrix.x4"] == k01["O fragment st.shared (4 B)"] == 4
    assert k01["K cp.async (16 B)"] == 1
    assert {s.max_ways for s in from_config(ladder.k02, head_dim)} == {1}


def test_pad8_config_is_conflict_free():
    stats = from_config(ladder.k01.replace(swizzle="pad8"), 64)
    assert all(s.max_ways == 1 for s in stats)
    assert "16 B padding" in stats[0].layout


def test_from_config_instruction_counts():
    """Warp 0's share: Q slabs of 16 rows every 16 * num_warps rows, the whole K and V."""
    cfg = ladder.k07  # block_m 128 with 4 warps: two Q slabs per warp
    stats = {s.name: s for s in from_config(cfg, 128)}
    assert stats["Q ldmatrix.x4"].instructions == 2 * 128 // 16
    assert stats["K ldmatrix.x4"].instructions == (cfg.block_n // 16) * (128 // 16)
    assert stats["O fragment st.shared (4 B)"].instructions == 2 * 2 * 128 // 8
    assert stats["Q cp.async (16 B)"].instructions == cfg.block_m // 16 * 2
    sync = {s.name for s in from_config(cfg.replace(async_copy=False, eager_kv_loads=False), 64)}
    assert "Q st.shared (16 B)" in sync


def test_the_bank_model_refuses_the_wgmma_kernel():
    """The model knows the mma.sync kernel's copies and ldmatrix only; a wgmma config (TMA
    writes, descriptor reads) is refused instead of modelled as something it is not."""
    with pytest.raises(ConfigError, match="wgmma"):
        from_config(ladder.HOPPER_STEPS["wgmma"], 128)


def test_the_gemm_ladders_bank_story_is_observation_n():
    """The mma.sync HGEMM's 64-byte rows (block_k 32): ldmatrix phases 4-way conflicted
    without padding (g06), conflict-free with +8 halves (g07), whose 80-byte rows make the
    16-byte copies 2-way instead, and conflict-free everywhere with the XOR swizzle (g07x):
    the order the ladder measured (x1.85, then x2.10 over g06)."""
    from attnlab.gemm.ladder import GEMM_STEPS

    def ways(step):
        return {s.name.split(" (")[0]: max(s.phase_ways)
                for s in gemm_from_config(GEMM_STEPS[step][0])}

    assert ways("g06") == {"A cp.async": 1, "B cp.async": 1, "A ldmatrix.x4": 4,
                           "B ldmatrix.x4": 4}
    assert ways("g07") == {"A cp.async": 2, "B cp.async": 2, "A ldmatrix.x4": 1,
                           "B ldmatrix.x4": 1}
    assert set(ways("g07x").values()) == {1}
    # Without ldmatrix the fragments' 4-byte loads are 4-way too; g01 has no shared memory.
    assert ways("g02")["A ld.shared"] == 4
    with pytest.raises(ConfigError, match="global memory"):
        gemm_from_config(GEMM_STEPS["g01"][0])
