"""The arithmetic of the tile order, without the DSL: the kernels trace it on DSL values
(``tile_scheduler``, ``mask``) and the host evaluates it on integers or CPU tensors, e.g. to
model how a persistent grid's CTAs share a launch's work (``snake_imbalance``) before
choosing the grid (``attnlab.dispatch``). Importing it does not import the CuTe DSL, whose
start-up the launch path of a cached kernel does not pay.

The functions take the integer operations they need (``IntOps``): Python's by default, the
DSL's in the kernels, torch's on tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class IntOps(NamedTuple):
    """``min``, ``max`` and a rounding-up division, for the values at hand."""

    minimum: Callable[[Any, Any], Any]
    maximum: Callable[[Any, Any], Any]
    ceil_div: Callable[[Any, Any], Any]


PYTHON_OPS = IntOps(min, max, lambda a, b: -(-a // b))


def longest_first(m_block, num_m_blocks, windowed: bool):
    """The row block a CTA of grid index ``m_block`` takes: in masked kernels the last row
    blocks, which see the most keys under a causal band, start first."""
    return num_m_blocks - 1 - m_block if windowed else m_block


def snake_tile(cta, ctas, wave):
    """The tile persistent CTA ``cta`` of ``ctas`` takes in wave ``wave``: its place, counted
    forwards in even waves and backwards in odd ones."""
    return wave * ctas + cta + (wave % 2) * (ctas - 1 - 2 * cta)


class TailShare(NamedTuple):
    """How a persistent CTA's walk ends with ``split_tail`` (``tail_share``): ``waves`` waves
    of whole tiles in the snake's order (the last may hold tiles past the end, which the CTA
    skips), then the K/V blocks ``[first, last)`` of the tiles from ``waves * ctas`` on,
    counted as one run of ``blocks`` per tile (empty where the tail is not split)."""

    waves: Any
    first: Any
    last: Any


def tail_share(cta, ctas, num_tiles, blocks, ops: IntOps = PYTHON_OPS) -> TailShare:
    """CTA ``cta``'s share of a launch of ``num_tiles`` tiles of ``blocks`` K/V blocks each,
    with the last two waves split (``FlashConfig.split_tail``). The whole waves leave a
    partial last wave of ``num_tiles % ctas`` tiles, where the CTAs without one idle; split,
    the last full wave and that partial one (``ctas`` to ``2 ctas - 1`` tiles) are dealt out
    as equal runs of K/V blocks, each at least a tile long, so a tile falls to at most two
    CTAs: the end of one run and the start of the next. Not split where nothing idles (no
    partial wave) or the share would be shorter than a tile (fewer tiles than CTAs)."""
    waves = num_tiles // ctas
    partial = num_tiles - waves * ctas
    split = ops.minimum(partial, 1) * ops.minimum(waves, 1)
    tail_blocks = split * (ctas + partial) * blocks
    # cta * tail_blocks // ctas without the product (it may pass 2^31 at long sequences).
    share, extra = tail_blocks // ctas, tail_blocks % ctas
    return TailShare(waves - split + (1 - split) * ops.minimum(partial, 1),
                     cta * share + cta * extra // ctas,
                     (cta + 1) * share + (cta + 1) * extra // ctas)


#: A unit's role in a ``split_tail`` walk (``tail_piece``): a whole tile; the later blocks of
#: a tile split between two CTAs (their partial result goes to scratch); its earlier blocks
#: (they merge that result and store the tile).
WHOLE, DONOR, FINISHER = 0, 1, 2


def tail_pieces(share: TailShare, blocks, ops: IntOps = PYTHON_OPS):
    """How many pieces (whole tiles or parts of one) a CTA's run of the tail holds."""
    runs = ops.minimum(share.last - share.first, 1)
    return runs * ((share.last - 1) // blocks - share.first // blocks + 1)


def tail_piece(position, share_last, blocks, ops: IntOps = PYTHON_OPS) -> tuple:
    """The piece of a tail run that starts at block ``position`` (counted as in
    ``TailShare``) of a run ending at ``share_last``: ``(tile, first, last, role)``, the
    tile counted from the tail's first and its K/V blocks ``[first, last)``. A run starts
    with a tile's later blocks (``DONOR``) and ends with a tile's earlier ones
    (``FINISHER``); a share is at least a tile long, so no piece is both."""
    tile = position // blocks
    first = position - tile * blocks
    last = ops.minimum(blocks, first + share_last - position)
    started = ops.minimum(first, 1)
    role = started * DONOR + (1 - started) * ops.minimum(blocks - last, 1) * FINISHER
    return tile, first, last, role


def heads_per_section(kv_rows, kv_row_bytes: int, heads_per_kv, section_bytes: int,
                      ops: IntOps = PYTHON_OPS):
    """Query heads of one L2 section: whole groups of ``heads_per_kv`` (the query heads that
    share a K/V head), as many K/V heads as fit in ``section_bytes`` (at least one; H100 and
    H200 have 50 MB of L2, part of which Q, O and the other traffic take). ``kv_rows``: keys
    per sequence; ``kv_row_bytes``: bytes of one key's K and V rows."""
    return ops.maximum(section_bytes // kv_row_bytes // kv_rows, 1) * heads_per_kv


def tile_coords(tile, num_m_blocks, num_seqs, num_heads, reverse: bool, section,
                ops: IntOps = PYTHON_OPS) -> tuple:
    """``(m_block, seq, head)`` of the ``tile``-th tile in launch order: by head (``section``
    None), or longest first over L2 sections of ``section`` query heads (``reverse``: the row
    blocks' lengths rise with their index, so the walk takes them backwards).

    When the pairs do not divide into whole sections, the narrower one goes first: its
    longest tiles then start with the launch, beside the next section's. Placed last, they
    started only once the other sections' tiles were handed out and ran on alone (the
    launch's tail): at causal hd128 seq 8k (32 pairs in sections of 5 heads, 2 left over)
    the backward's SMs idled 5.7 % of the kernel's time, which a greedy model of the
    dispatch predicts (``docs/backward.md``, step 21)."""
    if section is None:
        return (longest_first(tile % num_m_blocks, num_m_blocks, reverse),
                (tile // num_m_blocks) % num_seqs, tile // (num_m_blocks * num_seqs))
    # (sequence, head) pairs are numbered head fastest, so a section holds whole GQA groups
    # of one sequence (``pairs`` and ``section`` are multiples of a group).
    pairs = num_seqs * num_heads
    narrow = pairs - (pairs - 1) // section * section
    # 1 for a tile of the narrow section, else 0 (integer arithmetic: no select in the DSL).
    in_narrow = 1 - ops.minimum(tile // (narrow * num_m_blocks), 1)
    width = section + in_narrow * (narrow - section)
    after = tile - (1 - in_narrow) * narrow * num_m_blocks
    index = after // (width * num_m_blocks)
    first_pair = (1 - in_narrow) * narrow + index * width
    within = after - index * width * num_m_blocks
    pair = first_pair + within % width
    m_block = longest_first(within // width, num_m_blocks, reverse)
    return m_block, pair // num_heads, pair % num_heads


def kv_block_range(row0, seqlen_q, seqlen_k, left, right, block_m: int, block_n: int,
                   windowed: bool, ops: IntOps = PYTHON_OPS):
    """``[n_min, n_max)``: the K/V blocks some row of ``[row0, row0 + block_m)`` may attend
    (``kernels/common/mask.py`` has the band's definition)."""
    n_max = ops.ceil_div(seqlen_k, block_n)
    n_min = 0
    if windowed:
        off = seqlen_k - seqlen_q
        last_row = ops.minimum(row0 + block_m, seqlen_q) - 1
        # One past the last key any row of the tile sees; at most Sk, at least 0.
        end = ops.maximum(ops.minimum(last_row + off + right + 1, seqlen_k), 0)
        n_max = ops.ceil_div(end, block_n)
        n_min = ops.maximum(row0 + off - left, 0) // block_n
        n_min = ops.minimum(n_min, n_max)
    return n_min, n_max


def snake_imbalance(num_m_blocks: int, num_seqs: int, num_heads: int, reverse: bool,
                    section: int | None, ctas: int, blocks_of_row_block) -> float:
    """How much more work the busiest of ``ctas`` persistent CTAs walking the launch's tiles
    (``tile_coords``' order) as a snake gets than the average (1.0: even), a tile's work
    being its K/V blocks (``blocks_of_row_block(m_block)``). Every tile at once, in CPU
    tensors. The snake evens out tiles that shorten steadily through the launch, not a
    sawtooth of lengths that repeats with a period near a wave (e.g. 128 row blocks per head
    on 132 SMs)."""
    import torch

    def as_tensors(op):
        return lambda a, b: op(torch.as_tensor(a), torch.as_tensor(b))

    TORCH_OPS = IntOps(as_tensors(torch.minimum), as_tensors(torch.maximum), None)  # noqa: N806
    blocks = torch.tensor([blocks_of_row_block(m) for m in range(num_m_blocks)])
    total = num_m_blocks * num_seqs * num_heads
    waves = torch.arange(total // ctas + 1)[:, None]
    tiles = snake_tile(torch.arange(ctas)[None, :], ctas, waves)
    taken = tiles < total
    m_blocks = tile_coords(torch.where(taken, tiles, 0), num_m_blocks, num_seqs, num_heads,
                           reverse, section, TORCH_OPS)[0]
    loads = torch.where(taken, blocks[m_blocks], 0).sum(dim=0)
    return loads.max().item() * ctas / max(loads.sum().item(), 1)
