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

``update`` does a whole tile at once. ``rescale`` + ``exponentiate`` are the same step in two
halves, so a kernel can exponentiate one slice of columns at a time between other work
(``FlashConfig.interleave_softmax``); ``step`` + ``rescale_o`` split it the other way, P first
and O's rescale later, once the MMAs that read O are done (``FlashConfig.intra_wg_overlap``).

Lazy rescaling (``FlashConfig.lazy_rescale``, FlashAttention-4's on Blackwell): a row keeps its
old maximum while the new one exceeds it by at most ``LAZY_RESCALE_LOG2`` in the exponent's
(log2) units, so P may reach ``2**LAZY_RESCALE_LOG2`` (256: within fp16's and bf16's range,
and exact in the result: the row sum carries the same factor); the row's correction is then
exactly 1, and ``rescale_o`` skips a warp's multiplies when every row it holds kept its
maximum. On random data a row's maximum settles within the first block or two, so the O
rescale (D / 2 multiplies per thread and block at B_r 64) nearly always drops out.
"""


import math
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.layouts import acc_mn_view

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
#: How far (log2 units of the exponent) a row's maximum may grow before ``lazy`` rescales.
LAZY_RESCALE_LOG2 = 8.0


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
    #: Keep a row's maximum while it grows by at most ``LAZY_RESCALE_LOG2`` (module
    #: docstring); ``step`` and ``rescale_o`` only.
    lazy: cutlass.Constexpr = False
    #: Each row's sum starts from the old sum times its correction
    #: (``FlashConfig.correction_first``; ``_row_update``).
    correction_first: cutlass.Constexpr = False

    @classmethod
    def create(cls, num_rows: int, softmax_scale: cutlass.Float32, fused: bool,
               guard_empty_rows: bool, sum_chains: int = 1, lazy: bool = False,
               correction_first: bool = False) -> "OnlineSoftmax":
        row_max = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        return cls(row_max, row_sum, softmax_scale, softmax_scale * LOG2_E, fused,
                   guard_empty_rows, sum_chains, lazy, correction_first)

    @cute.jit
    def update(self, acc_s: cute.Tensor, acc_o: cute.Tensor, first: cutlass.Constexpr = False):
        """Turn the S tile into P (in place) and rescale O for the new row maxima.

        ``first``: the CTA's first tile (kernel 10): the statistics start from this tile
        and O, still empty, needs no rescale.
        """
        s_mn = acc_mn_view(acc_s)
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            correction = self._row_update(s_mn, r, first)
            if cutlass.const_expr(not first):
                o_mn[r, None] = o_mn[r, None].load() * correction

    @cute.jit
    def step(self, acc_s: cute.Tensor, corrections: cute.Tensor):
        """``update`` without O (``intra_wg_overlap``): P in place of S and the statistics
        moved to the tile's maxima, the factor each row of O must be rescaled by written to
        ``corrections``; ``rescale_o`` applies it once nothing reads O any more."""
        s_mn = acc_mn_view(acc_s)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            corrections[r] = self._row_update(s_mn, r, False)

    @cute.jit
    def rescale_o(self, acc_o: cute.Tensor, corrections: cute.Tensor):
        """O's rows times the ``corrections`` of ``step``; with ``lazy``, only in a warp where
        some row moved its maximum (a warp-uniform branch around the multiplies)."""
        if cutlass.const_expr(self.lazy):
            moved = corrections[0] != 1.0
            for r in cutlass.range_constexpr(1, cute.size(self.row_max)):
                moved = moved | (corrections[r] != 1.0)
            if cute.arch.vote_any_sync(moved):
                self._multiply_o(acc_o, corrections)
        else:
            self._multiply_o(acc_o, corrections)

    @cute.jit
    def _multiply_o(self, acc_o: cute.Tensor, corrections: cute.Tensor):
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            o_mn[r, None] = o_mn[r, None].load() * corrections[r]

    def _row_update(self, s_mn: cute.Tensor, r: int, first: bool):
        """Row ``r`` of the tile: P in place of S, the row's max and sum updated; returns
        the factor O's row must be rescaled by (unused for the first tile).

        With ``correction_first`` (one chain, not the first tile) the row's sum starts from
        the old sum times the correction instead of adding the tile's sum to it at the end.
        Needed first, the correction's exp2 is issued ahead of P's (the ``MUFU`` queue is in
        order), so ``step``'s caller can rescale O under P's exponentials instead of after
        the last of them."""
        row = self._scores(s_mn[r, None].load())
        m_old = self.row_max[r]
        m_new = self._new_max(row, m_old, first)
        lazy = self.lazy and not first
        keep = self._keeps_max(m_old, m_new) if lazy else None
        if cutlass.const_expr(lazy):
            m_new = self._select(keep, m_old, m_new)
        m_exp = self._exponent_max(m_new)
        p = self._exp(row, m_exp)
        correction = self._exp(m_old, m_exp)
        if cutlass.const_expr(lazy):
            # Exactly 1 (the exponent's FFMA would leave the rounding of m * scale_log2), so
            # ``rescale_o`` can tell a kept row.
            correction = self._select(keep, cutlass.Float32(1.0), correction)
        self.row_max[r] = m_new
        s_mn[r, None] = p
        if cutlass.const_expr(self.correction_first and self.sum_chains == 1 and not first):
            self.row_sum[r] = p.reduce(cute.ReductionOp.ADD, self.row_sum[r] * correction, 0)
            return correction
        if cutlass.const_expr(self.sum_chains > 1):
            tile_sum = self._sum(s_mn, r, 0, cute.size(s_mn, mode=[1]))
        else:
            # The ladder rows were measured (and their SASS recorded) with this chain.
            tile_sum = p.reduce(cute.ReductionOp.ADD, cutlass.Float32.zero, 0)
        if cutlass.const_expr(first):
            self.row_sum[r] = tile_sum
        else:
            self.row_sum[r] = self.row_sum[r] * correction + tile_sum
        return correction

    @cute.jit
    def rescale(self, acc_s: cute.Tensor, acc_o: cute.Tensor, first: cutlass.Constexpr = False):
        """``update`` split in two (``interleave_softmax``), first half: the new row maxima
        from the raw S tile, and O and the row sums rescaled to them. ``exponentiate`` then
        turns S into P a few columns at a time."""
        s_mn = acc_mn_view(acc_s)
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            m_old = self.row_max[r]
            m_new = self._new_max(self._scores(s_mn[r, None].load()), m_old, first)
            self.row_max[r] = m_new
            if cutlass.const_expr(first):
                self.row_sum[r] = cutlass.Float32(0.0)
            else:
                correction = self._exp(m_old, self._exponent_max(m_new))
                self.row_sum[r] = self.row_sum[r] * correction
                o_mn[r, None] = o_mn[r, None].load() * correction

    @cute.jit
    def exponentiate(self, acc_s: cute.Tensor, col0: cutlass.Constexpr,
                     cols: cutlass.Constexpr):
        """The second half: P in place of S for columns ``col0 .. col0 + cols`` of this
        thread's rows (after ``rescale``), their sums added to the row sums."""
        s_mn = acc_mn_view(acc_s)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            m_exp = self._exponent_max(self.row_max[r])
            for c in cutlass.range_constexpr(col0, col0 + cols):
                s_mn[r, c] = self._exp(self._scores(s_mn[r, c]), m_exp)
            self.row_sum[r] = self.row_sum[r] + self._sum(s_mn, r, col0, cols)

    @cute.jit
    def _keeps_max(self, m_old, m_new):
        """``lazy``: whether the row keeps ``m_old`` (``m_new`` within ``LAZY_RESCALE_LOG2``;
        false for two -inf, whose difference is NaN: a row still without keys moves on)."""
        return (m_new - m_old) * self._log2_factor() <= LAZY_RESCALE_LOG2

    @cute.jit
    def _select(self, cond, if_true, if_false):
        return if_true if cond else if_false

    def _log2_factor(self):
        """What turns a difference of maxima into the exponent's log2 units."""
        return self.scale_log2 if self.fused else LOG2_E

    def _scores(self, x):
        """S as the exponent takes it: raw (fused form) or scaled by its own FMUL."""
        return x if self.fused else x * self.scale

    @cute.jit
    def _new_max(self, row, m_old, first: cutlass.Constexpr):
        tile_max = quad_allreduce(row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0),
                                  cute.arch.fmax)
        return tile_max if first else cute.arch.fmax(m_old, tile_max)

    @cute.jit
    def _exponent_max(self, m_new):
        """The max subtracted in the exponent. A row with every key masked so far subtracts
        0, not -inf (exp2(-inf + inf) = NaN)."""
        m_exp = m_new
        if cutlass.const_expr(self.guard_empty_rows):
            m_exp = cutlass.Float32(0.0) if m_new == -cutlass.Float32.inf else m_new
        return m_exp

    def _exp(self, x, m_exp):
        """exp(x - m) in the softmax's form: one FFMA into exp2 with the scale folded in
        (fused), or FADD + FMUL into exp2 on scaled scores."""
        if cutlass.const_expr(self.fused):
            return cute.math.exp2(x * self.scale_log2 - m_exp * self.scale_log2,
                                  fastmath=True)
        return cute.math.exp2((x - m_exp) * LOG2_E, fastmath=True)

    def _sum(self, s_mn: cute.Tensor, r: int, col0: int, cols: int):
        terms = [s_mn[r, c] for c in range(col0, col0 + cols)]
        return chained_sum(terms, self.sum_chains)

    @cute.jit
    def merge(self, acc_o: cute.Tensor, other_o, other_max, other_sum):
        """Fold in the statistics and O of the same rows over other K/V blocks (a split
        tile's other piece, ``FlashConfig.split_tail``): ``other_o(r, c)`` is element
        ``(r, c)`` of its O in ``acc_mn_view`` order (not normalised), ``other_max(r)`` and
        ``other_sum(r)`` row ``r``'s maximum and this thread's partial sum. Both sides move to
        the larger maximum, as one more block would move them."""
        o_mn = acc_mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            m_new = cute.arch.fmax(self.row_max[r], other_max(r))
            m_exp = self._exponent_max(m_new)
            mine, theirs = self._exp(self.row_max[r], m_exp), self._exp(other_max(r), m_exp)
            self.row_sum[r] = self.row_sum[r] * mine + other_sum(r) * theirs
            for c in cutlass.range_constexpr(cute.size(o_mn, mode=[1])):
                o_mn[r, c] = o_mn[r, c] * mine + other_o(r, c) * theirs
            self.row_max[r] = m_new

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
