"""Split-K whose slices meet in distributed shared memory (``GemmConfig.split_mode =
"cluster"``): the K slices of one output tile are the CTAs of one thread-block cluster.

The serial split's slices meet in global memory: each stores its fp32 partial tile, counts in
at a counter, and the last one reads every partial back, one L2 round trip per slice on the
critical path. In a cluster the partials never leave the SMs: each slice stages its
accumulator in its own shared memory, the cluster barrier (release / acquire) makes them
visible to the other CTAs, and slice ``r`` sums band ``r`` of the tile's rows over every
slice's tile (``ld.shared::cluster``, in split order, so the sums are the same whichever CTA
finishes first), then writes its band of C. A second barrier keeps each CTA's shared memory
alive until the others have read it. No workspace, no counter, no second kernel, and the
meeting is spread over all the slices instead of falling on the last one.
"""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.dsmem import VECTOR, load_peer_v4


@cute.jit
def stage_partials(acc: cute.Tensor, coords: cute.Tensor, partial: cute.Tensor):
    """This thread's accumulator into the CTA's partial tile (``coords``: the tile
    coordinates of its values, which come in pairs of neighbouring columns)."""
    pair = cute.make_rmem_tensor((2,), cutlass.Float32)
    for i in cutlass.range_constexpr(cute.size(acc) // 2):
        row, col = coords[2 * i]
        pair[0] = acc[2 * i]
        pair[1] = acc[2 * i + 1]
        cute.local_tile(partial[row, None], (2,), (col // 2,)).store(pair.load())


@cute.jit
def sum_band(partial: cute.Tensor, c: cute.Tensor, bias: cute.Tensor | None, m, n, tidx,
             threads: cutlass.Constexpr, splits: cutlass.Constexpr):
    """Band ``rank`` (this CTA's place in the cluster) of tile ``(m, n)``'s rows, summed over
    the ``splits`` slices' partial tiles in split order, plus ``bias[j]`` in column ``j``
    (if a bias is given, in fp32), and written to C (``c``: ``[M, N]``; rows and columns past
    M and N left alone; N is a multiple of ``VECTOR``). ``threads`` consumer threads,
    ``tidx`` this one's index among them; every load is issued before the first sum needs
    one (all unrolled: a peer's shared memory is a few hundred cycles away)."""
    block_m, block_n = partial.shape
    rank = cute.arch.block_in_cluster_idx()[0]
    band = block_m // splits
    vectors = band * block_n // (VECTOR * threads)
    rows_left = c.shape[0] - m * block_m
    cols_left = c.shape[1] - n * block_n
    base = partial.iterator.toint()
    row_stride = partial.layout.stride[0]
    places = []
    loaded = []
    for j in cutlass.range_constexpr(vectors):
        v = tidx + j * threads
        row = rank * band + v * VECTOR // block_n
        col = v * VECTOR % block_n
        places.append((row, col))
        offset = base + (row * row_stride + col) * 4
        loaded.append([load_peer_v4(offset, s) for s in range(splits)])
    out = cute.make_rmem_tensor((VECTOR,), c.element_type)
    for j in cutlass.range_constexpr(vectors):
        row, col = places[j]
        if row < rows_left:
            if col < cols_left:
                column = (n * block_n + col) // VECTOR
                for i in cutlass.range_constexpr(VECTOR):
                    total = loaded[j][0][i]
                    for s in cutlass.range_constexpr(1, splits):
                        total = total + loaded[j][s][i]
                    if cutlass.const_expr(bias is not None):
                        total = total + cutlass.Float32(bias[column * VECTOR + i])
                    out[i] = total.to(c.element_type)
                dst = cute.local_tile(c[m * block_m + row, None], (VECTOR,), (column,))
                dst.store(out.load())
