"""Implicit-GEMM convolution: the lab's implicit GEMM on both HGEMM kernels (an
``ImplicitConvSpec``).

The convolution is the GEMM ``out[N P Q, K] = A[N P Q, R S C] @ filters[K, R S C]^T`` whose
row ``(n, p, q)`` of A is the filter window of output pixel ``(p, q)`` of image ``n``. im2col
writes A out (nine times the image at 3 x 3); implicit GEMM loads A's tiles straight from the
image. K steps run channel blocks fastest, then filter columns, then rows: the order of the
filters flattened as ``[K, R, S, C]``, so B's K tiles are the filter matrix's (a transposed
weight) and the ``[N P Q, K]`` output is the NHWC image. Channels must be a multiple of
``block_k`` (a K step never straddles two filter offsets).

* ``ImplicitConvSm80`` (``mma.sync``, any sm80+ GPU; the lab's step): each thread keeps a
  **coordinate table** of the output pixels its A copies serve (image, first input row and
  column of the window), computed once per tile, and per K step adds the filter offset,
  checks the row and column against the image and either issues the 16-byte ``cp.async`` of
  those channels or writes zeros (the padding). The rest is the ``mma.sync`` HGEMM
  (``kernels/gemm/sm80.py``: the ring, ``ldmatrix``, the MMAs); whole tiles only.
* ``ImplicitConvSm90`` (``wgmma``/TMA, the lab's v2 on Hopper): the TMA unit's **im2col
  mode** walks ``block_m`` consecutive output pixels (across rows and images), reads for each
  the ``block_k`` channels at one filter offset ``(r, s)`` and fills the window's part
  outside the image with zeros: the coordinate tables live in the descriptor and the unit
  computes the addresses. One copy per K step, the same swizzled tile a matrix's TMA copy
  writes, so everything else is the HGEMM (``kernels/gemm/sm90.py``).
"""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from attnlab.kernels.conv.abi import ImplicitConvSpec, output_size
from attnlab.kernels.gemm.sm80 import HgemmSm80
from attnlab.kernels.gemm.sm90 import HgemmSm90


class ImplicitConvSm80(HgemmSm80):
    """Compile-time description of one ``mma.sync`` implicit-GEMM convolution."""

    def __init__(self, spec: ImplicitConvSpec):
        super().__init__(spec.gemm)
        self.conv = spec

    def _a_tiles(self, x: cute.Tensor, m):
        """The image and the CTA's first output pixel: A's tiles are gathered."""
        return x, m * self.cfg.block_m

    def _a_loads(self, thr_load, a_src: tuple, sA: cute.Tensor) -> tuple:
        """The coordinate table of this thread's copy rows: each row's output pixel and the
        image row and column its window starts at; and the K tiles."""
        x, first = a_src
        cs, cfg = self.conv, self.cfg
        n, h, w, c = x.shape
        p = output_size(h, cs.filter_r, cs.stride_h, cs.pad_h)
        q = output_size(w, cs.filter_s, cs.stride_w, cs.pad_w)
        coord = thr_load.partition_S(cute.make_identity_tensor((cfg.block_m, cfg.block_k)))
        dst = thr_load.partition_D(sA)
        rows = cute.size(dst, mode=[1])
        pixel = cute.make_rmem_tensor((rows,), cutlass.Int32)
        image = cute.make_rmem_tensor((rows,), cutlass.Int32)
        top = cute.make_rmem_tensor((rows,), cutlass.Int32)
        left = cute.make_rmem_tensor((rows,), cutlass.Int32)
        # A plain loop (this helper is traced inline, not preprocessed): unrolled.
        for i in range(rows):
            g = first + coord[0, i, 0][0]
            pixel[i] = g
            image[i] = g // (p * q)
            top[i] = g // q % p * cs.stride_h - cs.pad_h
            left[i] = g % q * cs.stride_w - cs.pad_w
        table = (x, coord, dst, pixel, image, top, left, n * p * q)
        return table, c // cfg.block_k * cs.filter_r * cs.filter_s

    @cute.jit
    def _load_a(self, gmem_load: cute.TiledCopy, a_load: tuple, k, stage):
        """K step ``k``'s A tile: per copy row, the filter offset added to its window's
        corner; inside the image its channels by ``cp.async``, else zeros."""
        x, coord, dst, pixel, image, top, left, pixels = a_load
        cs = self.conv
        blocks = x.shape[3] // self.cfg.block_k
        block = k % blocks
        s = k // blocks % cs.filter_s
        r = k // (blocks * cs.filter_s)
        for i in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            row, col = top[i] + r, left[i] + s
            inside = pixel[i] < pixels and row >= 0 and row < x.shape[1]
            if inside and col >= 0 and col < x.shape[2]:
                channels = x[image[i], row, col, None]
                for kk in cutlass.range_constexpr(cute.size(dst, mode=[2])):
                    ptr = cute.make_ptr(
                        self.dtype, (channels.iterator + block * self.cfg.block_k
                                     + coord[0, i, kk][1]).toint(),
                        cute.AddressSpace.gmem, assumed_align=16)
                    cute.copy(gmem_load, cute.make_tensor(ptr, dst[None, i, kk, stage].layout),
                              dst[None, i, kk, stage])
            else:
                dst[None, i, None, stage].fill(0)


class ImplicitConvSm90(HgemmSm90):
    """Compile-time description of one TMA-im2col implicit-GEMM convolution."""

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
        p = output_size(h, cs.filter_r, cs.stride_h, cs.pad_h)
        q = output_size(w, cs.filter_s, cs.stride_w, cs.pad_w)
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
