"""The sm80 kernel's TMA ring bookkeeping, against a model of its mbarriers (no GPU).

A persistent CTA initialises its K/V barriers once and walks many output tiles; each tile loads
its K/V blocks into alternating stages, and every wait must name the parity of the phase that
the block's own load completes. ``tma_wait_parity`` and ``phases_after_tile`` are the plain
arithmetic the kernel traces; here they run on Python ints against a per-stage completion count.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.kernels.sm80.forward import phases_after_tile, tma_wait_parity

#: A tile: (first K/V block, number of blocks), as causal and windowed row blocks make them.
TILES = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 9)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(tiles=TILES, stages=st.sampled_from([1, 2]), reverse=st.booleans())
def test_waits_name_the_phase_their_load_completes(tiles, stages, reverse):
    completions = [0] * stages  # per stage, over the CTA's life: the barrier's state
    phases = 0
    for n_min, blocks in tiles:
        order = list(range(n_min, n_min + blocks))[::-1 if reverse else 1]
        for i, n_block in enumerate(order):
            stage = n_block % stages
            completions[stage] += 1  # this block's load lands: it completes one phase
            expected = (completions[stage] - 1) % 2
            assert tma_wait_parity(i, stage, stages, phases) == expected
        first_stage = order[0] % stages if order else 0
        phases = phases_after_tile(phases, first_stage, blocks, stages)
        assert phases == sum((c % 2) << s for s, c in enumerate(completions))


def test_a_single_tile_needs_no_carried_phases():
    """A CTA of one tile (no ``phases``) waits for the i-th completion of its stage."""
    assert [tma_wait_parity(i, i % 2, 2) for i in range(6)] == [0, 0, 1, 1, 0, 0]
    assert [tma_wait_parity(i, 0, 1) for i in range(4)] == [0, 1, 0, 1]
    # A later tile of a persistent CTA whose stage 1 completed an odd number of times.
    assert [tma_wait_parity(i, (i + 1) % 2, 2, 0b10) for i in range(4)] == [1, 0, 0, 1]
