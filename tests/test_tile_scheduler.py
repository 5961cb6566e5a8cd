"""The tile scheduler's order, on Python ints (no GPU): what a persistent CTA walks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from attnlab.kernels.common.tile_scheduler import TileScheduler, longest_first


@given(m_blocks=st.integers(1, 9), seqs=st.integers(1, 4), heads=st.integers(1, 5),
       windowed=st.booleans(), ctas=st.integers(1, 12))
def test_persistent_ctas_take_every_tile_once(m_blocks, seqs, heads, windowed, ctas):
    """CTA c takes tiles c, c + ctas, ...: together every (m_block, seq, head) exactly once;
    the row blocks of one head are consecutive, and under a mask the longest (last) first."""
    scheduler = TileScheduler(m_blocks, seqs, heads, persistent=True, windowed=windowed)
    total = m_blocks * seqs * heads
    walks = [[scheduler.coords(t) for t in range(c, total, ctas)] for c in range(ctas)]
    taken = [tile for walk in walks for tile in walk]
    assert sorted(taken) == [(m, s, h) for m in range(m_blocks) for s in range(seqs)
                             for h in range(heads)]
    in_order = [scheduler.coords(t) for t in range(total)]
    first_head = [m for m, s, h in in_order[:m_blocks]]
    assert first_head == (list(range(m_blocks))[::-1] if windowed else list(range(m_blocks)))
    assert {(s, h) for _, s, h in in_order[:m_blocks]} == {(0, 0)}


def test_grid_and_longest_first():
    plain = TileScheduler(8, 2, 16, persistent=False, windowed=False)
    assert plain.grid() == (8, 2, 16)
    assert TileScheduler(8, 2, 16, persistent=True, windowed=True).grid(132) == (132, 1, 1)
    assert [longest_first(m, 4, True) for m in range(4)] == [3, 2, 1, 0]
    assert [longest_first(m, 4, False) for m in range(4)] == [0, 1, 2, 3]
