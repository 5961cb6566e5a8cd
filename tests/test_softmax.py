"""The row-sum association of ``kernels.common.softmax.chained_sum`` and the arithmetic of
``kernels.common.exp2_fma`` (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.kernels.common.exp2_fma import POLY, ROUND_MAGIC
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


def exp2_fma_model(x: np.ndarray) -> np.ndarray:
    """``exp2_fma``'s steps in fp32 on the host: the clamp, the FADD rounding down (exact here:
    floor(x) + ROUND_MAGIC is an integer of the magic's binade), the fraction, Horner, the
    low bits shifted into an exponent field, the product."""
    x = np.maximum(x.astype(np.float32), np.float32(-127.0))
    x = np.where(np.isnan(x), np.float32(np.nan), x)  # max.NaN keeps a NaN
    with np.errstate(invalid="ignore"):
        rounded = (np.floor(x) + np.float32(ROUND_MAGIC)).astype(np.float32)
    fraction = x - (rounded - np.float32(ROUND_MAGIC))
    value = np.float32(POLY[-1])
    for coefficient in reversed(POLY[:-1]):
        value = (value * fraction + np.float32(coefficient)).astype(np.float32)
    bits = rounded.view(np.uint32).astype(np.uint64) << np.uint64(23)
    power = (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return value * power


def test_exp2_fma_is_within_a_tenth_of_a_bf16_ulp():
    x = np.linspace(-126.0, 0.5, 2_000_003, dtype=np.float32)
    exact = np.exp2(x.astype(np.float64))
    rel = np.abs(exp2_fma_model(x) / exact - 1.0)
    assert rel.max() < 1e-4        # a bf16 half-ulp is 2e-3, an fp16 one 4.9e-4
    assert rel.max() > 1e-6        # a degree-3 polynomial, not exact: the model ran


def test_exp2_fma_edges():
    out = exp2_fma_model(np.array([-np.inf, -200.0, -127.5, 0.0, -1.0, 5.0, np.nan],
                                  dtype=np.float32))
    assert out[0] == 0.0 and out[1] == 0.0 and out[2] == 0.0  # masked scores weigh nothing
    assert out[3] == 1.0 and out[4] == 0.5 and out[5] == 32.0  # integers exact: p(0) = 1
    assert np.isnan(out[6])
