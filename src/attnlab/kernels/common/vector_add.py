"""``c = a + b`` over fp32 vectors: the front-end study's smallest kernel (seed 004's
Observation KK compared front-ends on it), one element a thread, a bounds check."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

THREADS = 256


class VectorAdd:
    """``__call__(a, b, c)``: fp32 vectors of one length."""

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream: cuda.CUstream):
        self.kernel(a, b, c).launch(grid=[cute.ceil_div(c.shape[0], THREADS), 1, 1],
                                    block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < c.shape[0]:
            c[i] = a[i] + b[i]


def compile_vector_add(arch: str, dump_dir=None):
    """The kernel compiled for ``arch`` (TVM-FFI; called with torch tensors); with
    ``dump_dir`` its cubin is written there too."""
    from attnlab.jit import compile_vector_kernel

    return compile_vector_kernel(VectorAdd(), (cutlass.Float32,) * 3, arch=arch,
                                 dump_dir=dump_dir)
