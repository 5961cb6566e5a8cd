"""Online FP16 -> INT8 in the ``mma.sync`` HGEMM (the lab's Insights 21-22;
``GemmSpec.online_int8``).

Each K tile of fp16/bf16 A and B lands in the shared-memory ring as for the HGEMM. Then the
CTA quantizes it: every row of A's tile and of B's (B is K-major: a row is an output column)
gets the scale ``max |x| / 127`` over its 64 elements, and its values ``round(x / scale)`` as
int8 into a tile of its own (eight threads a row, their maximum met by shuffles). The warps
then run s8 m16n8k32 MMAs on the int8 tiles (int32 sums, exact) and add each tile's sums
times ``scale_a[row] * scale_b[col]`` into the fp32 accumulator: the error is the rounding of
each operand to 8 bits against its own row's range in that tile, not against the whole
matrix's.
"""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.gemm.ptx_mma import mma_s8_16832, quantize_s8x4

#: Threads that quantize one row of a K tile (8 x 16 bytes = 64 16-bit values).
LANES_PER_ROW = 8
#: The int8 range's bound: a row's largest magnitude maps to it.
QMAX = 127.0


@cute.jit
def quantize_rows(src: cute.Tensor, dst: cute.Tensor, scales: cute.Tensor, rows: int,
                  num_threads: int, tidx):
    """``src`` (rows x 64 16-bit values in shared memory) as int8 into ``dst`` (rows x 32
    16-bit pairs) and each row's scale into ``scales``."""
    per_pass = num_threads // LANES_PER_ROW
    chunk = tidx % LANES_PER_ROW
    values = cute.make_rmem_tensor((1, 8), src.element_type)
    packed = cute.make_rmem_tensor((1, 2), cutlass.Int32)
    for p in cutlass.range_constexpr(rows // per_pass):
        row = p * per_pass + tidx // LANES_PER_ROW
        cute.autovec_copy(cute.local_tile(src, (1, 8), (row, chunk)), values)
        x = [cutlass.Float32(values[0, i]) for i in range(8)]
        top = cute.arch.fmax(x[0], -x[0])
        for i in cutlass.range_constexpr(1, 8):
            top = cute.arch.fmax(top, cute.arch.fmax(x[i], -x[i]))
        for offset in (1, 2, 4):
            top = cute.arch.fmax(top, cute.arch.shuffle_sync_bfly(top, offset=offset))
        # rcp.approx (one MUFU) where a division is a checked slow-path call: an inverse
        # off by an ulp moves only a value within an ulp of a rounding tie, by one step.
        inverse = QMAX * cute.arch.rcp_approx(cute.arch.fmax(top, cutlass.Float32(1e-30)))
        packed[0, 0] = quantize_s8x4(x[:4], inverse)
        packed[0, 1] = quantize_s8x4(x[4:], inverse)
        cute.autovec_copy(cute.recast_tensor(packed, src.element_type),
                          cute.local_tile(dst, (1, 4), (row, chunk)))
        if chunk == 0:
            scales[row] = top * (1.0 / QMAX)


@cute.jit
def online_int8_mmas(tiles: tuple, quant: tuple, thr_mma, s2r: list, acc: cute.Tensor,
                     num_threads: int, tidx):
    """One K tile: quantize ``tiles`` (A's and B's ring stage) into ``quant`` (the int8 tiles
    and their scales), then the s8 MMAs of the two 32-deep steps, then the tile's int32 sums
    scaled into ``acc``. Every thread passes a barrier between quantizing and reading, and the
    ring's barrier at the next K tile before the int8 tiles are written again."""
    qA, qB, scale_a, scale_b = quant
    quantize_rows(tiles[0], qA, scale_a, cute.size(qA, mode=[0]), num_threads, tidx)
    quantize_rows(tiles[1], qB, scale_b, cute.size(qB, mode=[0]), num_threads, tidx)
    cute.arch.sync_threads()
    tCrQA = thr_mma.make_fragment_A(thr_mma.partition_A(qA))
    tCrQB = thr_mma.make_fragment_B(thr_mma.partition_B(qB))
    sums = cute.make_fragment_like(acc, cutlass.Int32)
    sums.fill(0)
    for step in cutlass.range_constexpr(cute.size(tCrQA, mode=[2])):
        cute.copy(s2r[0], s2r[0].partition_S(qA)[None, None, step],
                  s2r[0].retile(tCrQA)[None, None, step])
        cute.copy(s2r[1], s2r[1].partition_S(qB)[None, None, step],
                  s2r[1].retile(tCrQB)[None, None, step])
        for i in cutlass.range_constexpr(cute.size(acc, mode=[1])):
            a = cute.recast_tensor(tCrQA[None, i, step], cutlass.Int32)
            for j in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                b = cute.recast_tensor(tCrQB[None, j, step], cutlass.Int32)
                c = sums[None, i, j]
                d = mma_s8_16832([a[w] for w in range(4)], [b[0], b[1]],
                                 [c[v] for v in range(4)])
                for v in cutlass.range_constexpr(4):
                    c[v] = d[v]
    coords = thr_mma.partition_C(cute.make_identity_tensor(
        (cute.size(qA, mode=[0]), cute.size(qB, mode=[0]))))
    for i in cutlass.range_constexpr(cute.size(acc, mode=[1])):
        # Values 0, 1: row g; 2, 3: row g + 8 (columns 2t, 2t + 1 each).
        rows = [scale_a[coords[2 * h, i, 0][0]] for h in range(2)]
        for j in cutlass.range_constexpr(cute.size(acc, mode=[2])):
            cols = [scale_b[coords[c, 0, j][1]] for c in range(2)]
            for v in cutlass.range_constexpr(4):
                acc[v, i, j] = acc[v, i, j] + (cutlass.Float32(sums[v, i, j])
                                               * (rows[v // 2] * cols[v % 2]))
