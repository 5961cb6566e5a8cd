"""The backward's preprocess in one pass: per query row, ``D = rowsum(dO * O)`` in fp32 (minus
the LSE's gradient when given) and ``L * log2(e)`` (+inf for a row that saw no key, whose
recomputed probabilities are then exp2(-inf) = 0), both written ``[B, H, rows]`` with the rows
past the sequence zeroed, so the backward kernel reads whole query blocks unchecked; and the
row of ``dq_accum`` zeroed (no separate memset).

One thread per (batch, head, row), the row fastest: it reads its row of dO and of O with
16-byte vector loads and writes two floats. In torch the same took five kernels and three
fp32 copies of dO-sized tensors (0.31 ms of a 2.25 ms backward at hd128 seq 2k,
docs/backward.md).
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import PreprocessArgs, PreprocessSpec
from attnlab.kernels.common.tensors import element_type, problem_tensors

LOG2_E = math.log2(math.e)
THREADS = 128


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
            grid=[cute.ceil_div(rows, THREADS), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mdLSE: cute.Tensor,
               mD: cute.Tensor, mL: cute.Tensor, mdQacc: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        heads, padded = mD.shape[1], mD.shape[2]
        index = bidx * THREADS + tidx
        row = index % padded
        head = (index // padded) % heads
        batch = index // (padded * heads)
        if batch < mD.shape[0]:
            d = cutlass.Float32(0.0)
            lse_log2 = cutlass.Float32(0.0)
            if row < mO.shape[1]:
                o = mO[batch, row, head, None].load().to(cutlass.Float32)
                do = mdO[batch, row, head, None].load().to(cutlass.Float32)
                d = (o * do).reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
                if cutlass.const_expr(self.with_dlse):
                    d = d - mdLSE[batch, head, row]
                mdQacc[batch, row, head, None].fill(0.0)
                lse = mLSE[batch, head, row]
                lse_log2 = lse * LOG2_E
                if lse == -cutlass.Float32.inf:
                    lse_log2 = cutlass.Float32.inf
            mD[batch, head, row] = d
            mL[batch, head, row] = lse_log2
