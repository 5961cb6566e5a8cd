"""Which keys a query row may attend: the Sk tail, and a band around the diagonal.

Windows follow FlashAttention-2: with ``off = Sk - Sq`` (the diagonal is bottom-right aligned),
row ``i`` attends key ``j`` iff ``i + off - left <= j <= i + off + right``; causal is
``(left, right) = (unbounded, 0)``. The host passes an unbounded side as
``kernels.abi.UNBOUNDED_SIDE``, a number larger than any sequence, so the same arithmetic serves
every case without branches.

Three uses: the K/V block range of a CTA (blocks wholly outside the band are never loaded), the
block bounds that split the main loop into masked and unmasked phases (``phase_bounds``,
``phase_masked``: one loop per phase, FA2's split, so the unmasked middle runs a body with no
mask code at all), and the element mask, which only blocks crossing a band edge or the Sk tail
pay for. (The order of row blocks that follows from the band is the tile scheduler's.)
"""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common import tile_order
from attnlab.kernels.common.layouts import acc_mn_view
from attnlab.kernels.common.tile_scheduler import DSL_OPS


def kv_block_range(row0, seqlen_q, seqlen_k, left, right, block_m: int, block_n: int,
                   windowed: bool):
    """``[n_min, n_max)``: the K/V blocks some row of ``[row0, row0 + block_m)`` may attend
    (``tile_order.kv_block_range`` on DSL values)."""
    return tile_order.kv_block_range(row0, seqlen_q, seqlen_k, left, right, block_m, block_n,
                                     windowed, DSL_OPS)


def masked_block_bounds(row0, seqlen_q, seqlen_k, left, right, n_min, n_max, block_m: int,
                        block_n: int, windowed: bool):
    """``(left_end, right_start)``: blocks in ``[n_min, left_end)`` cross the window's left
    edge and blocks in ``[right_start, n_max)`` cross its right edge or the Sk tail; the blocks
    between need no mask. ``n_min <= left_end <= right_start <= n_max``.
    """
    off = seqlen_k - seqlen_q
    # Right edge: the tile's first row sees the fewest keys; past Sk everything is masked.
    fully_left_of = seqlen_k
    if windowed:
        fully_left_of = cutlass.min(seqlen_k, cutlass.max(row0 + off + right + 1, 0))
    right_start = cutlass.max(cutlass.min(fully_left_of // block_n, n_max), n_min)
    left_end = n_min
    if windowed:
        # Left edge: the tile's last row sees the fewest keys on the left.
        first_visible = cutlass.max(row0 + block_m - 1 + off - left, 0)
        left_end = cutlass.max(cutlass.min(cute.ceil_div(first_visible, block_n),
                                           right_start), n_min)
    return left_end, right_start


def phase_bounds(n_min, left_end, right_start, n_max, windowed: bool,
                 reverse: bool = False) -> list:
    """The main loop's phases as ``(lo, hi)`` block ranges, in walk order: the band's left
    edge (windowed only), the unmasked middle, the right edge and the Sk tail; ``reverse``
    walks the K/V blocks from the last (kernel 13)."""
    bounds = [(n_min, left_end)] if windowed else []
    bounds += [(left_end, right_start), (right_start, n_max)]
    return bounds[::-1] if reverse else bounds


def phase_masked(windowed: bool, phase: int, reverse: bool = False) -> bool:
    """Whether phase ``phase`` of ``phase_bounds`` runs the masked loop body. (A function,
    not a local tuple: the DSL turns Python locals seen by a loop dynamic.)"""
    masks = (True, False, True) if windowed else (False, True)
    return (masks[::-1] if reverse else masks)[phase]


#: Columns per keep-mask word (``apply_mask``'s ``paired_columns`` path).
MASK_WORD = 32


@cute.jit
def _element_count(limit, ncols: cutlass.Constexpr):
    """How many of a thread's row elements lie left of column offset ``limit`` (relative to
    its first element) when its columns come in pairs every 8: offsets 0, 1, 8, 9, 16, ..."""
    rel = cutlass.max(limit, 0)
    return cutlass.min(rel // 8 * 2 + cutlass.min(rel % 8, 2), ncols)


@cute.jit
def _keep_word(first, last, word: cutlass.Constexpr) -> cutlass.Uint32:
    """Bits ``i`` of word ``word`` with ``first <= word * 32 + i < last`` (64-bit shifts: a
    shift by 32 is defined there)."""
    hi = cutlass.min(cutlass.max(last - word * MASK_WORD, 0), MASK_WORD)
    lo = cutlass.min(cutlass.max(first - word * MASK_WORD, 0), MASK_WORD)
    one = cutlass.Uint64(1)
    below = (one << cutlass.Uint64(hi)) - one
    under = (one << cutlass.Uint64(lo)) - one
    return cutlass.Uint32(below & ~under)


@cute.jit
def apply_mask(acc_S: cute.Tensor, tScS_mn: cute.Tensor, row0: cutlass.Int32,
               col0: cutlass.Int32, seqlen_q: cutlass.Int32, seqlen_k: cutlass.Int32,
               left: cutlass.Int32, right: cutlass.Int32, windowed: cutlass.Constexpr,
               paired_columns: cutlass.Constexpr = False,
               relative_columns: cutlass.Constexpr = False):
    """Set masked scores of the tile to -inf (``tScS_mn``: local (row, col) of each element).

    ``paired_columns``: a thread's columns are pairs every 8 (a ``wgmma`` accumulator): a
    windowed row's band then becomes a keep mask per 32 elements (two shifts), and each
    element costs one select on a bit of it (ptxas moves the bits to predicates with R2P),
    where the compares cost two compares and two selects an element (FA4's R2P mask).

    ``relative_columns`` (the compares): each column taken relative to the thread's first,
    so that its offset is a constant of the layout (an immediate in the compare), not a
    register held per column: what the backward's masked bodies needed to spill nothing
    (step 18); the forward's tiles spilled more with it (the ``mma.sync`` hd96 window)."""
    s_mn = acc_mn_view(acc_S)
    first_col = tScS_mn[0, 0][1]
    # What the compares subtract from each column (a Python 0 folds away).
    shift = first_col if relative_columns else 0
    if cutlass.const_expr(windowed and paired_columns):
        base = row0 + seqlen_k - seqlen_q - col0
        ncols = cute.size(s_mn, mode=[1])
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            row = tScS_mn[r, 0][0]
            hi = cutlass.min(base + row + right + 1, seqlen_k - col0)
            first = _element_count(base + row - left - first_col, ncols)
            last = _element_count(hi - first_col, ncols)
            for word in cutlass.range_constexpr(cute.ceil_div(ncols, MASK_WORD)):
                keep = _keep_word(first, last, word)
                for i in cutlass.range_constexpr(min(MASK_WORD, ncols - word * MASK_WORD)):
                    c = word * MASK_WORD + i
                    kept = cutlass.Boolean(keep & (cutlass.Uint32(1) << i))
                    s_mn[r, c] = s_mn[r, c] if kept else -cutlass.Float32.inf
    elif cutlass.const_expr(not windowed):
        cols_left = seqlen_k - col0 - shift
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if tScS_mn[0, c][1] - shift >= cols_left:
                for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                    s_mn[r, c] = -cutlass.Float32.inf
    else:
        # Per row: keys [lo, hi) relative to the tile's first column (or the thread's).
        base = row0 + seqlen_k - seqlen_q - col0 - shift
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            row = tScS_mn[r, 0][0]
            hi = cutlass.min(base + row + right + 1, seqlen_k - col0 - shift)
            lo = base + row - left
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                col = tScS_mn[0, c][1] - shift
                if col >= hi:
                    s_mn[r, c] = -cutlass.Float32.inf
                if col < lo:
                    s_mn[r, c] = -cutlass.Float32.inf


# The backward's transposed frame: rows are keys, columns queries. Row j sees query i iff
# j - off - right <= i <= j - off + left: the forward's band with the roles of Sq/Sk and of
# left/right exchanged, so the same three functions serve it with their arguments swapped.
def query_block_range(key0, seqlen_q, seqlen_k, left, right, block_n: int, block_m: int,
                      windowed: bool):
    """``[m_min, m_max)``: the query blocks that see some key of ``[key0, key0 + block_n)``."""
    return kv_block_range(key0, seqlen_k, seqlen_q, right, left, block_n, block_m, windowed)


@cute.jit
def masked_query_bounds(key0, seqlen_q, seqlen_k, left, right, m_min, m_max,
                        block_n: cutlass.Constexpr, block_m: cutlass.Constexpr,
                        windowed: cutlass.Constexpr):
    """:func:`masked_block_bounds` of a K/V block's query walk; every block is masked when the
    K/V block runs past Sk (its zero-filled keys would otherwise get a probability)."""
    left_end, right_start = masked_block_bounds(key0, seqlen_k, seqlen_q, right, left, m_min,
                                                m_max, block_n, block_m, windowed)
    if key0 + block_n > seqlen_k:
        left_end = m_min
        right_start = m_min
    return left_end, right_start


@cute.jit
def apply_mask_transposed(acc_St: cute.Tensor, tScS_mn: cute.Tensor, key0: cutlass.Int32,
                          query0: cutlass.Int32, seqlen_q: cutlass.Int32,
                          seqlen_k: cutlass.Int32, left: cutlass.Int32, right: cutlass.Int32,
                          windowed: cutlass.Constexpr, paired_columns: cutlass.Constexpr = False):
    """:func:`apply_mask` on S^T (``tScS_mn``: local (key, query) of each element), and the
    keys past Sk."""
    apply_mask(acc_St, tScS_mn, key0, query0, seqlen_k, seqlen_q, right, left, windowed,
               paired_columns, relative_columns=True)
    s_mn = acc_mn_view(acc_St)
    keys_left = seqlen_k - key0
    for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
        if tScS_mn[r, 0][0] >= keys_left:
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                s_mn[r, c] = -cutlass.Float32.inf
