"""Epilogue pieces shared by the forward kernels."""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.layouts import acc_mn_view


@cute.jit
def store_lse(mLSE: cute.Tensor, batch, head, first_row, thr_mma, tile_shape: cutlass.Constexpr,
              lse_rows: cute.Tensor, rows_left: cutlass.Int32):
    """One lane of each quad writes the LSE of its accumulator rows (rows of a ``tile_shape``
    output tile starting at ``first_row``; rows at or past ``rows_left`` are not stored)."""
    cO_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor(tile_shape)))
    lane = cute.arch.lane_idx()
    for r in cutlass.range_constexpr(cute.size(lse_rows)):
        row = cO_mn[r, 0][0]
        if lane % 4 == 0:
            if row < rows_left:
                mLSE[batch, head, first_row + row] = lse_rows[r]
