"""GroupNorm + SiLU in one kernel: the fusion the lab left as follow-up (a ``GroupNormSiluSpec``).

``y = silu((x - mean_g) * rstd_g * weight[c] + bias[c])`` over an NHWC image, ``mean_g`` and
``rstd_g`` the statistics of each (image, channel group). One CTA per (image, group) reads the
group three times from global memory (L2 holds it between passes: an SD-UNet group is at
most 64 x 64 x 20 halves, 160 KiB): the mean, then the variance around it (two passes instead
of E[x^2] - mean^2, whose cancellation an image with a large mean would feel), then the
normalised, activated values, written in the input's 16-bit type: the normalised tensor is
never stored in fp32 nor read back by a separate activation kernel.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.base import shared_storage
from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.conv.abi import GroupNormSiluSpec

THREADS = 256
WARPS = THREADS // 32


class GroupNormSilu:
    """Compile-time description of the kernel (a ``GroupNormSiluSpec``)."""

    def __init__(self, spec: GroupNormSiluSpec):
        self.dtype = element_type(spec.dtype)

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, weight: cute.Tensor,
                 bias: cute.Tensor, groups: cutlass.Int32, eps: cutlass.Float32,
                 stream: cuda.CUstream):
        """Launch on ``kernels.conv.abi.GroupNormSiluArgs`` (and the stream)."""
        SharedStorage = shared_storage({"partial": cute.struct.MemRange[cutlass.Float32,
                                                                        WARPS]})
        self.kernel(x, y, weight, bias, groups, eps, SharedStorage).launch(
            grid=[x.shape[0] * groups, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, weight: cute.Tensor, bias: cute.Tensor,
               groups: cutlass.Int32, eps: cutlass.Float32, SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        block, _, _ = cute.arch.block_idx()
        image, group = block // groups, block % groups
        width = x.shape[2] // groups
        first = group * width
        count = x.shape[1] * width
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        partial = storage.partial.get_tensor(cute.make_layout(WARPS))

        total = cutlass.Float32(0.0)
        for e in cutlass.range(tidx, count, THREADS, unroll=1):
            total += cutlass.Float32(x[image, e // width, first + e % width])
        mean = self._block_sum(total, partial, tidx) / cutlass.Float32(count)
        spread = cutlass.Float32(0.0)
        for e in cutlass.range(tidx, count, THREADS, unroll=1):
            d = cutlass.Float32(x[image, e // width, first + e % width]) - mean
            spread += d * d
        rstd = cute.math.rsqrt(self._block_sum(spread, partial, tidx) / cutlass.Float32(count)
                               + eps)
        for e in cutlass.range(tidx, count, THREADS, unroll=1):
            row, channel = e // width, first + e % width
            v = ((cutlass.Float32(x[image, row, channel]) - mean) * rstd * weight[channel]
                 + bias[channel])
            y[image, row, channel] = (v / (1.0 + cute.math.exp(-v, fastmath=True))).to(
                self.dtype)

    @cute.jit
    def _block_sum(self, value: cutlass.Float32, partial: cute.Tensor, tidx
                   ) -> cutlass.Float32:
        """The CTA's sum of ``value``, in every thread: warp sums through shared memory."""
        warp_total = cute.arch.warp_reduction_sum(value)
        if tidx % 32 == 0:
            partial[tidx // 32] = warp_total
        cute.arch.sync_threads()
        total = cutlass.Float32(0.0)
        for w in cutlass.range_constexpr(WARPS):
            total += partial[w]
        # Every thread has read the slots before the next sum overwrites them.
        cute.arch.sync_threads()
        return total
