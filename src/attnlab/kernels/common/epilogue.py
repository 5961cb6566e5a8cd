"""Epilogue pieces shared by the forward kernels: the LSE store, and O staged in shared memory,
from where it leaves by 16-byte copies of whole rows (``store_rows``: the sm80 kernel, and the
sm90 kernel for packed sequences, whose tiles a TMA store would write past) or by the TMA
unit (dense sm90)."""

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


@cute.jit
def stage_o(acc_O: cute.Tensor, sO: cute.Tensor, tiled_mma: cute.TiledMma, tidx,
            dtype: cutlass.Constexpr):
    """O's accumulator, converted to ``dtype``, into its tile of shared memory. The caller
    makes sure nothing still reads ``sO`` (it is Q's space in both kernels)."""
    rO = cute.make_fragment_like(acc_O, dtype)
    rO.store(acc_O.load().to(dtype))
    store_fragment(rO, sO, tiled_mma, tidx)


@cute.jit
def store_fragment(rC: cute.Tensor, sC: cute.Tensor, tiled_mma: cute.TiledMma, tidx,
                   matrices: bool = False):
    """A fragment in ``tiled_mma``'s accumulator layout into its shared-memory tile.
    ``matrices`` (16-bit values, sm_90): by ``stmatrix``, four 8 x 8 matrices a warp at
    once (16 bytes a lane), instead of one store per column pair (4 bytes a lane)."""
    if cutlass.const_expr(matrices):
        atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False,
                                                                     num_matrices=4),
                                   rC.element_type)
    else:
        # One store per column pair: a thread's accumulator holds column pairs.
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), rC.element_type,
                                   num_bits_per_copy=2 * rC.element_type.width)
    r2s = cute.make_tiled_copy_C(atom, tiled_mma)
    thr_r2s = r2s.get_slice(tidx)
    cute.copy(r2s, thr_r2s.retile(rC), thr_r2s.partition_D(sC))


@cute.jit
def store_rows(gmem_store: cute.TiledCopy, sO: cute.Tensor, gO: cute.Tensor, tidx,
               rows_left: cutlass.Int32, barrier):
    """The staged O tile ``sO`` to its global tile ``gO``, rows at or past ``rows_left`` left
    alone; every thread of ``gmem_store`` takes part. ``barrier()`` makes the staged tile
    visible to all of them: it runs once the copy's addresses are computed, right before the
    first read of ``sO``."""
    thr_store = gmem_store.get_slice(tidx)
    tOsO = thr_store.partition_S(sO)
    tOgO = thr_store.partition_D(gO)
    tOcO = thr_store.partition_D(cute.make_identity_tensor(gO.shape))
    tOrO = cute.make_fragment_like(tOgO, sO.element_type)
    barrier()
    cute.copy(gmem_store, tOsO, tOrO)
    for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
        if tOcO[0, m, 0][0] < rows_left:
            cute.copy(gmem_store, tOrO[None, m, None], tOgO[None, m, None])
