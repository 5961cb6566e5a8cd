"""The backward's preprocess in one pass: per query row, ``D = rowsum(dO * O)`` in fp32 (minus
the LSE's gradient when given) and ``L * log2(e)`` (+inf for a row that saw no key, whose
recomputed probabilities are then exp2(-inf) = 0), both written ``[B, H, rows]`` with the rows
past the sequence zeroed, so the backward kernel reads whole query blocks unchecked; and the
row of ``dq_accum`` zeroed (no separate memset).

A row is read by ``lanes`` neighbouring threads, one or more 16-byte chunks each, and
summed across them by butterfly shuffles, the rows of one (batch, head) fastest: every load
instruction then reads whole 128-byte lines and the lane group's zeroing of ``dq_accum`` is
contiguous. With a thread per row (the first form) each instruction touched 32 lines for 16
bytes of each: 192 us at hd64 seq 2k (16k tokens, hidden 2048) against the 62 us its bytes
take at the DRAM roof (docs/backward.md). In torch the same took five kernels and three fp32
copies of dO-sized tensors.
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import PreprocessArgs, PreprocessSpec
from attnlab.kernels.common.tensors import element_type, problem_tensors

LOG2_E = math.log2(math.e)
THREADS = 128
#: Elements per 16-byte chunk of a 16-bit row.
CHUNK = 8


def lanes_per_row(head_dim: int) -> int:
    """Threads that share a row: the most (up to 16) that split its 16-byte chunks evenly, a
    power of two for the butterfly sum (hd96 and hd192: 4 and 8 threads of 3 chunks)."""
    chunks = head_dim // CHUNK
    return next(n for n in (16, 8, 4, 2, 1) if chunks % n == 0)


class BackwardPreprocess:
    """Compile-time description of the preprocess kernel of a ``PreprocessSpec``."""

    def __init__(self, spec: PreprocessSpec):
        self.dtype = element_type(spec.dtype)
        self.head_dim = spec.head_dim
        self.varlen = spec.varlen
        self.with_dlse = spec.with_dlse

    @cute.jit
    def __call__(self, out: cute.Tensor, dout: cute.Tensor, lse: cute.Tensor,
                 dlse: cute.Tensor | None, dpsum: cute.Tensor, lse_log2: cute.Tensor,
                 dq_accum: cute.Tensor, stream: cuda.CUstream):
        """Launch on the arguments of ``kernels.abi.PreprocessArgs`` (and the stream)."""
        t = PreprocessArgs(*problem_tensors((out, dout, lse, dlse, dpsum, lse_log2, dq_accum),
                                            self.varlen))
        rows = t.dpsum.shape[0] * t.dpsum.shape[1] * t.dpsum.shape[2]
        self.kernel(t.out, t.dout, t.lse, t.dlse, t.dpsum, t.lse_log2, t.dq_accum).launch(
            grid=[cute.ceil_div(rows * lanes_per_row(self.head_dim), THREADS), 1, 1],
            block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
               mD: cute.Tensor, mL: cute.Tensor, mdQacc: cute.Tensor):
        lanes = lanes_per_row(self.head_dim)
        chunks = self.head_dim // CHUNK // lanes
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        heads, padded = mD.shape[1], mD.shape[2]
        index = bidx * THREADS + tidx
        lane = index % lanes
        record = index // lanes
        row = record % padded
        head = (record // padded) % heads
        batch = record // (padded * heads)
        # Every thread reaches the shuffles (a lane group may straddle the last record).
        in_range = batch < mD.shape[0]
        d = cutlass.Float32(0.0)
        if in_range and row < mO.shape[1]:
            # (chunk elements, chunks): this thread's chunks are lane, lane + lanes, ...
            o_row, do_row, dq_row = (cute.zipped_divide(m[batch, row, head, None], (CHUNK,))
                                     for m in (mO, mdO, mdQacc))
            for c in cutlass.range_constexpr(chunks):
                o = o_row[None, lane + c * lanes].load().to(cutlass.Float32)
                do = do_row[None, lane + c * lanes].load().to(cutlass.Float32)
                d = d + (o * do).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
                dq_row[None, lane + c * lanes].fill(0.0)
        for offset in cutlass.range_constexpr(lanes.bit_length() - 2, -1, -1):
            d = d + cute.arch.shuffle_sync_bfly(d, offset=1 << offset)
        if in_range and lane == 0:
            lse_log2 = cutlass.Float32(0.0)
            if row < mO.shape[1]:
                if cutlass.const_expr(self.with_dlse):
                    d = d - mdLSE[batch, head, row]
                lse = mLSE[batch, head, row]
                lse_log2 = lse * LOG2_E
                if lse == -cutlass.Float32.inf:
                    lse_log2 = cutlass.Float32.inf
            mD[batch, head, row] = d
            mL[batch, head, row] = lse_log2
