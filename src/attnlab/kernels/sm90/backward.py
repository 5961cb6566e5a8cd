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
  the two warpgroups split the head dim (B_r = 64) or the query rows (B_r = 128).
* Above hd128 a warpgroup cannot hold dK and dV of 64 key rows (2 x D fp32 values per
  thread): with ``split_head_dim`` (B_c = B_r = 64) both warpgroups take the same key rows,
  split S^T and dP^T along the query rows, and split dK, dV and dQ along the head dim. dV's
  and dK's A operands, P^T and dS^T, are then another warpgroup's registers too, so both go
  to shared memory (FA3's layout at hd256) and the barrier comes before dV. Each warp
  stages its 16-row slice of dQ_i in its own swizzled box of shared memory and adds it into
  ``dq_accum`` by one TMA reduce-add (the adds happen in L2), with no CTA barrier:
  per-element ``red`` instructions saturated the load/store unit (ncu: ``lg_throttle`` the
  top stall, 67 M reds at hd128 seq 8k), and row-sized bulk reduces made ptxas loop over the
  issuing lanes (20 % of the stall samples).

The GEMMs of a block after dS^T are issued in the order that keeps the tensor cores busy
while the warps work: dV (its A, P^T, is ready first), dS^T to shared memory while dV runs,
the barrier, dQ, then dK, which runs while dQ is staged and reduced.

``producer_warp`` (warp specialisation, as FA3 and FA4 feed their MMAs): warpgroup 0 is a
producer whose first warp copies Q_i, dO_i, L_i and D_i by TMA into the ring, each stage
guarded by a full (transaction) barrier and an empty one that the MMA warps release once
their dK MMA has read it; the producer gives its registers to the two MMA warpgroups
(``setmaxnreg``). The MMA warps then meet once per block (dS^T written, named barrier), with
dS^T double buffered so the next block's store cannot overwrite a tile the other warpgroup's
dQ still reads. Packed sequences: a tail box reads the next sequence's rows, which the
masked body drops (their P is 0), as the forward does.

Q_i, dO_i and K_j are each laid out once for both of their reads: the swizzle atom is chosen
for the narrower one (``major``), as FA3 does. ``cp.async`` writes through the generic proxy
and wgmma reads through the async one, so a proxy fence precedes every barrier that hands
shared memory from copies or stores to the MMAs.
"""

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from attnlab.config import WGMMA_M
from attnlab.kernels.abi import BackwardArgs
from attnlab.kernels.common.backward_walk import BackwardKernel
from attnlab.kernels.common.barriers import NamedBarrier
from attnlab.kernels.common.base import shared_tile
from attnlab.kernels.common.epilogue import store_fragment
from attnlab.kernels.common.layouts import acc_as_wgmma_operand_a
from attnlab.kernels.common.tma import (
    rows_first,
    stats_partition,
    stats_rows_first,
    tile_partition,
)
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

    def _warpgroups_along(self, rows: int) -> tuple[int, int]:
        """A GEMM's warpgroups along (M, N) when M is ``rows``: 64 rows each, the rest
        split N."""
        along_m = rows // WGMMA_M
        return along_m, self.cfg.num_warps // 4 // along_m

    @property
    def _dq_warpgroups(self) -> tuple[int, int]:
        """dQ's warpgroups along (B_r, D)."""
        return self._warpgroups_along(self.cfg.block_m)

    @property
    def _kv_warpgroups(self) -> tuple[int, int]:
        """S^T's, dP^T's, dV's and dK's warpgroups along (B_c, B_r or D)."""
        return self._warpgroups_along(self.cfg.block_n)

    def smem_layouts(self) -> tuple:
        cfg, D = self.cfg, self.head_dim
        # Q and dO are also dK's and dV's B operands, K dQ's, of which each warpgroup may
        # read a slice of the head dim.
        return (self._layout(cfg.block_m, D, cfg.q_stages, D // self._kv_warpgroups[1]),
                self._layout(cfg.block_n, D, 1, D // self._dq_warpgroups[1]),
                self._layout(cfg.block_n, cfg.block_m, cfg.ds_stages, cfg.block_m))

    def smem_tensor(self, buffer, layout) -> cute.Tensor:
        # The swizzle on the pointer: the form wgmma's descriptors take.
        return buffer.get_tensor(layout.outer, swizzle=layout.inner)

    def tiled_mmas(self) -> tuple:
        """S^T and dP^T, dV and dK (``_kv_warpgroups``: along B_c, or with
        ``split_head_dim`` along B_r and D), dQ (``_dq_warpgroups``)."""
        cfg, D = self.cfg, self.head_dim
        k_major, mn_major = warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN
        along_m, along_n = self._kv_warpgroups
        # P^T and dS^T: this warpgroup's accumulators, or shared memory when split.
        source = (warpgroup.OperandSource.SMEM if cfg.split_head_dim
                  else warpgroup.OperandSource.RMEM)
        return (sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, k_major, k_major,
                                                  cutlass.Float32, (along_m, along_n, 1),
                                                  (WGMMA_M, cfg.block_m // along_n)),
                sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, k_major, mn_major,
                                                  cutlass.Float32, (along_m, along_n, 1),
                                                  (WGMMA_M, D // along_n), source),
                sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, mn_major, mn_major,
                                                  cutlass.Float32, (*self._dq_warpgroups, 1),
                                                  (WGMMA_M, D // self._dq_warpgroups[1])))

    @property
    def _dq_box(self) -> tuple[int, int]:
        """dQ rows and columns one warp's accumulator holds: one TMA reduce box."""
        return 16, self.head_dim // self._dq_warpgroups[1]

    def _dq_staging(self):
        """One swizzled (16, columns) fp32 box per MMA warp, the layout a TMA box takes
        (the swizzle also spreads the warp's 64-bit stores over all banks). Widths other than
        32, 64 or 128 columns (hd96's 48, hd192's 96) take the 32-byte swizzle: the DSL's TMA
        builder aborts on 64-byte fp32 boxes and on three 128-byte atoms (4.8.1)."""
        rows, cols = self._dq_box
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, cutlass.Float32,
                                            cols if cols in (32, 64, 128) else 8),
            cutlass.Float32)
        return cute.tile_to_shape(atom, (rows, cols, self.cfg.num_warps), order=(0, 1, 2))

    def _dq_tile_view(self):
        """The (B_r, D) tile as the staged boxes hold it: rows (16 per warp, 4 warps per
        warpgroup, warpgroups along B_r), columns (a box's, warpgroups along D), in the
        order of the MMA's warpgroups (along B_r first)."""
        rows, cols = self._dq_box
        along_m, along_n = self._dq_warpgroups
        box = rows * cols
        return cute.make_layout(((rows, 4, along_m), (cols, along_n)),
                                stride=((1, box, 4 * box), (rows, 4 * box * along_m)))

    def extra_smem(self) -> dict:
        fields = {"sdQ": cute.struct.Align[cute.struct.MemRange[
            cutlass.Float32, cute.cosize(self._dq_staging())], 1024]}
        if self.cfg.split_head_dim:
            fields["sP"] = shared_tile(self.dtype, self.smem_layouts()[2])
        if self.cfg.producer_warp:
            # Full, then empty, per ring stage.
            fields["ring_bars"] = cute.struct.MemRange[cutlass.Int64, 2 * self.cfg.q_stages]
        return fields

    # ---- TMA: the producer warp's loads (``producer_warp``), dQ's reduce ------------------
    def tma_atoms(self, t: BackwardArgs, layouts: tuple):
        """TMA atoms of Q, dO (one ring stage a box) and of L, D (B_r rows a box) with
        ``producer_warp``, and always dQ's reduce-add (one warp's box)."""
        dq = tuple(cpasync.make_tiled_tma_atom(
            cpasync.CopyReduceBulkTensorTileS2GOp(), rows_first(t.dq_accum),
            cute.slice_(self._dq_staging(), (None, None, 0)), self._dq_box))
        if not self.cfg.producer_warp:
            return (dq,)
        stage = cute.slice_(layouts[0], (None, None, 0))
        load = cpasync.CopyBulkTensorTileG2SOp()
        tiles = tuple(tuple(cpasync.make_tiled_tma_atom(load, rows_first(x), stage,
                                                        (self.cfg.block_m, self.head_dim)))
                      for x in (t.q, t.dout))
        box = self.stats_box
        stats = tuple(tuple(cpasync.make_tiled_tma_atom(load, stats_rows_first(x),
                                                        cute.make_layout(box), (box,)))
                      for x in (t.lse_log2, t.dpsum))
        return (*tiles, *stats, dq)

    def ring_pipeline(self, storage):
        if not self.cfg.producer_warp:
            return None
        cfg = self.cfg
        tile_bytes = cfg.block_m * self.head_dim * self.dtype.width // 8
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.ring_bars.data_ptr(), num_stages=cfg.q_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            # One lane of each MMA warp releases a stage.
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, cfg.num_warps),
            tx_count=2 * tile_bytes + 2 * 4 * self.stats_box, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        return pipe

    @cute.jit
    def produce(self, loads, pipe, ring: tuple, walk: tuple) -> None:
        cfg, D = self.cfg, self.head_dim
        B_r = cfg.block_m
        first_head, group, m_min, m_max, _, batch, q_start = walk[:7]
        stats_shift = walk[-1]
        _, (sQ, sdO, sLSE, sdPsum) = ring
        origin = None
        if cutlass.const_expr(self.varlen):
            origin = (q_start, 0)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.q_stages)
        for g in cutlass.range(group, unroll=1):
            head = first_head + g
            tiles = (tile_partition(loads[0], sQ, (B_r, D), (None, 0), head, batch, origin),
                     tile_partition(loads[1], sdO, (B_r, D), (None, 0), head, batch, origin))
            for m_block in cutlass.range(m_min, m_max, unroll=1):
                pipe.producer_acquire(state)
                barrier = pipe.producer_get_barrier(state)
                for t in cutlass.range_constexpr(2):
                    smem, gmem = tiles[t]
                    cute.copy(loads[t][0], gmem[None, m_block], smem[None, state.index],
                              tma_bar_ptr=barrier)
                # L and D from the 16-byte row at or before the block's first.
                row0 = q_start - stats_shift + m_block * B_r
                for t, smem in ((2, sLSE), (3, sdPsum)):
                    s_stages, g_box = stats_partition(loads[t], smem, self.stats_box, head,
                                                      batch, row0)
                    cute.copy(loads[t][0], g_box[None, 0], s_stages[None, state.index],
                              tma_bar_ptr=barrier)
                state.advance()

    def consumers_sync(self) -> None:
        if self.cfg.producer_warp:
            NamedBarrier.BACKWARD_MMA.sync(self.cfg.num_threads)
        else:
            cute.arch.sync_threads()

    def operands(self, tidx, mmas: tuple, tiles: tuple, storage) -> tuple:
        """Per warpgroup, the descriptors' fragments of every shared operand (sliced by a
        warp-uniform index, so ptxas can keep them in uniform registers), and this thread's
        slices for the accumulators."""
        mma_s, mma_dkv, mma_dq = mmas
        sQ, sdO, sK, sV, sdS, sQt, sdOt, sKt, sdSt = tiles
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4
        if cutlass.const_expr(self.cfg.producer_warp):
            wg = wg - 1
        wg_s, wg_dkv, wg_dq = (m.get_slice(wg * 128) for m in mmas)
        frags = (wg_s.make_fragment_A(wg_s.partition_A(sK)),
                 wg_s.make_fragment_B(wg_s.partition_B(sQ)),
                 wg_s.make_fragment_A(wg_s.partition_A(sV)),
                 wg_s.make_fragment_B(wg_s.partition_B(sdO)),
                 wg_dkv.make_fragment_B(wg_dkv.partition_B(sdOt)),
                 wg_dkv.make_fragment_B(wg_dkv.partition_B(sQt)),
                 wg_dq.make_fragment_A(wg_dq.partition_A(sdSt)),
                 wg_dq.make_fragment_B(wg_dq.partition_B(sKt)))
        shared_a = None
        if cutlass.const_expr(self.cfg.split_head_dim):
            # dV's and dK's A operands, P^T and dS^T, from shared memory.
            sP = self.smem_tensor(storage.sP, self.smem_layouts()[2])
            shared_a = (sP, tidx, wg_dkv.make_fragment_A(wg_dkv.partition_A(sP)),
                        wg_dkv.make_fragment_A(wg_dkv.partition_A(sdS)))
        staging = self._dq_staging()
        boxes = storage.sdQ.get_tensor(staging.outer, swizzle=staging.inner)
        return (mmas, tuple(m.get_slice(tidx) for m in mmas), frags,
                (boxes, cute.composition(boxes, self._dq_tile_view())), shared_a)

    def _new_acc(self, thr, shape) -> cute.Tensor:
        return cute.make_rmem_tensor(thr.partition_shape_C(shape), cutlass.Float32)

    def gemm_s_dp(self, ops: tuple, stage, probabilities) -> tuple:
        """S^T = K Q^T and dP^T = V dO^T issued together; ``probabilities(S^T)`` once S^T
        has landed, while dP^T is still on the tensor cores."""
        (mma_s, _, _), (thr_s, _, _), frags = ops[:3]
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

    def gemm_dkv_dq(self, ops: tuple, stage, ds_stage, rP: cute.Tensor, rdS: cute.Tensor,
                    acc_dK: cute.Tensor, acc_dV: cute.Tensor, store_ds, finish_dq) -> None:
        """dV += P^T dO issued, dS^T stored while it runs, the barrier, dQ = dS K issued,
        then dK += dS^T Q once dV is done; dQ to ``finish_dq`` once it has landed, dK still
        running (``block_done`` waits for it). With ``split_head_dim``: P^T and dS^T
        stored, the barrier, then dV, dQ and dK from shared memory."""
        (mma_s, mma_dkv, mma_dq), (_, _, thr_dq), frags, _, shared_a = ops
        acc_dQ = self._new_acc(thr_dq, (self.cfg.block_m, self.head_dim))
        if cutlass.const_expr(self.cfg.split_head_dim):
            sP, tidx, tP, tdS = shared_a
            store_ds()
            store_fragment(rP, sP[None, None, ds_stage], mma_s, tidx, matrices=True)
            self.smem_to_mma()
            wgmma_gemm(mma_dkv, acc_dV, tP[None, None, None, ds_stage],
                       frags[4][None, None, None, stage], zero_init=False, wait=False)
            wgmma_gemm(mma_dq, acc_dQ, frags[6][None, None, None, ds_stage], frags[7],
                       zero_init=True, wait=False)
            wgmma_gemm(mma_dkv, acc_dK, tdS[None, None, None, ds_stage],
                       frags[5][None, None, None, stage], zero_init=False, wait=False)
            warpgroup.wait_group(1)
            finish_dq(acc_dQ)
            return
        wgmma_gemm(mma_dkv, acc_dV, acc_as_wgmma_operand_a(rP),
                   frags[4][None, None, None, stage], zero_init=False, wait=False)
        store_ds()
        self.smem_to_mma()
        wgmma_gemm(mma_dq, acc_dQ, frags[6][None, None, None, ds_stage], frags[7],
                   zero_init=True, wait=False)
        warpgroup.wait_group(1)
        wgmma_gemm(mma_dkv, acc_dK, acc_as_wgmma_operand_a(rdS),
                   frags[5][None, None, None, stage], zero_init=False, wait=False)
        warpgroup.wait_group(1)
        finish_dq(acc_dQ)

    def block_done(self) -> None:
        warpgroup.wait_group(0)

    def dq_tile(self, mdQacc: cute.Tensor, loads, batch, q_start, head, m_block):
        """dQ's TMA reduce atom and the coordinates of query block ``m_block``'s tile (a
        packed sequence's from its first row)."""
        atom, coords = loads[-1]
        coords = coords[None, None, head, batch]
        if cutlass.const_expr(self.varlen):
            coords = cute.domain_offset((q_start, 0), coords)
        return atom, cute.local_tile(coords, (self.cfg.block_m, self.head_dim), (m_block, 0))

    @cute.jit
    def add_dq(self, ops: tuple, acc_dQ: cute.Tensor, gdQ: cute.Tensor, tdQcdQ: cute.Tensor,
               rows_left, tidx):
        """dQ's tile into ``dq_accum`` through shared memory, warp by warp: a warp stages
        the 16 rows (by its warpgroup's columns) its accumulator holds in its own box, then
        issues one TMA reduce-add of the box (the adds happen in L2). No CTA barrier: a warp
        reads back only what it wrote, and waits for its own previous reduce to have read
        its box before writing again. Rows past the tensor are clipped by the TMA unit; the
        rows of a packed sequence's tail box that belong to the next sequence get exact
        zeros (their dS columns are masked), so ``rows_left`` needs no check."""
        mmas, _, _, (boxes, tile), _ = ops
        atom, gdQ = gdQ
        rows, cols = self._dq_box
        lane = cute.arch.lane_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if cutlass.const_expr(self.cfg.producer_warp):
            warp = warp - 4
        cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.sync_warp()
        store_fragment(acc_dQ, tile, mmas[-1], tidx)
        # Generic-proxy stores, read next by the TMA unit (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        # The warp's first row and column in the tile: those of lane 0's first element.
        row = tdQcdQ[0][0] - lane // 4
        col = tdQcdQ[0][1] - 2 * (lane % 4)
        src, dst = cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(boxes[None, None, warp], 0, 2),
            cute.group_modes(cute.local_tile(gdQ, (rows, cols), (row // rows, col // cols)),
                             0, 2))
        cute.copy(atom, src, dst)
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def dq_added(self, tidx):
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    def smem_to_mma(self):
        # cp.async copies and st.shared write through the generic proxy; wgmma reads
        # through the async one.
        cute.arch.fence_proxy("async.shared", space="cta")
        self.consumers_sync()
