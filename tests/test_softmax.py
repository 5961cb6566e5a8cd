"""The row-sum association of ``kernels.common.softmax.chained_sum`` (no GPU needed)."""

from __future__ import annotations

import pytest

from attnlab.kernels.common.softmax import chained_sum


class Node:
    """A term that records the depth of the dependent additions that produced it."""

    def __init__(self, value: float, depth: int = 0):
        self.value, self.depth = value, depth

    def __add__(self, other: Node) -> Node:
        return Node(self.value + other.value, max(self.depth, other.depth) + 1)


@pytest.mark.parametrize(("chains", "depth"), [(1, 15), (2, 8), (4, 5), (8, 4), (16, 4)])
def test_chains_shorten_the_dependent_fadds(chains, depth):
    """16 terms (a row of a 64-key tile in one thread): 15 additions whatever the chains;
    the longest dependent run is len/chains - 1 within a chain plus log2(chains) to join."""
    terms = [Node(float(2**i)) for i in range(16)]
    total = chained_sum(terms, chains)
    assert total.value == 2**16 - 1  # every term once (distinct powers of two)
    assert total.depth == depth


def test_more_chains_than_terms_is_a_tree():
    terms = [Node(float(i)) for i in range(5)]
    total = chained_sum(terms, 8)
    assert (total.value, total.depth) == (10.0, 3)
