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

    @classmethod
    def create(cls, num_rows: int, softmax_scale: cutlass.Float32, fused: bool) -> "OnlineSoftmax":
        row_max = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), cutlass.Float32)
        row_max.fill(-cutlass.Float32.inf)
        row_sum.fill(0.0)
        return cls(row_max, row_sum, softmax_scale, softmax_scale * LOG2_E, fused)

    def update(self, acc_s: cute.Tensor, acc_o: cute.Tensor) -> None:
        """Turn the S tile into P (in place) and rescale O for the new row maxima."""
        s_mn = acc_mn_view(acc_s)
        o_mn = acc_mn_view(acc_o)
        for r in range(cute.size(self.row_max)):
            row = s_mn[r, None].load()
            if not self.fused:
                row = row * self.scale
            tile_max = quad_allreduce(
                row.reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0), cute.arch.fmax
            )
            m_old = self.row_max[r]
            m_new = cute.arch.fmax(m_old, tile_max)
            if self.fused:
                max_scaled = m_new * self.scale_log2
                p = cute.math.exp2(row * self.scale_log2 - max_scaled, fastmath=True)
                correction = cute.math.exp2(m_old * self.scale_log2 - max_scaled, fastmath=True)
            else:
                p = cute.math.exp2((row - m_new) * LOG2_E, fastmath=True)
                correction = cute.math.exp2((m_old - m_new) * LOG2_E, fastmath=True)
            self.row_max[r] = m_new
            self.row_sum[r] = self.row_sum[r] * correction + p.reduce(
                cute.ReductionOp.ADD, cutlass.Float32.zero, 0
            )
            s_mn[r, None] = p
            o_mn[r, None] = o_mn[r, None].load() * correction

    def finalize(self, acc_o: cute.Tensor, lse: cute.Tensor) -> None:
        """Normalise O by the row sums and write each row's natural-log LSE into ``lse``."""
        o_mn = acc_mn_view(acc_o)
        for r in range(cute.size(self.row_max)):
            total = quad_allreduce(self.row_sum[r], lambda a, b: a + b)
            o_mn[r, None] = o_mn[r, None].load() * cute.arch.rcp_approx(total)
            max_term = self.row_max[r] * self.scale if self.fused else self.row_max[r]
            lse[r] = max_term + cute.math.log2(total, fastmath=True) * LN_2
