"""The lab's direct convolution, its conv ladder's baseline (a ``DirectConvSpec``).

One thread per output value ``out[n, p, q, k]``, output channels fastest across a warp (its
stores coalesce): the thread walks its filter window, ``R x S x C`` FFMAs in fp32, reading
each input value straight from global memory. Neighbouring outputs share most of their
windows, so at 3 x 3 every input value is read nine times per output channel (through L1 and
L2): the cost the im2col and implicit-GEMM steps remove.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.conv.abi import DirectConvSpec

THREADS = 256


class DirectConv:
    """Compile-time description of the kernel (a ``DirectConvSpec``)."""

    def __init__(self, spec: DirectConvSpec):
        self.dtype = element_type(spec.dtype)

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor,
                 stride_h: cutlass.Int32, stride_w: cutlass.Int32, pad_h: cutlass.Int32,
                 pad_w: cutlass.Int32, stream: cuda.CUstream):
        """Launch on ``kernels.conv.abi.DirectConvArgs`` (and the stream)."""
        total = out.shape[0] * out.shape[1] * out.shape[2] * out.shape[3]
        self.kernel(x, w, out, stride_h, stride_w, pad_h, pad_w).launch(
            grid=[cute.ceil_div(total, THREADS), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, out: cute.Tensor,
               stride_h: cutlass.Int32, stride_w: cutlass.Int32, pad_h: cutlass.Int32,
               pad_w: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        index = block * THREADS + tidx
        n_out, p_out, q_out, k_out = out.shape
        if index < n_out * p_out * q_out * k_out:
            k = index % k_out
            pixel = index // k_out
            q = pixel % q_out
            p = (pixel // q_out) % p_out
            n = pixel // (q_out * p_out)
            acc = cutlass.Float32(0.0)
            for r in cutlass.range(w.shape[1], unroll=1):
                h = p * stride_h - pad_h + r
                # Rows and columns of the padding contribute zeros: skipped. (Signed
                # compares: the DSL's Int32 -> Uint32 cast does not wrap a negative index.)
                if h >= 0 and h < x.shape[1]:
                    for s in cutlass.range(w.shape[2], unroll=1):
                        col = q * stride_w - pad_w + s
                        if col >= 0 and col < x.shape[2]:
                            for c in cutlass.range(x.shape[3], unroll=4):
                                acc += (cutlass.Float32(x[n, h, col, c])
                                        * cutlass.Float32(w[k, r, s, c]))
            out[n, p, q, k] = acc.to(self.dtype)
