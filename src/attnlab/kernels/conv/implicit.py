"""Implicit-GEMM convolution for sm_90a: the lab's implicit GEMM, with the TMA unit computing
the coordinate tables (an ``ImplicitConvSpec``).

The convolution is the GEMM ``out[N P Q, K] = A[N P Q, R S C] @ filters[K, R S C]^T`` whose
row ``(n, p, q)`` of A is the filter window of output pixel ``(p, q)`` of image ``n``. im2col
writes A out (nine times the image at 3 x 3); the lab's implicit GEMM instead computed each
window's addresses from precomputed coordinate tables (Insight 9) and loaded A's tiles straight
from the image. On Hopper the TMA unit does that in hardware: its *im2col mode* walks
``block_m`` consecutive output pixels (across rows and images), reads for each the
``block_k`` channels at one filter offset ``(r, s)``, and fills the window's part outside the
image with zeros. One copy per K step, the same swizzled tile a matrix's TMA copy writes, so
everything else is the HGEMM (``kernels/gemm/sm90.py``): the producer warp, the ring, the
``wgmma`` consumers, the persistent walk and the TMA-store epilogue, whose ``[N P Q, K]``
output is the NHWC image.

K steps run channel blocks fastest, then filter columns, then rows: the order of the filters
flattened as ``[K, R, S, C]``, so B's K tiles are the filter matrix's. Channels must be a
multiple of ``block_k`` (a K step never straddles two filter offsets). (Filter offsets
fastest, whose coordinates need no division by the runtime channel count, measured no faster:
35.6 against 33.0 us at 1 x 640 x 16^2.)
"""

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from attnlab.kernels.conv.abi import ImplicitConvSpec
from attnlab.kernels.gemm.sm90 import HgemmSm90


class ImplicitConvSm90(HgemmSm90):
    """Compile-time description of one implicit-GEMM convolution."""

    def __init__(self, spec: ImplicitConvSpec):
        super().__init__(spec.gemm)
        self.conv = spec
        # The im2col tensor's K mode nests (channels, s, r, t): the K step tiles channels.
        self.a_tiler = (self.cfg.block_m, (self.cfg.block_k,))

    def _a_operand(self, x: cute.Tensor, a_stage) -> tuple:
        """The im2col TMA atom over the NHWC image ``x`` as ``((W, H, N), C)`` (a 4-D
        descriptor: the 3-D convolution's 5-D form with one depth slice compiles too), the
        output pixels (C's rows) and the K steps."""
        cs = self.conv
        n, h, w, c = x.shape
        stride_n, stride_h, stride_w, _ = x.stride
        image = cute.make_tensor(x.iterator, cute.make_layout(
            ((w, h, n), c), stride=((stride_w, stride_h, stride_n), 1)))
        p = (h + 2 * cs.pad_h - cs.filter_r) // cs.stride_h + 1
        q = (w + 2 * cs.pad_w - cs.filter_s) // cs.stride_w + 1
        tma = tuple(cpasync.make_im2col_tma_atom(
            cpasync.CopyBulkTensorIm2ColG2SOp(), image, a_stage, self.a_tiler,
            lower_corner_whd=(-cs.pad_w, -cs.pad_h),
            upper_corner_whd=(cs.pad_w - (cs.filter_s - 1), cs.pad_h - (cs.filter_r - 1)),
            lower_padding_whd=(cs.pad_w, cs.pad_h),
            upper_padding_whd=(cs.pad_w, cs.pad_h),
            stride_whd=(cs.stride_w, cs.stride_h),
            lower_srt=(0, 0), stride_srt=(1, 1)))
        k_tiles = c // self.cfg.block_k * cs.filter_r * cs.filter_s
        return tma, n * p * q, k_tiles
