"""The decoding kernel's K/V blocks by the TMA unit (sm_90a; ``DecodeSpec.tma_rows``).

The ``cp.async`` path copies every K/V row by itself: 16 bytes a thread per copy, with each
row's address (its page entry times the page stride, plus the row) worked out in the warps
that also run the softmax. Here one elected thread of warp 0 hands the whole block to the TMA
unit in boxes of ``rows`` keys by one swizzle atom's columns, on the stage's transaction
barrier, and the four warps only wait for it:

* a contiguous cache (``[B_cache, S_cache, Hkv, D]``): boxes of the whole block (``rows`` =
  ``block_n``), at the block's row of the sequence's cache row;
* a paged cache (``[pages, page_size, Hkv, D]``): boxes of a page where pages are shorter than
  a block (``rows`` = ``page_size``, ``block_n / rows`` pages a block), else of the block
  inside its page (``rows`` = ``block_n``, ``page_size`` a multiple of it); each box at
  its page from ``block_table``, read a block ahead so the lookup is not waited for.

Boxes wholly past the sequence are not issued (a paged sequence has no page there) and the
barrier expects only the bytes issued. What a box holds past the sequence (the rest of a
contiguous cache's row, stale rows of an earlier block in a skipped box) is masked in S, and
the consumers zero it in V (``FlashDecode._zero_rows_past``): a masked key's P is 0, and
0 times a NaN in unused cache memory would not be.
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from attnlab.kernels.common.layouts import atom_cols, tma_swizzle
from attnlab.kernels.common.tma import rows_first


def make_box_loads(k_cache: cute.Tensor, v_cache: cute.Tensor, rows: int,
                   head_dim: int) -> tuple:
    """``(atom, coordinate tensor)`` of K and of V for boxes of ``rows`` keys by one swizzle
    atom's columns (host side, at launch)."""
    cols = atom_cols(head_dim)
    one_box = cute.make_composed_layout(tma_swizzle(head_dim), 0,
                                        cute.make_layout((rows, cols), stride=(cols, 1)))
    op = cpasync.CopyBulkTensorTileG2SOp()
    return tuple(tuple(cpasync.make_tiled_tma_atom(op, rows_first(cache), one_box,
                                                   (rows, cols)))
                 for cache in (k_cache, v_cache))


class BoxLoads:
    """One CTA's K/V boxes, for the functions below (which take it as an argument: the DSL
    carries a method call's receiver through a run-time ``if`` or ``for`` as a value, which a
    plain object cannot be). ``kv_tma`` from ``make_box_loads``, ``smem`` the (K, V) rings
    as ``(block_n, D, stages)`` with the swizzle on the pointer (as TMA partitions take it),
    ``bars`` one transaction barrier per stage, ``pages`` the page size's divisor (paged) or
    None."""

    def __init__(self, kv_tma: tuple, smem: tuple, bars: cute.Pointer, rows: int,
                 block_n: int, head_dim: int, element_bytes: int, pages):
        self.kv_tma, self.smem, self.bars = kv_tma, smem, bars
        self.rows, self.block_n, self.head_dim = rows, block_n, head_dim
        self.cols = atom_cols(head_dim)
        self.boxes = block_n // rows
        self.box_bytes = rows * head_dim * element_bytes
        self.pages = pages


@cute.jit
def init_barriers(loads: BoxLoads, stages: cutlass.Constexpr, tidx):
    """One arrival (the issuing thread's) per stage's phase, before any box signals."""
    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(loads.bars + s, 1)
    cute.arch.mbarrier_init_fence()


@cute.jit
def locate(loads: BoxLoads, located: cute.Tensor, block_table, batch, n_block, seqlen_k):
    """The page of each of block ``n_block``'s boxes (paged; 0 past the sequence), read a
    block before the boxes are issued."""
    for j in cutlass.range_constexpr(loads.boxes):
        key = n_block * loads.block_n + j * loads.rows
        located[j] = 0
        if key < seqlen_k:
            index, _ = divmod(key, loads.pages)
            located[j] = block_table[batch, index]


@cute.jit
def issue(loads: BoxLoads, located: cute.Tensor | None, n_block, stage, head_kv, cache_row,
          seqlen_k):
    """Block ``n_block``'s boxes of K and V into ring stage ``stage``, on its barrier (called
    by all of warp 0: one lane arms the barrier, each copy elects its own)."""
    bar = loads.bars + stage
    first = n_block * loads.block_n
    issued = cutlass.min(cute.ceil_div(seqlen_k - first, loads.rows), loads.boxes)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bar, issued * 2 * loads.box_bytes)
    box = (loads.rows, loads.cols)
    for (atom, coords), smem in zip(loads.kv_tma, loads.smem, strict=True):
        to_boxes = cute.local_tile(smem[None, None, stage], box, (None, None))
        for j in cutlass.range_constexpr(loads.boxes):
            if j < issued:
                key = first + j * loads.rows
                where, row_box = cache_row, key // loads.rows
                if cutlass.const_expr(located is not None):
                    # The box's rows within its page: the page starts at a box boundary.
                    _, in_page = divmod(key, loads.pages)
                    where, row_box = located[j], in_page // loads.rows
                from_boxes = cute.local_tile(coords[None, None, head_kv, where], box,
                                             (None, None))
                to_smem, from_gmem = cpasync.tma_partition(
                    atom, 0, cute.make_layout(1), cute.group_modes(to_boxes, 0, 2),
                    cute.group_modes(from_boxes, 0, 2))
                for c in cutlass.range_constexpr(loads.head_dim // loads.cols):
                    cute.copy(atom, from_gmem[None, row_box, c], to_smem[None, j, c],
                              tma_bar_ptr=bar)


@cute.jit
def wait(loads: BoxLoads, it, stage, stages: cutlass.Constexpr):
    """Until the ``it``-th block of this CTA's walk (in ``stage``) has landed: its stage's
    ``it // stages``-th completion."""
    cute.arch.mbarrier_wait(loads.bars + stage, (it // stages) % 2)
