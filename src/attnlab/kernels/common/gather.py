"""The memory-layout study's gather kernel (seed 004, Observation T): ``out[t] = sum of
data[index[i]]`` over a grid-stride walk of the trace, so consecutive trace positions are read
by consecutive lanes and a layout's locality along the trace decides how many sectors each
warp's loads touch."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

THREADS = 256


class Gather:
    """``__call__(data fp32 [N], index int32 [T], out fp32 [threads])``: each of ``out``'s
    threads sums its strided share of ``data[index[i]]``."""

    @cute.jit
    def __call__(self, data: cute.Tensor, index: cute.Tensor, out: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(data, index, out).launch(grid=[out.shape[0] // THREADS, 1, 1],
                                             block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, data: cute.Tensor, index: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        first = bidx * THREADS + tidx
        acc = cutlass.Float32(0.0)
        for i in cutlass.range(first, index.shape[0], out.shape[0], unroll=4):
            acc = acc + data[index[i]]
        out[first] = acc


def compile_gather(arch: str, dump_dir=None):
    """The gather kernel compiled for ``arch`` (TVM-FFI; called with torch tensors); with
    ``dump_dir`` its cubin is written there too."""
    from attnlab.jit import compile_vector_kernel

    return compile_vector_kernel(Gather(), (cutlass.Float32, cutlass.Int32, cutlass.Float32),
                                 arch=arch, dump_dir=dump_dir)
