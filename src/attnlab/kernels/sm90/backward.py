"""FlashAttention-2 backward for sm_90a with warpgroup MMAs (``wgmma``), configured by
``BackwardConfig`` with ``wgmma=True``.

The walk and the math between the GEMMs are ``kernels/common/backward_walk.py``'s, as for the
``mma.sync`` kernel; what changes is the GEMMs. Two warpgroups own 64 key rows each (B_c =
128) and issue 64-row ``wgmma`` steps that read their shared operands through matrix
descriptors: no ``ldmatrix``, and one read of Q_i or dO_i per warpgroup instead of one per
warp, the shared-memory traffic that bounds the ``mma.sync`` kernel (docs/backward.md).

* S^T = K_j Q_i^T and dP^T = V_j dO_i^T: both operands K-major in shared memory.
* dV += P^T dO_i and dK += dS^T Q_i: A from the accumulator registers (P^T and dS^T converted
  to 16 bits are already the A layout, ``acc_as_wgmma_operand_a``), B = dO_i and Q_i read
  MN-major through a transposed view of the same shared tiles.
* dQ_i = dS K_j: dS^T (written once to shared memory) read MN-major as A, K_j MN-major as B;
  the two warpgroups split the head dim (B_r = 64) or the query rows (B_r = 128). dQ_i goes
  to shared memory and from there into ``dq_accum`` by one bulk reduce-add per row segment
  (the TMA engine adds in L2), each warp its own rows, with no CTA barrier: per-element
  ``red`` instructions saturated the load/store unit (ncu: ``lg_throttle`` the top stall,
  67 M reds at hd128 seq 8k).

Q_i, dO_i and K_j are each laid out once for both of their reads: the swizzle atom is chosen
for the narrower one (``major``), as FA3 does. ``cp.async`` writes through the generic proxy
and wgmma reads through the async one, so a proxy fence precedes every barrier that hands
shared memory from copies or stores to the MMAs.
"""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from attnlab.backward_config import DQ_ROW_PAD
from attnlab.config import WGMMA_M
from attnlab.kernels.common.backward_walk import BackwardKernel
from attnlab.kernels.common.epilogue import store_fragment
from attnlab.kernels.common.layouts import acc_as_wgmma_operand_a
from attnlab.kernels.sm90.bulk import bulk_reduce_add_f32
from attnlab.kernels.sm90.wgmma import wgmma_gemm


class FlashBackwardSm90(BackwardKernel):
    """The ``wgmma`` backward kernel of a ``BackwardSpec``."""

    def _layout(self, rows: int, cols: int, stages: int, major: int):
        """Row-major (rows, cols, stages) tiles with the swizzle atom of a ``major``-wide
        read (the widest that both of a tile's wgmma reads can start on)."""
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, major),
            self.dtype)
        return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))

    @property
    def _dq_warpgroups(self) -> tuple[int, int]:
        """dQ's warpgroups along (B_r, D): 64 query rows each, the rest split the head dim."""
        along_m = self.cfg.block_m // WGMMA_M
        return along_m, self.cfg.block_n // WGMMA_M // along_m

    def smem_layouts(self) -> tuple:
        cfg, D = self.cfg, self.head_dim
        # K is also dQ's B operand, of which each warpgroup may read a slice of the head dim.
        return (self._layout(cfg.block_m, D, cfg.q_stages, D),
                self._layout(cfg.block_n, D, 1, D // self._dq_warpgroups[1]),
                self._layout(cfg.block_n, cfg.block_m, 1, cfg.block_m))

    def smem_tensor(self, buffer, layout) -> cute.Tensor:
        # The swizzle on the pointer: the form wgmma's descriptors take.
        return buffer.get_tensor(layout.outer, swizzle=layout.inner)

    def tiled_mmas(self) -> tuple:
        """S^T and dP^T, dV and dK (warpgroups along B_c), dQ (``_dq_warpgroups``)."""
        cfg, D = self.cfg, self.head_dim
        k_major, mn_major = warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN
        along_m = (cfg.block_n // WGMMA_M, 1, 1)
        return (sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, k_major, k_major,
                                                  cutlass.Float32, along_m,
                                                  (WGMMA_M, cfg.block_m)),
                sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, k_major, mn_major,
                                                  cutlass.Float32, along_m, (WGMMA_M, D),
                                                  warpgroup.OperandSource.RMEM),
                sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, mn_major, mn_major,
                                                  cutlass.Float32, (*self._dq_warpgroups, 1),
                                                  (WGMMA_M, D // self._dq_warpgroups[1])))

    def _dq_layout(self):
        return cute.make_layout((self.cfg.block_m, self.head_dim),
                                stride=(self.head_dim + DQ_ROW_PAD, 1))

    def extra_smem(self) -> dict:
        return {"sdQ": cute.struct.Align[cute.struct.MemRange[
            cutlass.Float32, cute.cosize(self._dq_layout())], 128]}

    def operands(self, tidx, mmas: tuple, tiles: tuple, storage) -> tuple:
        """Per warpgroup, the descriptors' fragments of every shared operand (sliced by a
        warp-uniform index, so ptxas can keep them in uniform registers), and this thread's
        slices for the accumulators."""
        mma_s, mma_dkv, mma_dq = mmas
        sQ, sdO, sK, sV, sdS, sQt, sdOt, sKt, sdSt = tiles
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4
        wg_s, wg_dkv, wg_dq = (m.get_slice(wg * 128) for m in mmas)
        frags = (wg_s.make_fragment_A(wg_s.partition_A(sK)),
                 wg_s.make_fragment_B(wg_s.partition_B(sQ)),
                 wg_s.make_fragment_A(wg_s.partition_A(sV)),
                 wg_s.make_fragment_B(wg_s.partition_B(sdO)),
                 wg_dkv.make_fragment_B(wg_dkv.partition_B(sdOt)),
                 wg_dkv.make_fragment_B(wg_dkv.partition_B(sQt)),
                 wg_dq.make_fragment_A(wg_dq.partition_A(sdSt)),
                 wg_dq.make_fragment_B(wg_dq.partition_B(sKt)))
        return (mmas, tuple(m.get_slice(tidx) for m in mmas), frags,
                storage.sdQ.get_tensor(self._dq_layout()))

    def _new_acc(self, thr, shape) -> cute.Tensor:
        return cute.make_rmem_tensor(thr.partition_shape_C(shape), cutlass.Float32)

    def gemm_s_dp(self, ops: tuple, stage, probabilities) -> tuple:
        """S^T = K Q^T and dP^T = V dO^T issued together; ``probabilities(S^T)`` once S^T
        has landed, while dP^T is still on the tensor cores."""
        (mma_s, _, _), (thr_s, _, _), frags, _ = ops
        shape = (self.cfg.block_n, self.cfg.block_m)
        acc_S, acc_dP = self._new_acc(thr_s, shape), self._new_acc(thr_s, shape)
        wgmma_gemm(mma_s, acc_S, frags[0], frags[1][None, None, None, stage], zero_init=True,
                   wait=False)
        wgmma_gemm(mma_s, acc_dP, frags[2], frags[3][None, None, None, stage],
                   zero_init=True, wait=False)
        warpgroup.wait_group(1)
        probabilities(acc_S)
        warpgroup.wait_group(0)
        return acc_S, acc_dP

    def gemm_dkv(self, ops: tuple, stage, rP: cute.Tensor, rdS: cute.Tensor,
                 acc_dK: cute.Tensor, acc_dV: cute.Tensor, store_ds) -> None:
        """dV += P^T dO and dK += dS^T Q issued while dS^T goes to shared memory
        (``store_ds``); not waited for: they complete under dQ's MMAs (``gemm_dq``)."""
        (_, mma_dkv, _), _, frags, _ = ops
        wgmma_gemm(mma_dkv, acc_dV, acc_as_wgmma_operand_a(rP),
                   frags[4][None, None, None, stage], zero_init=False, wait=False)
        wgmma_gemm(mma_dkv, acc_dK, acc_as_wgmma_operand_a(rdS),
                   frags[5][None, None, None, stage], zero_init=False, wait=False)
        store_ds()

    def gemm_dq(self, ops: tuple) -> cute.Tensor:
        (_, _, mma_dq), (_, _, thr_dq), frags, _ = ops
        acc = self._new_acc(thr_dq, (self.cfg.block_m, self.head_dim))
        # Waits for dV and dK too (``gemm_dkv``).
        wgmma_gemm(mma_dq, acc, frags[6], frags[7], zero_init=True)
        return acc

    @cute.jit
    def add_dq(self, ops: tuple, acc_dQ: cute.Tensor, gdQ: cute.Tensor, tdQcdQ: cute.Tensor,
               rows_left, tidx):
        """dQ's tile into ``gdQ`` through shared memory, warp by warp: a warp stages the 16
        rows (by its warpgroup's columns) its accumulator holds, then 16 of its lanes issue
        one bulk reduce-add per row segment. No CTA barrier: a warp reads back only what it
        wrote, and waits for its own previous bulk reads before writing again."""
        (_, _, mma_dq), _, _, sdQ = ops
        lane = cute.arch.lane_idx()
        if lane < 16:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.sync_warp()
        store_fragment(acc_dQ, sdQ, mma_dq, tidx)
        # Generic-proxy stores, read next by the TMA engine (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        # The warp's first row and column: those of lane 0's first accumulator element.
        row = tdQcdQ[0][0] - lane // 4 + lane
        col = tdQcdQ[0][1] - 2 * (lane % 4)
        if lane < 16:
            if row < rows_left:
                bulk_reduce_add_f32(sdQ.iterator + cute.crd2idx((row, col), sdQ.layout),
                                    gdQ.iterator + cute.crd2idx((row, col), gdQ.layout),
                                    self.head_dim // self._dq_warpgroups[1] * 4)
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def dq_added(self, tidx):
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    def smem_to_mma(self):
        # cp.async copies and st.shared write through the generic proxy; wgmma reads
        # through the async one.
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_threads()
