"""The TMA unit's view of the launch's tensors, shared by the kernels that use it.

A TMA copy moves one box of a tensor's leading modes, so a (batch, rows, heads, d) tensor is
viewed with the tile's modes first: (rows, d, heads, batch). A tile is then addressed by its
block coordinates, and ``tile_partition`` gives one copy's source and destination.
"""

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync


def rows_first(t: cute.Tensor) -> cute.Tensor:
    """(batch, rows, heads, d) as (rows, d, heads, batch): a row tile is the leading modes."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 3, 2, 0]))


def stats_rows_first(t: cute.Tensor) -> cute.Tensor:
    """(batch, heads, rows) per-row statistics as (rows, heads, batch)."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, mode=[2, 1, 0]))


def tile_partition(tma: tuple, smem: cute.Tensor, tile: tuple, block_coord: tuple, head,
                   batch, origin: tuple | None = None, multicast: tuple = (0, 1)) -> tuple:
    """``(smem stages, global blocks)`` of one TMA copy of ``tile``-sized boxes of head
    ``head`` and batch element ``batch``; index a block by its coordinate along the mode that
    ``block_coord`` leaves ``None``, a stage by its index. ``tma`` is ``(atom, coordinate
    tensor)`` as ``cpasync.make_tiled_tma_atom`` gives them. ``origin``: where block 0
    starts in the tile's two modes (a packed sequence's first row), when not at 0.
    ``multicast``: ``(rank, ctas)``, this CTA's share of a box that a multicast atom copies
    into the shared memory of ``ctas`` CTAs, each issuing one share."""
    atom, coords = tma
    head_coords = coords[None, None, head, batch]
    if origin is not None:
        head_coords = cute.domain_offset(origin, head_coords)
    blocks = cute.local_tile(head_coords, tile, block_coord)
    rank, ctas = multicast
    return cpasync.tma_partition(atom, rank, cute.make_layout(ctas),
                                 cute.group_modes(smem, 0, 2), cute.group_modes(blocks, 0, 2))


def stats_partition(tma: tuple, smem: cute.Tensor, box: int, head, batch, row0) -> tuple:
    """``(smem stages, global box)`` of one TMA copy of ``box`` per-row statistics
    (``stats_rows_first``) of ``head`` and ``batch`` from row ``row0`` (a multiple of 16
    bytes: a box's first element must be); index the box by 0. ``smem`` is (box, stages)."""
    atom, coords = tma
    rows = cute.domain_offset((row0,), coords[None, head, batch])
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 1),
                                 cute.group_modes(cute.local_tile(rows, (box,), (None,)), 0, 1))
