"""Which output tiles a CTA computes: the tile scheduler both forward kernels share.

An output tile is ``(m_block, seq, head)``: ``block_m`` query rows of one sequence (a batch
element or a packed sequence) and one query head. Two grids:

* **One CTA per tile** (the default): the grid is ``(m_blocks, seqs, heads)`` and the hardware
  hands out tiles in launch order.
* **Persistent** (the lab's ``persistent`` knob): ``num_ctas`` resident CTAs walk the tiles
  in that same launch order, CTA ``c`` taking tiles ``c, c + num_ctas, ...``; the row blocks
  of one head stay together, so they share its K/V in L2.

Either way a masked kernel takes its row blocks longest first (``longest_first``).
"""

import cutlass
import cutlass.cute as cute


def longest_first(m_block, num_m_blocks, windowed: bool):
    """The row block a CTA of grid index ``m_block`` takes: in masked kernels the last row
    blocks, which see the most keys under a causal band, start first, so the short ones fill
    the tail of the grid instead of the long ones."""
    return num_m_blocks - 1 - m_block if windowed else m_block


class TileScheduler:
    """The tiles of a launch, ``num_m_blocks x num_seqs x num_heads``, and how CTAs take
    them (built inside the kernel, or on the host for ``grid``)."""

    def __init__(self, num_m_blocks, num_seqs, num_heads, persistent: bool, windowed: bool):
        self.num_m_blocks = num_m_blocks
        self.num_seqs = num_seqs
        self.num_heads = num_heads
        self.persistent = persistent
        self.windowed = windowed

    def grid(self, num_ctas=None) -> tuple:
        """The launch grid: one CTA per tile, or ``num_ctas`` persistent CTAs."""
        if self.persistent:
            return (num_ctas, 1, 1)
        return (self.num_m_blocks, self.num_seqs, self.num_heads)

    @cute.jit
    def for_each_tile(self, body, between, carried):
        """``carried = body(m_block, seq, head, carried)`` for each tile of this CTA, in
        order, and ``between()`` after each tile of a persistent CTA (e.g. a barrier before the
        next tile reuses this one's shared memory). ``carried`` is what a CTA takes from one
        tile to the next (e.g. the position of its K/V ring); the last value is returned."""
        if cutlass.const_expr(self.persistent):
            first, _, _ = cute.arch.block_idx()
            stride, _, _ = cute.arch.grid_dim()
            num_tiles = self.num_m_blocks * self.num_seqs * self.num_heads
            for tile in cutlass.range(first, num_tiles, stride, unroll=1):
                carried = body(*self.coords(tile), carried)
                between()
        else:
            carried = body(*self.tile(), carried)
        return carried

    def tile(self) -> tuple:
        """This CTA's one tile (a grid of one CTA per tile)."""
        assert not self.persistent, "a persistent CTA takes its tiles from for_each_tile"
        return self._coords(*cute.arch.block_idx())

    def coords(self, tile) -> tuple:
        """``(m_block, seq, head)`` of the ``tile``-th tile in launch order (row blocks of a
        head together); plain arithmetic, for DSL values or Python ints."""
        return self._coords(tile % self.num_m_blocks,
                            (tile // self.num_m_blocks) % self.num_seqs,
                            tile // (self.num_m_blocks * self.num_seqs))

    def _coords(self, m_block, seq, head) -> tuple:
        return longest_first(m_block, self.num_m_blocks, self.windowed), seq, head
