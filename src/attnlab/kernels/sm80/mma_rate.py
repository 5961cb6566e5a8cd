"""The ``mma.sync`` ceiling: a kernel that does nothing but the forward kernel's tensor-core
instruction.

Each warp keeps ``chains`` independent m16n8k16 accumulators (16 x 8 * chains of fp32) and
multiplies the same register fragments into them ``steps`` times: no memory traffic, no
softmax, no dependency between consecutive MMAs of one step. Enough resident warps keep every
sub-partition's tensor pipe busy, so FLOPs / time is the most that ``mma.sync`` can do on the
GPU at hand: the roof the ``mma.sync`` kernel (HMMA from registers) runs under, as the bf16
matmul (``wgmma`` on Hopper) is the roof of the best libraries. Operands come from the
thread index, never zeros (the tensor cores' power, hence clocks, depends on the data).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warp

#: Shape of one ``mma.sync`` (M, N, K) and the FLOPs it does.
MMA_SHAPE = (16, 8, 16)
MMA_FLOPS = 2 * MMA_SHAPE[0] * MMA_SHAPE[1] * MMA_SHAPE[2]


class MmaSyncRate:
    """Compile-time description: operand dtype, independent accumulators per warp, MMA
    steps, warps per CTA. Call (through ``attnlab.jit.compile_kernel``) with an fp32 output
    tensor of one value per thread (so the MMAs are not dead code) and the grid size."""

    def __init__(self, dtype: type[cutlass.Numeric], chains: int = 8, steps: int = 4096,
                 num_warps: int = 8):
        self.dtype = dtype
        self.chains = chains
        self.steps = steps
        self.num_warps = num_warps

    def flops(self, num_ctas: int) -> int:
        """FLOPs of one launch of ``num_ctas`` CTAs."""
        return num_ctas * self.num_warps * self.steps * self.chains * MMA_FLOPS

    @staticmethod
    def fake_args() -> tuple:
        """Compile-time stand-ins for the launch arguments (output tensor, grid size)."""
        from cutlass.cute.runtime import make_fake_tensor

        out = make_fake_tensor(cutlass.Float32, (cute.sym_int(),), stride=(1,),
                               assumed_align=4)
        return out, cutlass.Int32(1)

    @cute.jit
    def __call__(self, out: cute.Tensor, num_ctas: cutlass.Int32, stream: cuda.CUstream):
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, MMA_SHAPE), (1, 1, 1))
        self.kernel(out, tiled_mma).launch(grid=(num_ctas, 1, 1),
                                           block=[32 * self.num_warps, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mOut: cute.Tensor, tiled_mma: cute.TiledMma):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        thr_mma = tiled_mma.get_slice(lane)
        m, n, k = MMA_SHAPE
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((m, n * self.chains)),
                                    cutlass.Float32)
        acc.fill(0.0)
        a = cute.make_rmem_tensor(thr_mma.partition_shape_A((m, k)), self.dtype)
        b = cute.make_rmem_tensor(thr_mma.partition_shape_B((n * self.chains, k)), self.dtype)
        # Small values that differ per thread and element: the sums stay finite over the steps.
        seed = cutlass.Float32(tidx % 97) * 1e-3
        for i in cutlass.range_constexpr(cute.size(a)):
            a[i] = (seed + i * 1e-2).to(self.dtype)
        for i in cutlass.range_constexpr(cute.size(b)):
            b[i] = (seed - i * 1e-2).to(self.dtype)
        for _ in cutlass.range(self.steps, unroll=8):
            cute.gemm(tiled_mma, acc, a[None, None, 0], b[None, None, 0], acc)
        total = cutlass.Float32(0.0)
        for i in cutlass.range_constexpr(cute.size(acc)):
            total += acc[i]
        mOut[cta * 32 * self.num_warps + tidx] = total
