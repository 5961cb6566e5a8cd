"""Which output tile (and K slice) a CTA computes: the GEMM's tile walk.

The work is ``m_tiles x n_tiles`` output tiles times ``splits`` K slices. CTA ``c`` of a grid of
``num_ctas`` takes work items ``c, c + num_ctas, ...`` (one item per CTA when the grid has one
CTA per item). Items are numbered slice-major, and within a slice in *raster groups*: ``group``
M tiles at a time, the group's tiles column by column, so the CTAs in flight together share
the group's A rows and a few column blocks of B in L2 (the classic grouped ordering; 1 is
row-major order, which rereads all of B for every row of tiles).

Plain arithmetic on DSL values or Python ints (the tests walk it on the host).
"""

import cutlass


def k_tiles_per_split(k_tiles, splits):
    """K tiles of each slice (the last may have fewer)."""
    return (k_tiles + splits - 1) // splits


def tile_coords(item, m_tiles, n_tiles, group: int):
    """``(m_tile, n_tile, split)`` of work item ``item``."""
    per_split = m_tiles * n_tiles
    split = item // per_split
    within = item - split * per_split
    group_items = group * n_tiles
    first_m = (within // group_items) * group
    # The last group may have fewer than ``group`` rows of tiles.
    rows = cutlass.min(m_tiles - first_m, group)
    in_group = within - (within // group_items) * group_items
    return first_m + in_group % rows, in_group // rows, split
