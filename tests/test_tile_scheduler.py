"""The tile scheduler's order, on Python ints (no GPU): what CTAs of a launch walk."""

from __future__ import annotations

import heapq

from hypothesis import given
from hypothesis import strategies as st

from attnlab.kernels.common import mask, tile_order
from attnlab.kernels.common.tile_order import snake_imbalance
from attnlab.kernels.common.tile_scheduler import (
    TileScheduler,
    heads_per_section,
    longest_first,
    snake_count,
    snake_tile,
)


def every_tile(m_blocks: int, seqs: int, heads: int) -> list[tuple[int, int, int]]:
    return sorted((m, s, h) for m in range(m_blocks) for s in range(seqs)
                  for h in range(heads))


@given(m_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       windowed=st.booleans(), lpt=st.booleans(), section=st.integers(1, 7),
       ctas=st.integers(1, 12))
def test_persistent_ctas_take_every_tile_once(m_blocks, seqs, heads, windowed, lpt, section,
                                              ctas):
    """The CTAs' snake over the waves takes every (m_block, seq, head) exactly once, each
    wave's tiles in increasing order over the CTAs when even and decreasing when odd."""
    scheduler = TileScheduler(m_blocks, seqs, heads, persistent=True, windowed=windowed,
                              lpt=lpt, section=section)
    total = scheduler.num_tiles()
    walks = [[snake_tile(c, ctas, w) for w in range(snake_count(c, ctas, total))]
             for c in range(ctas)]
    assert sorted(t for walk in walks for t in walk) == list(range(total))
    for c, walk in enumerate(walks):
        assert walk == sorted(walk) and all(t // ctas == w for w, t in enumerate(walk))
        assert all(t % ctas == (c if w % 2 == 0 else ctas - 1 - c) for w, t in enumerate(walk))
    taken = [scheduler.coords(t) for walk in walks for t in walk]
    assert sorted(taken) == every_tile(m_blocks, seqs, heads)


def test_snake_balances_tiles_sorted_longest_first():
    """Tiles of lengths falling through each wave: the snake's busiest CTA does less than a
    fixed stride's (CTA 0 would take the longest of every wave)."""
    ctas, lengths = 4, list(range(64, 0, -1))
    stride = max(sum(lengths[c::ctas]) for c in range(ctas))
    snake = max(sum(lengths[snake_tile(c, ctas, w)] for w in range(snake_count(c, ctas, 64)))
                for c in range(ctas))
    assert snake < stride and snake - sum(lengths) / ctas <= ctas


@given(m_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       windowed=st.booleans(), lpt=st.booleans())
def test_by_head_order_keeps_a_heads_row_blocks_together(m_blocks, seqs, heads, windowed,
                                                         lpt):
    """Without a mask ``lpt`` changes nothing; with one, a head's row blocks run longest
    first."""
    scheduler = TileScheduler(m_blocks, seqs, heads, persistent=False, windowed=windowed,
                              lpt=lpt and not windowed)
    in_order = [scheduler.coords(t) for t in range(scheduler.num_tiles())]
    first = list(reversed(range(m_blocks))) if windowed else list(range(m_blocks))
    assert in_order[:m_blocks] == [(m, 0, 0) for m in first]
    assert sorted(in_order) == every_tile(m_blocks, seqs, heads)
    assert scheduler.grid() == (m_blocks, seqs, heads)


@given(m_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       section=st.integers(1, 7))
def test_masked_order_is_longest_first_per_l2_section(m_blocks, seqs, heads, section):
    """Each section's pairs run row block by row block, the last (longest) first; sections
    cover consecutive (sequence, head) pairs, head fastest, the narrower one (pairs left
    over) first; every tile once."""
    scheduler = TileScheduler(m_blocks, seqs, heads, persistent=False, windowed=True,
                              lpt=True, section=section)
    assert scheduler.grid() == (m_blocks * seqs * heads, 1, 1)
    in_order = [scheduler.coords(t) for t in range(scheduler.num_tiles())]
    assert sorted(in_order) == every_tile(m_blocks, seqs, heads)
    pairs = [s * heads + h for _, s, h in in_order]
    total = seqs * heads
    start = 0
    while start < len(in_order):
        width = section if start else total - (-(-total // section) - 1) * section
        chunk = in_order[start:start + width * m_blocks]
        assert [m for m, _, _ in chunk] == [m for m in reversed(range(m_blocks))
                                            for _ in range(width)]
        assert sorted({s * heads + h for _, s, h in chunk}) == list(
            range(pairs[start], pairs[start] + width))
        start += width * m_blocks


def test_heads_per_section_fits_l2_in_whole_groups():
    row = 2 * 128 * 2  # K and V rows of hd128 in 16 bits: 2 MiB per head at 4k keys
    assert heads_per_section(4096, row, 1, 40 << 20) == 20
    assert heads_per_section(4096, row, 4, 40 << 20) == 4 * 20
    assert heads_per_section(4096, row, 1, 16 << 20) == 8
    # A K/V head larger than the section still makes a section of one group.
    assert heads_per_section(1 << 22, row, 8, 40 << 20) == 8


def test_grid_and_longest_first():
    assert TileScheduler(8, 2, 16, persistent=True, windowed=True).grid(132) == (132, 1, 1)
    assert [longest_first(m, 4, True) for m in range(4)] == [3, 2, 1, 0]
    assert [longest_first(m, 4, False) for m in range(4)] == [0, 1, 2, 3]


@given(n_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       lpt=st.booleans(), section=st.integers(1, 7))
def test_backward_order_takes_first_blocks_first(n_blocks, seqs, heads, lpt, section):
    """The backward's tiles (``first_is_longest``: under a causal band K/V block 0 sees the
    most query blocks) go in index order, with or without L2 sections, so a pair's blocks
    start in the order ``deterministic`` waits on; every tile once."""
    scheduler = TileScheduler(n_blocks, seqs, heads, persistent=False, windowed=True,
                              lpt=lpt, section=section, first_is_longest=True)
    in_order = [scheduler.coords(t) for t in range(scheduler.num_tiles())]
    assert sorted(in_order) == every_tile(n_blocks, seqs, heads)
    assert in_order[0] == (0, 0, 0)
    for pair in {(s, h) for _, s, h in in_order}:
        blocks = [n for n, s, h in in_order if (s, h) == pair]
        assert blocks == list(range(n_blocks))


def test_snake_imbalance_sees_the_sawtooth_of_a_heads_row_blocks():
    """Causal tiles (row block m sees m + 1 blocks) in the per-head order: even over 32 row
    blocks x 64 heads on 132 CTAs, over 1.5x the average over 128 row blocks x 16 heads (a
    sawtooth whose period is near a wave); equal tiles are even whatever the count; the
    longest-first order over one section of every head is even."""
    assert snake_imbalance(32, 1, 64, True, None, 132, lambda m: m + 1) <= 1.05
    assert snake_imbalance(128, 1, 16, True, None, 132, lambda m: m + 1) > 1.5
    assert snake_imbalance(128, 1, 16, True, None, 132, lambda m: 3) <= 1.05
    assert snake_imbalance(128, 1, 16, True, 16, 132, lambda m: m + 1) <= 1.05


@given(m_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       windowed=st.booleans(), lpt=st.booleans(), section=st.integers(1, 7),
       ctas=st.integers(1, 12))
def test_snake_imbalance_is_the_walk_of_the_kernels_order(m_blocks, seqs, heads, windowed,
                                                          lpt, section, ctas):
    """The host model (CPU tensors) sums the same tiles per CTA as the kernels' walk
    (``snake_tile``/``snake_count`` over ``TileScheduler.coords``) on Python ints."""
    scheduler = TileScheduler(m_blocks, seqs, heads, persistent=True, windowed=windowed,
                              lpt=lpt, section=section)
    total = scheduler.num_tiles()
    loads = [sum(scheduler.coords(snake_tile(c, ctas, w))[0] + 1
                 for w in range(snake_count(c, ctas, total))) for c in range(ctas)]
    model = snake_imbalance(m_blocks, seqs, heads, scheduler.reverse,
                            section if scheduler.lpt else None, ctas, lambda m: m + 1)
    assert abs(model - max(loads) * ctas / sum(loads)) < 1e-9


@given(row0=st.integers(0, 3000), seqlen_q=st.integers(1, 3000), seqlen_k=st.integers(1, 3000),
       left=st.integers(0, 4000), right=st.integers(0, 4000), windowed=st.booleans())
def test_the_kernels_block_range_is_the_hosts(row0, seqlen_q, seqlen_k, left, right, windowed):
    """``mask.kv_block_range`` (the DSL's operations, here on Python ints) and the host's
    ``tile_order.kv_block_range`` give the same blocks."""
    args = (row0, seqlen_q, seqlen_k, left, right, 128, 80, windowed)
    assert mask.kv_block_range(*args) == tile_order.kv_block_range(*args)


def dispatch_makespan(scheduler: TileScheduler, slots: int, work) -> float:
    """The hardware's dispatch of a one-CTA-per-tile launch, modelled greedily: tiles in
    grid order, each to the slot that frees first; the last slot's finish time over the
    average (1.0: no tail)."""
    free = [0.0] * slots
    total = 0.0
    for t in range(scheduler.num_tiles()):
        length = work(scheduler.coords(t)[0])
        total += length
        heapq.heappush(free, heapq.heappop(free) + length)
    return max(free) * slots / total


def test_the_narrow_section_first_leaves_no_tail():
    """The causal backward at hd128 seq 8k (32 pairs of 64 K/V blocks, K/V block j seeing
    128 - 2j query blocks; sections of 5 pairs, 2 left over) and seq 2k (128 pairs of 16,
    sections of 20) on 132 SMs: within 2 % of an even split. With the two pairs last the
    model (and ncu's SM-active cycles, 94.3 % of the elapsed) put the tail at 5.7 %."""
    for blocks, pairs, section in ((64, 32, 5), (16, 128, 20)):
        scheduler = TileScheduler(blocks, 1, pairs, persistent=False, windowed=True,
                                  lpt=True, section=section, first_is_longest=True)
        assert dispatch_makespan(scheduler, 132, lambda n, b=blocks: 2 * (b - n)) < 1.02


@given(tiles=st.integers(1, 700), ctas=st.integers(1, 140), blocks=st.integers(1, 40))
def test_split_tail_deals_every_block_once_in_pieces_of_two_ctas(tiles, ctas, blocks):
    """``split_tail``: the whole waves and the tail's runs cover every K/V block of every
    tile once; a tile split between two CTAs is the end of one run (``FINISHER``, its
    earlier blocks) and the start of the next CTA's (``DONOR``); the runs differ by at most
    a block; no split without a partial wave or with fewer tiles than CTAs (the snake)."""
    covered, runs = {}, []
    for cta in range(ctas):
        share = tile_order.tail_share(cta, ctas, tiles, blocks)
        for wave in range(share.waves):
            tile = snake_tile(cta, ctas, wave)
            if tile < tiles:
                covered.setdefault(tile, []).append((0, blocks, tile_order.WHOLE, cta))
        position, pieces = share.first, tile_order.tail_pieces(share, blocks)
        for _ in range(pieces):
            tile, first, last, role = tile_order.tail_piece(position, share.last, blocks)
            covered.setdefault(share.waves * ctas + tile, []).append((first, last, role, cta))
            position += last - first
        assert position == share.last
        runs.append(share.last - share.first)
    assert sorted(covered) == list(range(tiles))
    for pieces in covered.values():
        pieces.sort()
        assert [p[:2] for p in pieces] in ([(0, blocks)], [(0, pieces[0][1]),
                                                           (pieces[0][1], blocks)])
        if len(pieces) == 2:
            (_, _, finisher, cta), (_, _, donor, next_cta) = pieces
            assert (finisher, donor, next_cta) == (tile_order.FINISHER, tile_order.DONOR,
                                                    cta + 1)
        else:
            assert pieces[0][2] == tile_order.WHOLE
    split = tiles % ctas and tiles >= ctas
    assert (max(runs) > 0) == bool(split)
    if split:
        assert max(runs) - min(runs) <= 1 and min(runs) >= blocks
