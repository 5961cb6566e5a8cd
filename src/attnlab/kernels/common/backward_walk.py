"""What both backward kernels share: the launch, the walk over query blocks and the math
between the GEMMs (FlashAttention-2's backward, in the transposed frame).

A CTA owns ``block_n`` key rows (B_c) of one sequence and K/V head, keeps K_j and V_j in
shared memory and dK_j, dV_j in registers, and walks the query blocks i (B_r rows) that see
them, for every query head of the K/V head's group (GQA sums the group's gradients in
registers, no extra pass). Per block:

* S^T = K_j Q_i^T and P^T = exp2(S^T * scale * log2 e - L_i * log2 e): P is recomputed from
  the forward's log-sum-exp, with no running max or rescale;
* dP^T = V_j dO_i^T and dS^T = P^T * (dP^T - D_i), D_i = rowsum(dO_i * O_i) (preprocess);
* dV_j += P^T dO_i and dK_j += dS^T Q_i with P^T and dS^T straight from the accumulator
  registers (the forward's P V trick);
* dS^T goes to shared memory once, and dQ_i += dS K_j is added to an fp32 ``dq_accum``
  (``add_dq``: ``red.global.add.f32``, or TMA reduce-adds on sm_90a). ``deterministic``
  makes the K/V blocks add in block order: each CTA waits on a per-(sequence, head, query
  block) counter for the blocks before it.

Q_i, dO_i, L_i and D_i are a ring of ``q_stages``: loaded by ``cp.async`` (the next block
loads while this one computes, a CTA barrier hands each stage over), or with
``producer_warp`` by an architecture's producer warp (``produce``) behind full/empty
barriers, the MMA warps then being its consumers. The mask is the forward's read the other
way round (``mask.query_block_range``, ``masked_query_bounds``): blocks wholly inside the band
run a body with no mask code. Rows past the sequences are zero-filled by ``cp.async`` (a TMA
box reads the next packed sequence's, whose P the masked body zeroes); the preprocess pads L
and D to whole query blocks.

An architecture's class supplies the shared-memory layouts and tensors, the tiled MMAs and
the five GEMMs (``smem_layouts``, ``smem_tensor``, ``tiled_mmas``, ``operands``,
``gemm_s_dp``, ``gemm_dkv_dq``, ``block_done``, ``smem_to_mma``, ``add_dq``; with
``producer_warp`` also ``tma_atoms``, ``ring_pipeline``, ``produce`` and
``consumers_sync``): ``mma.sync`` with ``ldmatrix`` (``kernels/sm80/backward.py``) or
warpgroup MMAs reading shared memory through descriptors (``kernels/sm90/backward.py``).
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass.cute.nvgpu import cpasync

from attnlab.config import L2_SECTION_MB
from attnlab.kernels.abi import STATS_ROW_MULTIPLE, BackwardArgs, BackwardSpec
from attnlab.kernels.common.base import AttentionKernel, shared_storage, shared_tile
from attnlab.kernels.common.epilogue import stage_o, store_fragment, store_rows
from attnlab.kernels.common.layouts import COPY_BITS, acc_mn_view, row_copy, transposed
from attnlab.kernels.common.mask import (
    apply_mask_transposed,
    kv_block_range,
    masked_query_bounds,
    phase_bounds,
    phase_masked,
    query_block_range,
)
from attnlab.kernels.common.rematerialize import per_iteration
from attnlab.kernels.common.tensors import (
    load_rows,
    problem_tensors,
    sequence_extent,
    sequence_rows,
)
from attnlab.kernels.common.tile_scheduler import DSL_OPS, TileScheduler, heads_per_section
from attnlab.kernels.sm90.registers import CONSUMER_REGS, PRODUCER_REGS

LOG2_E = math.log2(math.e)
#: MMA warpgroups beside a ``producer_warp``'s warpgroup (their ``setmaxnreg`` budgets).
MMA_WARPGROUPS = 2


class BackwardKernel(AttentionKernel):
    """Compile-time description of one backward kernel (a ``BackwardSpec``); called
    (through ``cute.compile``) with the ``kernels.abi.BackwardArgs`` and a stream."""

    def __init__(self, spec: BackwardSpec):
        super().__init__(spec)
        self.deterministic = spec.deterministic
        # sm_90's reduce takes two fp32 at once (red.global.add.v2.f32).
        self.paired_reduce = spec.arch == "sm_90a"

    # ---- what an architecture supplies -------------------------------------------------------
    def smem_layouts(self) -> tuple:
        """Shared-memory layouts of (Q and dO stages, K and V, dS^T stages)."""
        raise NotImplementedError

    def smem_tensor(self, buffer, layout) -> cute.Tensor:
        """A shared-memory buffer as a tensor of ``layout``."""
        raise NotImplementedError

    def tiled_mmas(self) -> tuple:
        """The tiled MMAs: the first is S^T's (its accumulator partition is the elementwise
        math's and dS^T's store), the last dQ's."""
        raise NotImplementedError

    def operands(self, tidx, mmas: tuple, tiles: tuple, storage) -> tuple:
        """This thread's fragments and copies of the GEMMs' operands; ``tiles``: sQ, sdO,
        sK, sV, sdS and the transposed views sQt, sdOt, sKt, sdSt; ``storage``: the shared
        memory (for what ``extra_smem`` added). Its first element is ``mmas``."""
        raise NotImplementedError

    def extra_smem(self) -> dict:
        """Shared-memory fields beyond the common ones."""
        return {}

    @property
    def stats_box(self) -> int:
        """L and D rows per ring stage. A TMA box must start on 16 bytes, and a packed
        sequence's rows start anywhere: the producer then loads from the 16-byte row at or
        before the block's first, ``STATS_ROW_MULTIPLE`` rows more."""
        extra = STATS_ROW_MULTIPLE if self.varlen and self.cfg.producer_warp else 0
        return self.cfg.block_m + extra

    @property
    def stats_stride(self) -> int:
        """Floats between ring stages of L (and D): whole 128-byte lines, where a TMA copy
        lands."""
        return -(-self.stats_box // 32) * 32

    def tma_atoms(self, t: BackwardArgs, layouts: tuple):
        """Host side: the kernel's TMA atoms (what ``produce`` copies with, dQ's reduce), or
        None."""
        return None

    def ring_pipeline(self, storage):
        """The ring's full/empty barriers (``producer_warp``), initialised; else None."""
        return None

    def produce(self, loads, pipe, ring: tuple, walk: tuple) -> None:
        """The producer warp (``producer_warp``): every query block of the walk into the
        ring, in the consumers' order."""
        raise NotImplementedError

    def consumers_sync(self) -> None:
        """A barrier of the MMA warps only."""
        cute.arch.sync_threads()

    @staticmethod
    def tiled_mmas_of(ops: tuple) -> tuple:
        return ops[0]

    # ---- host side -------------------------------------------------------------------------
    @cute.jit
    def __call__(self, q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, dout: cute.Tensor,
                 lse_log2: cute.Tensor, dpsum: cute.Tensor, dq_accum: cute.Tensor,
                 dk: cute.Tensor, dv: cute.Tensor, cu_seqlens_q: cute.Tensor | None,
                 cu_seqlens_k: cute.Tensor | None, softmax_scale: cutlass.Float32,
                 window_left: cutlass.Int32, window_right: cutlass.Int32,
                 max_seqlen_k: cutlass.Int32, semaphores: cute.Tensor | None,
                 stream: cuda.CUstream):
        """Launch on the arguments of ``kernels.abi.BackwardArgs`` (and the stream)."""
        num_seqs = cu_seqlens_q.shape[0] - 1 if self.varlen else q.shape[0]
        views = BackwardArgs(*problem_tensors((q, k, v, dout, lse_log2, dpsum, dq_accum, dk,
                                               dv), self.varlen),
                             cu_seqlens_q, cu_seqlens_k, softmax_scale, window_left,
                             window_right, max_seqlen_k, semaphores)
        self.launch(views, num_seqs, stream)

    def launch(self, t: BackwardArgs, num_seqs: cutlass.Int32, stream: cuda.CUstream):
        """Shared memory, copies and MMAs, then the launch: one CTA per (K/V block, K/V
        head, sequence), the K/V block fastest, so the CTAs in flight share a few heads' Q
        and dO in L2 (the K/V block slowest, longest-first under a causal mask, measured
        -20 % at hd128 seq 2k: every CTA then streams its own head), and a block is always
        dispatched after the blocks before it (what ``deterministic`` waits on)."""
        cfg, D = self.cfg, self.head_dim
        layouts = self.smem_layouts()
        q_layout, kv_layout, ds_layout = layouts
        stats = cute.struct.Align[cute.struct.MemRange[cutlass.Float32,
                                                       self.stats_stride * cfg.q_stages], 128]
        SharedStorage = shared_storage({
            "sQ": shared_tile(self.dtype, q_layout), "sdO": shared_tile(self.dtype, q_layout),
            "sK": shared_tile(self.dtype, kv_layout), "sV": shared_tile(self.dtype, kv_layout),
            "sdS": shared_tile(self.dtype, ds_layout),
            # L and D of the ring's query blocks: (B_r, q_stages) each.
            "sLSE": stats, "sdPsum": stats, **self.extra_smem()})
        load_atom = cute.make_copy_atom(cpasync.CopyG2SOp(
            cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=COPY_BITS)
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                         num_bits_per_copy=COPY_BITS)
        # L and D: one fp32 per query row, a thread each (the preprocess pads them to whole
        # query blocks, so no row needs a bounds check).
        stats_atom = cute.make_copy_atom(cpasync.CopyG2SOp(
            cache_mode=cpasync.LoadCacheMode.ALWAYS), cutlass.Float32, num_bits_per_copy=32)
        copies = (row_copy(load_atom, cfg.num_threads, D),
                  row_copy(store_atom, cfg.num_threads, D),
                  cute.make_tiled_copy_tv(stats_atom, cute.make_layout(cfg.block_m),
                                          cute.make_layout(1)))
        num_n_blocks = cute.ceil_div(t.max_seqlen_k, cfg.block_n)
        grid = self.tile_scheduler(num_n_blocks, num_seqs, t.q, t.k).grid()
        self.kernel(t.q, t.k, t.v, t.dout, t.lse_log2, t.dpsum, t.dq_accum, t.dk, t.dv,
                    t.cu_seqlens_q, t.cu_seqlens_k, t.softmax_scale, t.window_left,
                    t.window_right, t.semaphores, layouts, copies, self.tiled_mmas(),
                    self.tma_atoms(t, layouts), SharedStorage, num_n_blocks, num_seqs,
                    ).launch(grid=grid, block=[cfg.launch_threads, 1, 1], stream=stream,
                             min_blocks_per_mp=1)

    def tile_scheduler(self, num_n_blocks, num_seqs, mQ: cute.Tensor,
                       mK: cute.Tensor) -> TileScheduler:
        """The launch's order of (K/V block, sequence, K/V head) tiles: the K/V block
        fastest, so the CTAs in flight share a few heads' Q and dO in L2 (the K/V block
        slowest over the whole launch measured -31 % at hd128 seq 2k causal: every CTA then
        streams its own head); with ``lpt`` under a mask, longest first over L2 sections of
        as many pairs as keep their Q, dO and dQ rows in L2. Either way a pair's K/V blocks
        are dispatched in index order (what ``deterministic`` waits on)."""
        section = None
        if cutlass.const_expr(self.windowed and self.cfg.lpt):
            group = mQ.shape[2] // mK.shape[2]
            rows = mQ.shape[1]
            if cutlass.const_expr(self.varlen):
                rows = cutlass.max(rows // num_seqs, 1)
            # Q and dO (16-bit) and dQ's fp32 accumulator, per row of each query head.
            section = heads_per_section(rows, group * self.head_dim * 8, 1,
                                        L2_SECTION_MB << 20, DSL_OPS)
        return TileScheduler(num_n_blocks, num_seqs, mK.shape[2], False, self.windowed,
                             self.cfg.lpt, section, first_is_longest=True)

    # ---- device side -----------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               softmax_scale: cutlass.Float32, window_left: cutlass.Int32,
               window_right: cutlass.Int32, mSem: cute.Tensor, layouts, copies, mmas, loads,
               SharedStorage: cutlass.Constexpr, num_n_blocks: cutlass.Int32,
               num_seqs: cutlass.Int32):
        cfg, D = self.cfg, self.head_dim
        B_r, B_c = cfg.block_m, cfg.block_n
        q_layout, kv_layout, ds_layout = layouts
        tidx, _, _ = cute.arch.thread_idx()
        n_block, seq, head_kv = self.tile_scheduler(num_n_blocks, num_seqs, mQ, mK).tile()
        group = mQ.shape[2] // mK.shape[2]

        # ---- this CTA's sequence and its walk over query blocks ---------------------------
        batch, q_start, k_start, seqlen_q, seqlen_k = sequence_extent(
            seq, mQ, mK, mCuQ, mCuK, self.varlen)
        key0 = n_block * B_c
        m_min, m_max = query_block_range(key0, seqlen_q, seqlen_k, window_left, window_right,
                                         B_c, B_r, self.windowed)
        if cutlass.const_expr(self.varlen):
            # Past the end of a short sequence (the grid is sized for the longest): no work.
            m_max = m_min if key0 >= seqlen_k else m_max

        # ---- shared memory ----------------------------------------------------------------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = self.smem_tensor(storage.sQ, q_layout)
        sdO = self.smem_tensor(storage.sdO, q_layout)
        sK = self.smem_tensor(storage.sK, kv_layout)[None, None, 0]
        sV = self.smem_tensor(storage.sV, kv_layout)[None, None, 0]
        sdS = self.smem_tensor(storage.sdS, ds_layout)
        stages = cfg.q_stages
        sLSE, sdPsum = (buf.get_tensor(cute.make_layout((self.stats_box, stages),
                                                        stride=(1, self.stats_stride)))
                        for buf in (storage.sLSE, storage.sdPsum))
        # Per query block: global tensors and their shared ring (Q, dO, L, D).
        ring = ((mQ, mdO, mLSE, mdPsum), (sQ, sdO, sLSE, sdPsum))
        tiles = (sQ, sdO, sK, sV, sdS, *(transposed(s, B_r, D, stages) for s in (sQ, sdO)),
                 transposed(sK, B_c, D), transposed(sdS, B_c, B_r, cfg.ds_stages))
        pipe = self.ring_pipeline(storage)
        # Where a block's L and D start in their ring stage (``stats_box``).
        stats_shift = 0
        if cutlass.const_expr(self.stats_box != B_r):
            stats_shift = q_start % STATS_ROW_MULTIPLE
        # K_j's first row, read again where it is used: held from K_j's load to the epilogue,
        # a packed batch's offset spilled (hd64 B_r = 128, step 18).
        def k_start_at(counter):
            if cutlass.const_expr(self.varlen):
                return mCuK[per_iteration(seq, counter)]
            return k_start

        walk = (head_kv * group, group, m_min, m_max, m_max - m_min, batch, q_start, key0,
                seqlen_q, seqlen_k, window_left, window_right, softmax_scale, mQ, mdQacc, mSem,
                ring, sdS, copies, mmas, (pipe, loads), n_block, (seq, num_seqs), stats_shift)
        if cutlass.const_expr(cfg.producer_warp):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp < 4:
                cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS[MMA_WARPGROUPS])
                if warp == 0:
                    self.produce(loads, pipe, ring, walk)
            else:
                cute.arch.warpgroup_reg_alloc(CONSUMER_REGS[MMA_WARPGROUPS])
                self._consume(tidx - 128, mK, mV, mdK, mdV, k_start_at, head_kv, tiles,
                              storage, walk)
        else:
            self._consume(tidx, mK, mV, mdK, mdV, k_start_at, head_kv, tiles, storage, walk)

    @cute.jit
    def _consume(self, tidx, mK: cute.Tensor, mV: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, k_start_at, head_kv, tiles: tuple, storage, walk: tuple):
        """The MMA warps (``tidx``: their thread index): K_j and V_j, the walk over query
        blocks, then dK_j and dV_j (``k_start_at(counter)``: K_j's sequence's first row,
        read afresh at each call)."""
        cfg, D = self.cfg, self.head_dim
        B_r, B_c = cfg.block_m, cfg.block_n
        (first_head, group, m_min, m_max, per_head, batch, q_start, key0, seqlen_q, seqlen_k,
         window_left, window_right, softmax_scale, _, _, _, ring, _, copies, mmas, _,
         n_block, _, _) = walk
        gmem_load, gmem_store, stats_load = copies
        sK, sV = tiles[2], tiles[3]
        left_end, right_start = masked_query_bounds(
            key0, seqlen_q, seqlen_k, window_left, window_right, m_min, m_max, B_c, B_r,
            self.windowed)
        bounds = phase_bounds(m_min, left_end, right_start, m_max, self.windowed)

        # ---- K_j and V_j, once ------------------------------------------------------------
        thr_load = gmem_load.get_slice(tidx)
        keys_left = seqlen_k - key0
        kv_coord = thr_load.partition_S(cute.make_identity_tensor((B_c, D)))
        for tensor, smem in ((mK, sK), (mV, sV)):
            tile = cute.local_tile(sequence_rows(tensor, batch, k_start_at(0), head_kv),
                                   (B_c, D), (n_block, 0))
            load_rows(gmem_load, thr_load.partition_S(tile), thr_load.partition_D(smem),
                      kv_coord, keys_left, B_c)

        ops = self.operands(tidx, mmas, tiles, storage)
        mma_s, mma_dkv, mma_dq = mmas[0], mmas[-2], mmas[-1]
        acc_dK = cute.make_rmem_tensor(mma_dkv.get_slice(tidx).partition_shape_C((B_c, D)),
                                       cutlass.Float32)
        acc_dV = cute.make_fragment_like(acc_dK)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        # (key, query) of each S^T element, and (query, d) of each dQ element, in the tile.
        tScS_mn = self._score_coords(mma_s, tidx)
        tdQcdQ = mma_dq.get_slice(tidx).partition_C(cute.make_identity_tensor((B_r, D)))

        # ---- the walk: every query head of the group, its query blocks in mask phases -----
        if cutlass.const_expr(cfg.producer_warp):
            # K_j and V_j landed for every MMA warp (the ring needs no CTA barrier).
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            self.smem_to_mma()
        else:
            if per_head > 0:
                self._load_q_block(ring, gmem_load, thr_load, stats_load, batch, q_start,
                                   first_head, m_min, 0, seqlen_q, tidx)
            cute.arch.cp_async_commit_group()
        block = (*walk, thr_load, ops, acc_dK, acc_dV, tScS_mn, tdQcdQ, tidx)
        for member in cutlass.range(group, unroll=1):
            for p in cutlass.range_constexpr(len(bounds)):
                lo, hi = bounds[p]
                # Literal flags: a Python value carried into a dynamic loop would turn dynamic.
                if cutlass.const_expr(phase_masked(self.windowed, p)):
                    for i in cutlass.range(hi - lo, unroll=1):
                        self._query_block(member, lo + i, *block, masked=True)
                else:
                    for i in cutlass.range(hi - lo, unroll=1):
                        self._query_block(member, lo + i, *block, masked=False)

        # ---- epilogue: dK (scaled) and dV through K's and V's shared memory ---------------
        cute.arch.cp_async_wait_group(0)
        self.consumers_sync()
        # The staging addresses computed here, not held across the walk (hd64: 1 spill).
        tidx = per_iteration(tidx, n_block)
        acc_dK.store(acc_dK.load() * softmax_scale)
        stage_o(acc_dK, sK, mma_dkv, tidx, self.dtype)
        stage_o(acc_dV, sV, mma_dkv, tidx, self.dtype)
        k_start = k_start_at(n_block)
        gdK, gdV = (cute.local_tile(sequence_rows(grad, batch, k_start, head_kv), (B_c, D),
                                    (n_block, 0)) for grad in (mdK, mdV))
        store_rows(gmem_store, sK, gdK, tidx, keys_left, self.consumers_sync)
        # The barrier above made both staged tiles visible.
        store_rows(gmem_store, sV, gdV, tidx, keys_left, lambda: None)

    def _score_coords(self, mma_s: cute.TiledMma, tidx) -> cute.Tensor:
        """(key, query) of each of thread ``tidx``'s S^T elements in the tile, by (row, col)."""
        return acc_mn_view(mma_s.get_slice(tidx).partition_C(
            cute.make_identity_tensor((self.cfg.block_n, self.cfg.block_m))))

    @cute.jit
    def _load_q_block(self, ring, gmem_load: cute.TiledCopy, thr_load,
                      stats_load: cute.TiledCopy, batch, q_start, head, m_block, stage,
                      seqlen_q, tidx):
        """Start copying Q_i, dO_i, L_i and D_i of ``head`` into ``stage`` (zero rows of Q
        and dO past Sq; L and D are padded)."""
        B_r = self.cfg.block_m
        (mQ, mdO, mLSE, mdPsum), (sQ, sdO, sLSE, sdPsum) = ring
        coord = thr_load.partition_S(cute.make_identity_tensor((B_r, self.head_dim)))
        for tensor, smem in ((mQ, sQ), (mdO, sdO)):
            tile = cute.local_tile(sequence_rows(tensor, batch, q_start, head),
                                   (B_r, self.head_dim), (m_block, 0))
            load_rows(gmem_load, thr_load.partition_S(tile),
                      thr_load.partition_D(smem[None, None, stage]), coord,
                      seqlen_q - m_block * B_r, B_r)
        if tidx < B_r:
            thr_stats = stats_load.get_slice(tidx)
            for tensor, smem in ((mLSE, sLSE), (mdPsum, sdPsum)):
                rows = cute.domain_offset((q_start,), tensor[batch, head, None])
                cute.copy(stats_load,
                          thr_stats.partition_S(cute.local_tile(rows, (B_r,), (m_block,))),
                          thr_stats.partition_D(smem[None, stage]))

    def dq_tile(self, mdQacc: cute.Tensor, loads, batch, q_start, head, m_block):
        """What ``add_dq`` adds query block ``m_block`` of ``head`` into: its tile of
        ``dq_accum`` (``loads``: ``tma_atoms``'s, for a kernel that adds by TMA)."""
        return cute.local_tile(sequence_rows(mdQacc, batch, q_start, head),
                               (self.cfg.block_m, self.head_dim), (m_block, 0))

    @cute.jit
    def add_dq(self, ops: tuple, acc_dQ: cute.Tensor, gdQ: cute.Tensor, tdQcdQ: cute.Tensor,
               rows_left, tidx):
        """dq_accum's tile ``gdQ`` += this thread's part of dS K_j: ``red.global.add.f32``
        per element, or per pair of neighbouring columns on sm_90 (``.v2``: a warp's
        instruction then fills whole 32-byte sectors, half the reduce instructions and L2
        operations; rows at or past ``rows_left`` left alone, every row when it is None: a
        query block inside the sequence, whose adds then need no branch and can go out
        between the next GEMM's MMAs)."""
        tdQgdQ = self.tiled_mmas_of(ops)[-1].get_slice(tidx).partition_C(gdQ)
        # An MMA accumulator's values come in pairs of neighbouring columns.
        step = 2 if self.paired_reduce else 1
        for i in cutlass.range_constexpr(0, cute.size(acc_dQ), step):
            if cutlass.const_expr(rows_left is None):
                self._reduce_add(acc_dQ, tdQgdQ, i, step)
            elif tdQcdQ[i][0] < rows_left:
                self._reduce_add(acc_dQ, tdQgdQ, i, step)

    @cute.jit
    def _reduce_add(self, acc_dQ: cute.Tensor, tdQgdQ: cute.Tensor, i: cutlass.Constexpr,
                    step: cutlass.Constexpr):
        """``red.global.add.f32`` of value ``i`` of dQ (and with ``step`` 2 its neighbour)."""
        value = acc_dQ[i]
        if cutlass.const_expr(step == 2):
            pair = cute.make_rmem_tensor((2,), cutlass.Float32)
            pair[0], pair[1] = acc_dQ[i], acc_dQ[i + 1]
            value = pair.load().ir_value()
        cute.arch.red(tdQgdQ.iterator + cute.crd2idx(i, tdQgdQ.layout), value, op="add",
                      dtype="f32", sem="relaxed", scope="gpu")

    def gemm_dkv_dq(self, ops: tuple, stage, ds_stage, rP: cute.Tensor, rdS: cute.Tensor,
                    acc_dK: cute.Tensor, acc_dV: cute.Tensor, store_ds, finish_dq) -> None:
        """dV_j += P^T dO_i and dK_j += dS^T Q_i, dS^T into its shared tile ``ds_stage``
        (``store_ds``), and dQ_i = dS K_j, handed to ``finish_dq`` (which adds it to
        dq_accum) once it has landed; dK and dV may still be in flight until
        ``block_done``."""
        raise NotImplementedError

    def block_done(self) -> None:
        """Wait for what ``gemm_dkv_dq`` left in flight (the ring's stage is then free)."""

    def dq_added(self, tidx):
        """Wait until this thread's dQ adds have been performed (``deterministic``)."""

    def smem_to_mma(self):
        """A CTA barrier after which every thread's shared-memory writes (``cp.async``
        copies that have landed, dS^T's stores) are visible to the MMAs."""
        cute.arch.sync_threads()

    @cute.jit
    def _query_block(self, g, m_block, first_head, group, m_min, m_max, per_head, batch,
                     q_start, key0, seqlen_q, seqlen_k, window_left, window_right,
                     softmax_scale, mQ, mdQacc, mSem, ring, sdS, copies, mmas, tma, n_block,
                     seqs, stats_shift, thr_load, ops, acc_dK, acc_dV, tScS_mn, tdQcdQ, tidx,
                     masked: cutlass.Constexpr):
        """Query block ``m_block`` of query head ``first_head + g``: the five GEMMs."""
        cfg = self.cfg
        B_r = cfg.block_m
        head = first_head + g
        query0 = m_block * B_r
        it = g * per_head + m_block - m_min
        stage = it % cfg.q_stages
        pipe, loads = tma
        state = None
        if cutlass.const_expr(cfg.producer_warp):
            state = pipeline.PipelineState(cfg.q_stages, it, stage, (it // cfg.q_stages) % 2)
            pipe.consumer_wait(state)
        elif cutlass.const_expr(cfg.q_stages > 1):
            # The ring: this block was issued an iteration ago. After this barrier every
            # thread is done with the previous block (and dS^T), so its stage takes the next.
            cute.arch.cp_async_wait_group(0)
            self.smem_to_mma()
            next_m, next_g = m_block + 1, g
            if next_m >= m_max:
                next_m, next_g = m_min, g + 1
            if next_g < group:
                self._load_q_block(ring, copies[0], thr_load, copies[2], batch, q_start,
                                   first_head + next_g, next_m, 1 - stage, seqlen_q, tidx)
            cute.arch.cp_async_commit_group()
        else:
            if it > 0:
                cute.arch.sync_threads()
                self._load_q_block(ring, copies[0], thr_load, copies[2], batch, q_start,
                                   head, m_block, 0, seqlen_q, tidx)
                cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            self.smem_to_mma()

        ncols = cute.size(tScS_mn, mode=[1])
        sLSE, sdPsum = ring[1][2], ring[1][3]
        # S^T = K_j Q_i^T, then P^T from the saved log-sum-exp (per column: a query row).
        scale_log2 = softmax_scale * LOG2_E
        lse = cute.make_rmem_tensor((ncols,), cutlass.Float32)
        dpsum = cute.make_rmem_tensor((ncols,), cutlass.Float32)
        # The L and D rows of this thread's columns. In the deterministic turn the first is
        # recomputed from the thread index in each block (held, it spilled at hd64; where
        # nothing spills, holding it measured 2-4 % faster at hd128), the others at
        # constant offsets from it.
        cols = tScS_mn
        if cutlass.const_expr(self.deterministic):
            cols = self._score_coords(mmas[0], per_iteration(tidx, m_block))
        stats_rows = [cols[0, 0][1] + stats_shift + (tScS_mn[0, c][1] - tScS_mn[0, 0][1])
                      for c in range(ncols)]

        def probabilities(acc_S: cute.Tensor) -> None:
            # P^T (in place), while dP^T = V_j dO_i^T may still be on the tensor cores. L is
            # read here, once S^T has landed: read while the GEMMs run, it costs registers
            # (spills) and measured 6 % slower at hd128 seq 8k.
            for c in cutlass.range_constexpr(ncols):
                lse[c] = sLSE[stats_rows[c], stage]
            if cutlass.const_expr(masked):
                apply_mask_transposed(acc_S, tScS_mn, key0, query0, seqlen_q, seqlen_k,
                                      window_left, window_right, self.windowed,
                                      paired_columns=cfg.wgmma)
            s_mn = acc_mn_view(acc_S)
            for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                for c in cutlass.range_constexpr(ncols):
                    s_mn[r, c] = cute.math.exp2(s_mn[r, c] * scale_log2 - lse[c],
                                                fastmath=True)
            for c in cutlass.range_constexpr(ncols):
                dpsum[c] = sdPsum[stats_rows[c], stage]

        acc_S, acc_dP = self.gemm_s_dp(ops, stage, probabilities)
        # dS^T = P^T (dP^T - D_i), each value converted as it is made, so that the fp32
        # registers free one by one (the last spilled values, step 18). P^T so too, except
        # where a wgmma reads it from registers: ptxas then serializes that wgmma (20 -> 128
        # warpgroup syncs, -16 % at hd64).
        s_mn = acc_mn_view(acc_S)
        dp_mn = acc_mn_view(acc_dP)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rdS = cute.make_fragment_like(acc_dP, self.dtype)
        rp_mn = acc_mn_view(rP)
        rds_mn = acc_mn_view(rdS)
        for r in cutlass.range_constexpr(cute.size(dp_mn, mode=[0])):
            for c in cutlass.range_constexpr(ncols):
                rds_mn[r, c] = (s_mn[r, c] * (dp_mn[r, c] - dpsum[c])).to(self.dtype)
                if cutlass.const_expr(not cfg.wgmma):
                    rp_mn[r, c] = s_mn[r, c].to(self.dtype)
        if cutlass.const_expr(cfg.wgmma):
            rP.store(acc_S.load().to(self.dtype))

        # dV_j += P^T dO_i and dK_j += dS^T Q_i, A from the accumulators' registers; dS^T
        # to shared memory for dQ_i += dS K_j.
        ds_stage = it % cfg.ds_stages
        if cutlass.const_expr(cfg.wgmma):
            # dS^T's and dQ's store addresses recomputed in each block, not held (spilled)
            # across it: hd64 25 -> 1 spilled values, +6 to +11 % (step 14).
            tidx = per_iteration(tidx, m_block)
        turns = []  # the deterministic turn's counter, released below

        def finish_dq(acc_dQ: cute.Tensor) -> None:
            # dQ_i added to dq_accum (in block order when deterministic).
            acc_dQ.store(acc_dQ.load() * softmax_scale)
            gdQ = self.dq_tile(mdQacc, loads, batch, q_start, head, m_block)
            if cutlass.const_expr(self.deterministic):
                turns.append(self._await_turn(mSem, seqs, mQ.shape[2], head, m_block,
                                              query0, seqlen_q, seqlen_k, window_left,
                                              window_right, n_block, tidx))
            # Only the masked phases hold query blocks that run past the sequence; with
            # dq_first, unchecked adds can go out between dK's MMAs (in the other order,
            # the checks' branches keep ptxas from hoisting their addresses: no spills).
            rows_left = None if cfg.dq_first and not masked else seqlen_q - query0
            self.add_dq(ops, acc_dQ, gdQ, tdQcdQ, rows_left, tidx)

        self.gemm_dkv_dq(ops, stage, ds_stage, rP, rdS, acc_dK, acc_dV,
                         lambda: store_fragment(rdS, sdS[None, None, ds_stage], mmas[0], tidx,
                                                matrices=cfg.wgmma), finish_dq)
        self.block_done()
        if cutlass.const_expr(cfg.producer_warp):
            pipe.consumer_release(state)
        if cutlass.const_expr(self.deterministic):
            # Every thread's adds are done (and visible GPU-wide) before the next block's turn.
            self.dq_added(tidx)
            cute.arch.fence_acq_rel_gpu()
            self.consumers_sync()
            if tidx == 0:
                cute.arch.store(turns[0], cutlass.Int32(n_block + 1), sem="release",
                                scope="gpu")

    @cute.jit
    def _await_turn(self, mSem: cute.Tensor, seqs: tuple, num_heads, head, m_block, query0,
                    seqlen_q, seqlen_k, window_left, window_right, n_block, tidx):
        """Wait until the K/V blocks before ``n_block`` that see query block ``m_block``
        have added their dQ parts (``deterministic``; ``seqs``: this CTA's sequence and the
        launch's count). The counter of (sequence, head, query block) holds one past the
        last K/V block that added; blocks add in launch order, the first that sees the query
        block finding it at its own index. Returns the counter."""
        cfg = self.cfg
        seq, num_seqs = seqs
        blocks_per_head = mSem.shape[0] // (num_seqs * num_heads)
        first, _ = kv_block_range(query0, seqlen_q, seqlen_k, window_left, window_right,
                                  cfg.block_m, cfg.block_n, self.windowed)
        counter = mSem.iterator + ((seq * num_heads + head) * blocks_per_head + m_block)
        if tidx == 0:
            seen = cute.arch.load(counter, cutlass.Int32, sem="acquire", scope="gpu")
            # The first block that sees this query block starts it (the counter is zeroed).
            seen = cutlass.max(seen, first)
            while seen != n_block:
                seen = cutlass.max(cute.arch.load(counter, cutlass.Int32, sem="acquire",
                                                  scope="gpu"), first)
        self.consumers_sync()
        return counter
