"""GroupNorm + SiLU over an NHWC image: the fusion the lab left as follow-up, in two stages
spread over the whole GPU (a ``GroupNormSiluSpec`` per stage).

``y = silu((x - mean_g) * rstd_g * weight[c] + bias[c])``, ``mean_g`` and ``rstd_g`` the
statistics of each (image, channel group). One CTA per (image, group) would leave most SMs
idle (an SD-UNet image has 32 groups) and wait on its loads one at a time, so each group's
pixels are cut into chunks and the grid is (image x group, chunk):

* ``stats``: a CTA reads its chunk twice (the second time from L1): the chunk's mean, then
  the sum of squared deviations around it (not E[x^2] - mean^2, whose cancellation an image
  with a large mean would feel), and stores the pair.
* ``apply``: every thread merges its group's chunk pairs (Chan's parallel formula: exact, no
  cancellation), then the CTA writes ``silu(...)`` of its chunk in the input's 16-bit type:
  the normalised tensor is never stored in fp32 nor read back by a separate activation.

A thread walks pixels ``tidx, tidx + THREADS, ...`` of its chunk and, per pixel, its group's
``group_width`` channels (unrolled: that many independent loads in flight).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.base import shared_storage
from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.conv.abi import GROUPNORM_THREADS as THREADS
from attnlab.kernels.conv.abi import GroupNormSiluSpec

WARPS = THREADS // 32


class GroupNormSilu:
    """Compile-time description of one stage (a ``GroupNormSiluSpec``)."""

    def __init__(self, spec: GroupNormSiluSpec):
        self.dtype = element_type(spec.dtype)
        self.width = spec.group_width
        self.stage = spec.stage

    @cute.jit
    def __call__(self, x: cute.Tensor, y: cute.Tensor, weight: cute.Tensor,
                 bias: cute.Tensor, partials: cute.Tensor, chunk_pixels: cutlass.Int32,
                 eps: cutlass.Float32, stream: cuda.CUstream):
        """Launch on ``kernels.conv.abi.GroupNormSiluArgs`` (and the stream)."""
        SharedStorage = shared_storage({"partial": cute.struct.MemRange[cutlass.Float32,
                                                                        WARPS]})
        self.kernel(x, y, weight, bias, partials, chunk_pixels, eps, SharedStorage).launch(
            grid=[partials.shape[0], partials.shape[1], 1], block=[THREADS, 1, 1],
            stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, y: cute.Tensor, weight: cute.Tensor, bias: cute.Tensor,
               partials: cute.Tensor, chunk_pixels: cutlass.Int32, eps: cutlass.Float32,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        image_group, chunk, _ = cute.arch.block_idx()
        groups = x.shape[2] // self.width
        image, first = image_group // groups, image_group % groups * self.width
        pixels = x.shape[1]
        start = chunk * chunk_pixels
        stop = cutlass.min(start + chunk_pixels, pixels)
        if cutlass.const_expr(self.stage == "stats"):
            storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
            partial = storage.partial.get_tensor(cute.make_layout(WARPS))
            count = cutlass.Float32((stop - start) * self.width)
            total = cutlass.Float32(0.0)
            for pixel in cutlass.range(start + tidx, stop, THREADS, unroll=2):
                for c in cutlass.range_constexpr(self.width):
                    total += cutlass.Float32(x[image, pixel, first + c])
            mean = self._block_sum(total, partial, tidx) / count
            spread = cutlass.Float32(0.0)
            for pixel in cutlass.range(start + tidx, stop, THREADS, unroll=2):
                for c in cutlass.range_constexpr(self.width):
                    d = cutlass.Float32(x[image, pixel, first + c]) - mean
                    spread += d * d
            spread = self._block_sum(spread, partial, tidx)
            if tidx == 0:
                partials[image_group, chunk, 0] = mean
                partials[image_group, chunk, 1] = spread
        else:
            mean, rstd = self._merge(partials, image_group, chunk_pixels, pixels, eps)
            scale = cute.make_rmem_tensor((self.width,), cutlass.Float32)
            shift = cute.make_rmem_tensor((self.width,), cutlass.Float32)
            for c in cutlass.range_constexpr(self.width):
                scale[c] = rstd * weight[first + c]
                shift[c] = bias[first + c] - mean * scale[c]
            for pixel in cutlass.range(start + tidx, stop, THREADS, unroll=2):
                for c in cutlass.range_constexpr(self.width):
                    v = cutlass.Float32(x[image, pixel, first + c]) * scale[c] + shift[c]
                    y[image, pixel, first + c] = (
                        v / (1.0 + cute.math.exp(-v, fastmath=True))).to(self.dtype)

    @cute.jit
    def _merge(self, partials: cute.Tensor, image_group, chunk_pixels, pixels,
               eps: cutlass.Float32):
        """The group's mean and 1 / std from its chunks' (mean, sum of squared deviations):
        ``M2 = sum M2_i + sum n_i (mean_i - mean)^2`` (Chan et al.)."""
        chunks = partials.shape[1]
        count = cutlass.Float32(pixels * self.width)
        mean = cutlass.Float32(0.0)
        for i in cutlass.range(chunks, unroll=1):
            n_i = cutlass.min(chunk_pixels, pixels - i * chunk_pixels) * self.width
            mean += cutlass.Float32(n_i) * partials[image_group, i, 0]
        mean = mean / count
        spread = cutlass.Float32(0.0)
        for i in cutlass.range(chunks, unroll=1):
            n_i = cutlass.min(chunk_pixels, pixels - i * chunk_pixels) * self.width
            d = partials[image_group, i, 0] - mean
            spread += partials[image_group, i, 1] + cutlass.Float32(n_i) * d * d
        return mean, cute.math.rsqrt(spread / count + eps)

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
