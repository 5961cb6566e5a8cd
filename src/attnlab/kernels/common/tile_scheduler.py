"""Which output tiles a CTA computes: the tile scheduler both forward kernels share.

An output tile is ``(m_block, seq, head)``: ``block_m`` query rows of one sequence (a batch
element or a packed sequence) and one query head (the backward's tiles are K/V blocks of one
K/V head, ``first_is_longest``). Two grids:

* **One CTA per tile** (the default): the hardware hands out tiles in launch order.
* **Persistent** (the lab's ``persistent`` knob): ``num_ctas`` resident CTAs walk the tiles
  in that same launch order, one wave of ``num_ctas`` tiles after another, CTA ``c`` taking
  position ``c`` of the even waves and ``num_ctas - 1 - c`` of the odd ones (a snake): with
  the tiles longest first, a fixed stride would give CTA 0 the longest tile of every wave,
  where the hardware's grid hands the next tile to whichever CTA finishes first.
* **Dynamic** (``dynamic_tiles``, with a persistent grid): after its first tile (its block
  index), a CTA takes the next tile in launch order from a counter in global memory, as the
  hardware's grid would give it; one thread of the CTA asks (``next_tile``) and passes it on.
  Once a CTA has drawn past the last tile it counts itself out (``count_out``), and the last
  to do so sets the counter back to zero for the next launch on its stream.

The launch order depends on the mask:

* **By head** (the default): the row blocks of one head are consecutive, so they share its
  K/V in L2; the grid is ``(m_blocks, seqs, heads)``. Under a mask (causal or a window: a
  tile's length depends on its row block) a head's row blocks go longest first.
* **Longest first over L2 sections** (``lpt``, masked launches): longest first over the whole
  launch, not only within a head, so the short tiles fill the grid's tail (the
  longest-processing-time rule). The (sequence, head) pairs are cut into *L2 sections* of as
  many heads as keep their K and V in L2 together; a section's tiles go row block by row
  block, longest first, each over all the section's heads (FA3's LPT order); when the pairs
  leave a narrower section, it goes first (last, its longest tiles made the launch's tail).
  The grid is one dimension.

With clusters of ``cluster`` CTAs (a persistent grid, unmasked), the walk is over groups of
``cluster`` neighbouring row blocks of one head: a cluster takes a group where a CTA took a
tile, and its CTA of rank ``r`` computes the group's ``r``-th row block (past the last row
block where their count is not a multiple: its Q is read as zeros and its O is clipped).
"""

from typing import NamedTuple

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.tile_order import (
    DONOR,
    FINISHER,
    WHOLE,
    IntOps,
    heads_per_section,
    longest_first,
    snake_tile,
    tail_piece,
    tail_pieces,
    tail_share,
    tile_coords,
)

#: The DSL's integer operations, for the arithmetic of ``tile_order`` on traced values.
DSL_OPS = IntOps(cutlass.min, cutlass.max, cute.ceil_div)

__all__ = ["DONOR", "DSL_OPS", "FINISHER", "WHOLE", "KvPiece", "TileScheduler", "cluster_rank",
           "count_out", "heads_per_section", "longest_first", "next_tile", "snake_count",
           "snake_tile"]


class KvPiece(NamedTuple):
    """A ``split_tail`` walk's unit of work: the K/V blocks ``[first, last)`` of a tile, its
    role (``WHOLE``, ``DONOR``, ``FINISHER``) and whether the tile exists (a whole wave's
    last may run past the end)."""

    first: object
    last: object
    role: object
    valid: object


def cluster_rank() -> cutlass.Int32:
    """This CTA's rank in its cluster, warp-uniform: which row block of its cluster's group it
    computes, and which share of every K/V block it multicasts."""
    return cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())


def snake_count(cta, ctas, num_tiles):
    """How many of ``num_tiles`` tiles persistent CTA ``cta`` takes: one per whole wave, and
    one of the last, partial wave if its place there is among the tiles left."""
    waves = num_tiles // ctas
    last_place = snake_tile(cta, ctas, waves) - waves * ctas
    return waves + cutlass.min(cutlass.max(num_tiles - waves * ctas - last_place, 0), 1)


@cute.jit
def next_tile(counter: cute.Tensor, ctas) -> cutlass.Int32:
    """The next tile for the calling thread's CTA: the tiles before ``ctas`` are the CTAs'
    first ones; the others are drawn from ``counter[0]`` in launch order."""
    return ctas + cute.arch.atomic_add(counter.iterator, cutlass.Int32(1), sem="relaxed",
                                       scope="gpu")


@cute.jit
def count_out(counter: cute.Tensor, ctas) -> None:
    """The calling thread's CTA will draw no more tiles: count it out at ``counter[1]``; the
    last of ``ctas`` resets both counters (every CTA drew its last tile before counting
    out, so nothing draws after the reset)."""
    cute.arch.fence_acq_rel_gpu()
    done = cute.arch.atomic_add(counter.iterator + 1, cutlass.Int32(1), sem="acq_rel",
                                scope="gpu")
    if done == ctas - 1:
        counter[0] = 0
        counter[1] = 0


class TileScheduler:
    """The tiles of a launch, ``num_m_blocks x num_seqs x num_heads``, and how CTAs take
    them (built inside the kernel, or on the host for ``grid``). ``lpt``: the longest-first
    order over L2 sections, in a masked launch; ``section``: its query heads per section
    (``heads_per_section``, needed inside the kernel only); ``cluster``: CTAs per cluster,
    which walk groups of as many row blocks."""

    def __init__(self, num_m_blocks, num_seqs, num_heads, persistent: bool, windowed: bool,
                 lpt: bool = False, section=None, first_is_longest: bool = False,
                 cluster: int = 1, split_blocks=None):
        self.cluster = cluster
        # ``split_tail``: the K/V blocks of every tile (None: whole tiles only).
        self.split_blocks = split_blocks
        # The walk's unit: a group of ``cluster`` row blocks.
        self.num_m_blocks = (num_m_blocks if cluster == 1
                             else (num_m_blocks + cluster - 1) // cluster)
        self.num_seqs = num_seqs
        self.num_heads = num_heads
        self.persistent = persistent
        # Whether the tiles' lengths fall with the block index (the backward's K/V blocks
        # under a causal band), so longest first is index order; else they rise with it.
        self.reverse = windowed and not first_is_longest
        self.windowed = windowed
        self.lpt = lpt and windowed
        self.section = section

    def num_tiles(self):
        return self.num_m_blocks * self.num_seqs * self.num_heads

    def grid(self, num_ctas=None) -> tuple:
        """The launch grid: ``num_ctas`` persistent CTAs, or one CTA per tile."""
        if self.persistent:
            return (num_ctas, 1, 1)
        if self.lpt:
            return (self.num_tiles(), 1, 1)
        return (self.num_m_blocks, self.num_seqs, self.num_heads)

    @cute.jit
    def for_each_tile(self, body, between, carried):
        """``carried = body(m_block, seq, head, carried)`` for each tile of this CTA, in
        order, and ``between()`` after each tile of a persistent CTA (e.g. a barrier before the
        next tile reuses this one's shared memory). ``carried`` is what a CTA takes from one
        tile to the next (e.g. the position of its K/V ring); the last value is returned."""
        if cutlass.const_expr(self.split_blocks is not None):
            carried = self._walk_pieces(body, between, carried)
        elif cutlass.const_expr(self.persistent):
            cta, _, _ = cute.arch.block_idx()
            ctas, _, _ = cute.arch.grid_dim()
            # A cluster's CTAs are consecutive along x: they share its place in the walk.
            cta, ctas = cta // self.cluster, ctas // self.cluster
            # Two values carried (the tile and the step to the next, which alternate), not
            # the wave and the CTA: the consumer warps of the Hopper kernel have no register
            # to spare.
            tile, step = cta, 2 * (ctas - cta) - 1
            while tile < self.num_tiles():
                carried = body(*self.coords(tile), carried)
                between()
                tile, step = tile + step, 2 * ctas - step
        else:
            carried = body(*self.tile(), carried)
        return carried

    @cute.jit
    def _walk_pieces(self, body, between, carried):
        """``split_tail``: ``carried = body(m_block, seq, head, carried, piece)`` and
        ``between()`` for each whole tile of the CTA's waves, then each piece of its run of
        the tail (one traced body: a unit's tile and blocks come from arithmetic on the
        unit's index)."""
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        cta, ctas = cta // self.cluster, ctas // self.cluster
        blocks, num_tiles = self.split_blocks, self.num_tiles()
        share = tail_share(cta, ctas, num_tiles, blocks, DSL_OPS)
        position = share.first
        for unit in cutlass.range(share.waves + tail_pieces(share, blocks, DSL_OPS), unroll=1):
            tile, first = snake_tile(cta, ctas, unit), cutlass.Int32(0)
            last, role = blocks, cutlass.Int32(WHOLE)
            if unit >= share.waves:
                tile, first, last, role = tail_piece(position, share.last, blocks, DSL_OPS)
                tile = share.waves * ctas + tile
                position = position + last - first
            carried = body(*self.coords(tile), carried,
                           KvPiece(first, last, role, tile < num_tiles))
            between()
        return carried

    @cute.jit
    def draw_each_tile(self, body, carried, counter: cute.Tensor):
        """``dynamic_tiles``, one warp: ``carried = body(tile, m_block, seq, head, carried)``
        for the CTA's first tile and each one ``counter`` hands out after it; returns the
        last ``carried``. The warp's first lane draws; the caller counts the CTA out."""
        ctas, _, _ = cute.arch.grid_dim()
        tile, _, _ = cute.arch.block_idx()
        while tile < self.num_tiles():
            carried = body(tile, *self.coords(tile), carried)
            drawn = cutlass.Int32(0)
            if cute.arch.lane_idx() == 0:
                drawn = next_tile(counter, ctas)
            tile = cute.arch.shuffle_sync(drawn, 0)
        return carried

    @cute.jit
    def take_each_tile(self, body, carried, receive):
        """``dynamic_tiles``, the CTA's other warps: ``tile, carried = receive(carried)``
        gives the tiles the drawing warp passes on, ``carried = body(m_block, seq, head,
        carried)`` runs each, until one past the last."""
        tile, carried = receive(carried)
        while tile < self.num_tiles():
            carried = body(*self.coords(tile), carried)
            tile, carried = receive(carried)
        return carried

    def tile(self) -> tuple:
        """This CTA's one tile (a grid of one CTA per tile)."""
        assert not self.persistent, "a persistent CTA takes its tiles from for_each_tile"
        if self.lpt:
            return self.coords(cute.arch.block_idx()[0])
        m_block, seq, head = cute.arch.block_idx()
        return longest_first(m_block, self.num_m_blocks, self.reverse), seq, head

    def coords(self, tile) -> tuple:
        """``(m_block, seq, head)`` of the ``tile``-th tile in launch order
        (``tile_order.tile_coords``; plain arithmetic, for DSL values or Python ints)."""
        group, seq, head = tile_coords(tile, self.num_m_blocks, self.num_seqs, self.num_heads,
                                       self.reverse, self.section if self.lpt else None,
                                       DSL_OPS)
        if cutlass.const_expr(self.cluster == 1):
            return group, seq, head
        return group * self.cluster + cluster_rank(), seq, head
