"""The FlashAttention-2 online softmax, in the two forms the seeds compare (kernel 6).

Each thread holds some rows of the S = QK^T tile (one row is spread over a quad of 4 lanes).
Per K/V tile the running row max ``m`` and the per-thread partial row sum ``l`` are updated and
the O accumulator is rescaled by ``exp(m_old - m_new)``; the quad reduction of ``l`` is deferred
to the end (the sum is linear), the max is reduced every tile (it decides the exponent).

* unfused: ``s *= scale`` (FMUL), then ``exp(s - m)`` as ``exp2((s - m) * log2 e)``
  (FADD + FMUL + MUFU.EX2) per element.
* fused (the official implementation's trick): keep the raw max and evaluate
  ``exp2(s * scale_log2 - m * scale_log2)``; the per-row product is hoisted, leaving one FFMA +
  MUFU.EX2 per element. Requires ``scale > 0`` (the raw max is the max of the scaled row).
"""


import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.layouts import acc_mn_view

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


def quad_allreduce(value: cutlass.Float32, op) -> cutlass.Float32:
    """Reduce over the 4 lanes that share an accumulator row (butterfly shuffles 2 then 1)."""
    for offset in (2, 1):
        value = op(value, cute.arch.shuffle_sync_bfly(value, offset=offset))
    return value


def chained_sum(terms: list, chains: int) -> cutlass.Float32:
    """Sum ``terms`` in ``chains`` interleaved dependent chains, then add the chains
    pairwise: 1 is one chain (depth len(terms)), len(terms) a full tree (depth log2)."""
    partial = list(terms[:chains])
    for i in range(chains, len(terms)):
        partial[i % chains] = partial[i % chains] + terms[i]
    terms = partial
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


@dataclass
class OnlineSoftmax:
    """Running statistics of the rows this thread owns.

    A dataclass so the DSL can carry it through a dynamic ``for`` loop field by field.
    """

    row_max: cute.Tensor
    row_sum: cute.Tensor
    scale: cutlass.Float32
    scale_log2: cutlass.Float32
    fused: cutlass.Constexpr
    #: Rows may see no key at all (windows, empty sequences): keep -inf maxima out of exp2
    #: and zero sums out of the division. Off for plain attention, whose SASS stays lean.
    guard_empty_rows: cutlass.Constexpr
    #: Independent FADD chains per row sum (``chained_sum``); 1: ``reduce``'s single chain.
    sum_chains: cutlass.Constexpr = 1

    @classmethod
    def create(cls, num_rows: int, softmax_scale: cutlass.Float32, fused: bool,
               guard_empty_rows: bool, sum_chains: int = 1) -> "OnlineSoftmax":
        row_max = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        return cls(row_max, row_sum, softmax_scale, softmax_scale * LOG2_E, fused,
                   guard_empty_rows, sum_chains)

    @cute.jit
    def update(self, acc_s: cute.Tensor, acc_o: cute.Tensor, first: cutlass.Constexpr = False):
        """Turn the S tile into P (in place) and rescale O for the new row maxima.

        ``first``: the CTA's first tile (kernel 10): the statistics start from this tile
        and O, still empty, needs no rescale.
        """
        s_mn = acc_mn_view(acc_s)
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            row = s_mn[r, None].load()
            if cutlass.const_expr(not self.fused):
                row = row * self.scale
            tile_max = quad_allreduce(
                row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), cute.arch.fmax
            )
            m_old = self.row_max[r]
            m_new = tile_max if first else cute.arch.fmax(m_old, tile_max)
            # A row with every key masked so far: subtract 0, not -inf (exp2(-inf + inf) = NaN).
            m_exp = m_new
            if cutlass.const_expr(self.guard_empty_rows):
                m_exp = cutlass.Float32(0.0) if m_new == -cutlass.Float32.inf else m_new
            if cutlass.const_expr(self.fused):
                max_scaled = m_exp * self.scale_log2
                p = cute.math.exp2(row * self.scale_log2 - max_scaled, fastmath=True)
                correction = cute.math.exp2(m_old * self.scale_log2 - max_scaled, fastmath=True)
            else:
                p = cute.math.exp2((row - m_exp) * LOG2_E, fastmath=True)
                correction = cute.math.exp2((m_old - m_exp) * LOG2_E, fastmath=True)
            self.row_max[r] = m_new
            s_mn[r, None] = p
            if cutlass.const_expr(self.sum_chains > 1):
                terms = []
                for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                    terms.append(s_mn[r, c])
                tile_sum = chained_sum(terms, self.sum_chains)
            else:
                # The ladder rows were measured (and their SASS recorded) with this chain.
                tile_sum = p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
            if cutlass.const_expr(first):
                self.row_sum[r] = tile_sum
            else:
                self.row_sum[r] = self.row_sum[r] * correction + tile_sum
                o_mn[r, None] = o_mn[r, None].load() * correction

    @cute.jit
    def finalize(self, acc_o: cute.Tensor, lse: cute.Tensor):
        """Normalise O by the row sums and write each row's natural-log LSE into ``lse``."""
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            total = quad_allreduce(self.row_sum[r], lambda a, b: a + b)
            inverse = cute.arch.rcp_approx(total)
            if cutlass.const_expr(self.guard_empty_rows):
                # No key: O stays 0 (not 0 * inf) and the LSE below is log(0) = -inf.
                inverse = cutlass.Float32(0.0) if total == 0.0 else inverse
            o_mn[r, None] = o_mn[r, None].load() * inverse
            max_term = self.row_max[r]
            if cutlass.const_expr(self.fused):
                max_term = max_term * self.scale
            lse[r] = max_term + cute.math.log2(total, fastmath=True) * LN_2
