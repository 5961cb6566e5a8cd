"""The global-memory tensors of a forward launch, in the one view both kernels index.

A launch passes q/k/v/out as dense ``[B, S, H, D]`` or packed ``[total, H, D]`` tensors
(``kernels.abi``); the kernels index ``(batch, row, head, d)`` either way, a packed tensor
being a batch of one whose sequences ``cu_seqlens`` locate.

Offsets are 64-bit where a tensor may pass 2**31 elements: the batch stride (typed 64-bit in
the ABI) and a packed sequence's first row (``sequence_rows``). Within one batch element or
sequence the tile arithmetic stays 32-bit, which validation guarantees is enough.
"""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import STRIDE_DIVISIBILITY, _element_type


def element_type(dtype: str) -> type[cutlass.Numeric]:
    """The CuTe element type of a dtype name (``"float16"``, ``"bfloat16"``, ``"float32"``,
    ``"int8"``)."""
    return _element_type(dtype)


def _with_batch_mode(t: cute.Tensor) -> cute.Tensor:
    """A packed tensor as a batch of one (batch stride 0)."""
    return cute.make_tensor(t.iterator, cute.make_layout((1, *t.shape), stride=(0, *t.stride)))


def problem_tensors(tensors: tuple, varlen: bool) -> tuple:
    """The launch's tensors as the kernels index them: Q/K/V/O-like tensors as (batch, rows,
    heads, head_dim), per-row statistics (the LSE) as (batch, head, row); None stays None."""
    if varlen:
        tensors = tuple(t if t is None else _with_batch_mode(t) for t in tensors)
    return tensors


def sequence_extent(seq, mQ: cute.Tensor, mK: cute.Tensor, mCuQ: cute.Tensor,
                    mCuK: cute.Tensor, varlen: bool) -> tuple:
    """``(batch, q_start, k_start, seqlen_q, seqlen_k)`` of sequence ``seq``: a batch
    element (starts 0, Python ints), or rows of the packed tensors located by ``cu_seqlens``
    (the kernels' views are then a batch of one)."""
    if varlen:
        q_start, k_start = mCuQ[seq], mCuK[seq]
        return 0, q_start, k_start, mCuQ[seq + 1] - q_start, mCuK[seq + 1] - k_start
    return seq, 0, 0, mQ.shape[1], mK.shape[1]


@cute.jit
def sequence_rows(tensor: cute.Tensor, batch, start, head) -> cute.Tensor:
    """The (rows, head_dim) view of one sequence and head, starting at row ``start`` of its
    batch element: 0 (a Python int) for dense batches, a ``cu_seqlens`` entry for packed ones,
    whose row offset is taken in 64 bits (a packed tensor may pass 2**31 elements)."""
    rows = tensor[batch, None, head, None]
    if cutlass.const_expr(isinstance(start, int)):
        return cute.domain_offset((start, 0), rows)
    # A whole number of rows: as aligned as the row stride (validated multiple of 8).
    offset = cute.assume(cutlass.Int64(start) * cutlass.Int64(rows.stride[0]),
                         divby=STRIDE_DIVISIBILITY)
    return cute.make_tensor(rows.iterator + offset, rows.layout)


@cute.jit
def load_rows(tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
              coord: cute.Tensor, rows_left: cutlass.Int32, tile_rows: cutlass.Constexpr,
              unpredicated_full_tiles: cutlass.Constexpr = False):
    """Copy a ``tile_rows``-row tile to shared memory, zero-filling rows past ``rows_left``.

    Rows past the end are never read from global memory; zeros keep stale shared memory
    (possibly NaN bit patterns) out of the MMAs. With ``unpredicated_full_tiles``, a tile
    wholly inside the sequence takes one uniform branch to plain copies instead of a
    predicated copy / zero-fill pair per row (both halves of a pair issue either way).
    ``coord``: the tile coordinates of this thread's copies.
    """
    if cutlass.const_expr(unpredicated_full_tiles):
        if rows_left >= tile_rows:
            cute.copy(tiled_copy, src, dst)
        else:
            _load_rows_predicated(tiled_copy, src, dst, coord, rows_left)
    else:
        _load_rows_predicated(tiled_copy, src, dst, coord, rows_left)


@cute.jit
def _load_rows_predicated(tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
                          coord: cute.Tensor, rows_left: cutlass.Int32):
    for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        if coord[0, m, 0][0] < rows_left:
            cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
        else:
            dst[None, m, None].fill(0)
