"""Split-K's second pass: ``out = sum_s partials[s]``, in split order (so the result does not
depend on which slice finished first), converted to the output dtype (a ``ReduceSpec``).

Each thread owns ``VECTOR`` consecutive columns of one row: one 16-byte load per slice, one
store. The pass reads ``splits x M x N x 4`` bytes and writes the output once: at the skinny
shapes split-K serves (small M x N), a few microseconds.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.gemm.abi import ReduceSpec

#: fp32 columns per thread: one 16-byte load.
VECTOR = 4
THREADS = 128



class SplitKReduce:
    """Compile-time description of the reduction (a ``ReduceSpec``)."""

    def __init__(self, spec: ReduceSpec):
        self.out_dtype = element_type(spec.out_dtype)

    @cute.jit
    def __call__(self, partials: cute.Tensor, out: cute.Tensor, stream: cuda.CUstream):
        """Launch on ``kernels.gemm.abi.ReduceArgs`` (and the stream)."""
        cols = THREADS * VECTOR
        self.kernel(partials, out).launch(
            grid=[cute.ceil_div(out.shape[1], cols), out.shape[0], 1],
            block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, partials: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        chunk, row, _ = cute.arch.block_idx()
        column_chunk = chunk * THREADS + tidx
        # N is a multiple of VECTOR (validation): a chunk is in or out whole.
        if column_chunk * VECTOR < out.shape[1]:
            total = cute.make_rmem_tensor((VECTOR,), cutlass.Float32)
            total.fill(0.0)
            for s in cutlass.range(partials.shape[0], unroll=1):
                part = cute.local_tile(partials[s, row, None], (VECTOR,), (column_chunk,))
                total.store(total.load() + part.load())
            dst = cute.local_tile(out[row, None], (VECTOR,), (column_chunk,))
            dst.store(total.load().to(self.out_dtype))
