"""FlashAttention-2 backward for sm80+ (``mma.sync``), one kernel configured by
``BackwardConfig``.

The idea (FlashAttention-2's backward, in the transposed frame): a CTA owns ``block_n`` key
rows (B_c) of one sequence and K/V head, keeps K_j and V_j in shared memory and dK_j, dV_j in
registers, and walks the query blocks i (B_r rows) that see them, for every query head of the
K/V head's group (GQA sums the group's gradients in registers, no extra pass). Per block:

* S^T = K_j Q_i^T and P^T = exp2(S^T * scale * log2 e - L_i * log2 e): P is recomputed from
  the forward's log-sum-exp, with no running max or rescale;
* dP^T = V_j dO_i^T and dS^T = P^T * (dP^T - D_i), D_i = rowsum(dO_i * O_i) (preprocess);
* dV_j += P^T dO_i and dK_j += dS^T Q_i with P^T and dS^T straight from the accumulator
  registers (the forward's P V trick, ``acc_as_operand_a``);
* dS^T goes to shared memory once, and dQ_i += dS K_j is added to an fp32 ``dq_accum`` with
  ``red.global.add.f32``. ``deterministic`` makes the K/V blocks add in block order: each CTA
  waits on a per-(sequence, head, query block) counter for the blocks before it.

Four of the five GEMMs are the forward's two shapes (``docs/backward.md``): S^T and dP^T are
S = Q K^T with both operands K-major; dV and dK are O += P V with B read by
``ldmatrix.trans``; dQ reads dS^T by ``ldmatrix.trans`` as its A operand. The warps split
B_c for the first four (16 key rows each) and (B_r, D) for dQ (``dq_warps``).

Q_i and dO_i are a ring of ``q_stages`` (the next block loads while this one computes). The
mask is the forward's read the other way round (``mask.query_block_range``,
``masked_query_bounds``): blocks wholly inside the band run a body with no mask code. Rows
past the sequences are zero-filled; the preprocess pads L and D to whole query blocks.
"""

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from attnlab.kernels.abi import BackwardArgs, BackwardSpec
from attnlab.kernels.common.base import shared_storage, shared_tile
from attnlab.kernels.common.epilogue import stage_o, store_fragment, store_rows
from attnlab.kernels.common.layouts import (
    COPY_BITS,
    acc_as_operand_a,
    acc_mn_view,
    row_copy,
    smem_tile_layout,
)
from attnlab.kernels.common.mask import (
    apply_mask_transposed,
    kv_block_range,
    masked_query_bounds,
    phase_bounds,
    phase_masked,
    query_block_range,
)
from attnlab.kernels.common.tensors import (
    element_type,
    load_rows,
    problem_tensors,
    sequence_rows,
)
from attnlab.kernels.sm80.ldmatrix_gemm import gemm

LOG2_E = math.log2(math.e)
#: ldmatrix fragments per shared->register load in every GEMM (one MMA_K step), double
#: buffered: the forward's measured default schedule.
FRAGS = 2


def transposed(tile: cute.Tensor, rows: int, cols: int, stages: int = 1) -> cute.Tensor:
    """The (cols, rows[, stages]) view of a (rows, cols[, stages]) shared-memory tile."""
    if stages == 1:
        return cute.composition(tile, cute.make_layout((cols, rows), stride=(rows, 1)))
    return cute.composition(tile, cute.make_layout((cols, rows, stages),
                                                   stride=(rows, 1, rows * cols)))


class FlashBackwardSm80:
    """Compile-time description of one ``mma.sync`` backward kernel (a ``BackwardSpec``).

    Called (through ``cute.compile``) with the ``kernels.abi.BackwardArgs`` and a stream.
    """

    def __init__(self, spec: BackwardSpec):
        spec.config.check_problem(spec.head_dim, arch=None)
        self.cfg = spec.config
        self.head_dim = spec.head_dim
        self.dtype = element_type(spec.dtype)
        self.windowed = spec.windowed
        self.varlen = spec.varlen
        self.deterministic = spec.deterministic

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
        """Shared-memory layouts, copies and the two tiled MMAs, then the launch: one CTA
        per (K/V block, K/V head, sequence), K/V block 0 first (under a causal mask it sees
        the most queries)."""
        cfg, D = self.cfg, self.head_dim
        layouts = (smem_tile_layout("xor", cfg.block_m, D, cfg.q_stages),
                   smem_tile_layout("xor", cfg.block_n, D),
                   smem_tile_layout("xor", cfg.block_n, cfg.block_m))
        q_layout, kv_layout, ds_layout = layouts
        SharedStorage = shared_storage({
            "sQ": shared_tile(self.dtype, q_layout), "sdO": shared_tile(self.dtype, q_layout),
            "sK": shared_tile(self.dtype, kv_layout), "sV": shared_tile(self.dtype, kv_layout),
            "sdS": shared_tile(self.dtype, ds_layout)})
        load_atom = cute.make_copy_atom(cpasync.CopyG2SOp(
            cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=COPY_BITS)
        store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                         num_bits_per_copy=COPY_BITS)
        copies = (row_copy(load_atom, cfg.num_threads, D),
                  row_copy(store_atom, cfg.num_threads, D))
        op = warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16))
        wm, wn = cfg.dq_warps
        mmas = (cute.make_tiled_mma(op, (cfg.num_warps, 1, 1),
                                    permutation_mnk=(cfg.num_warps * 16, 16, 16)),
                cute.make_tiled_mma(op, (wm, wn, 1), permutation_mnk=(wm * 16, wn * 16, 16)))
        grid = (cute.ceil_div(t.max_seqlen_k, cfg.block_n), t.k.shape[2], num_seqs)
        self.kernel(t.q, t.k, t.v, t.dout, t.lse_log2, t.dpsum, t.dq_accum, t.dk, t.dv,
                    t.cu_seqlens_q, t.cu_seqlens_k, t.softmax_scale, t.window_left,
                    t.window_right, t.semaphores, layouts, copies, mmas, SharedStorage,
                    ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream)

    # ----------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
               mLSE: cute.Tensor, mdPsum: cute.Tensor, mdQacc: cute.Tensor, mdK: cute.Tensor,
               mdV: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               softmax_scale: cutlass.Float32, window_left: cutlass.Int32,
               window_right: cutlass.Int32, mSem: cute.Tensor, layouts, copies, mmas,
               SharedStorage: cutlass.Constexpr):
        cfg, D = self.cfg, self.head_dim
        B_r, B_c = cfg.block_m, cfg.block_n
        q_layout, kv_layout, ds_layout = layouts
        gmem_load, gmem_store = copies
        mma_kv, mma_dq = mmas
        tidx, _, _ = cute.arch.thread_idx()
        n_block, head_kv, seq = cute.arch.block_idx()
        group = mQ.shape[2] // mK.shape[2]

        # ---- this CTA's sequence and its walk over query blocks ---------------------------
        batch, q_start, k_start = seq, 0, 0
        seqlen_q, seqlen_k = mQ.shape[1], mK.shape[1]
        if cutlass.const_expr(self.varlen):
            batch = 0
            q_start, k_start = mCuQ[seq], mCuK[seq]
            seqlen_q, seqlen_k = mCuQ[seq + 1] - q_start, mCuK[seq + 1] - k_start
        key0 = n_block * B_c
        m_min, m_max = query_block_range(key0, seqlen_q, seqlen_k, window_left, window_right,
                                         B_c, B_r, self.windowed)
        if cutlass.const_expr(self.varlen):
            # Past the end of a short sequence (the grid is sized for the longest): no work.
            m_max = m_min if key0 >= seqlen_k else m_max
        left_end, right_start = masked_query_bounds(
            key0, seqlen_q, seqlen_k, window_left, window_right, m_min, m_max, B_c, B_r,
            self.windowed)
        bounds = phase_bounds(m_min, left_end, right_start, m_max, self.windowed)

        # ---- shared memory ----------------------------------------------------------------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(q_layout)
        sdO = storage.sdO.get_tensor(q_layout)
        sK = storage.sK.get_tensor(kv_layout)[None, None, 0]
        sV = storage.sV.get_tensor(kv_layout)[None, None, 0]
        sdS = storage.sdS.get_tensor(ds_layout)[None, None, 0]
        stages = cfg.q_stages
        sQt, sdOt = (transposed(s, B_r, D, stages) for s in (sQ, sdO))
        sKt = transposed(sK, B_c, D)
        sdSt = transposed(sdS, B_c, B_r)  # dS: (query, key)

        # ---- K_j and V_j, once ------------------------------------------------------------
        thr_load = gmem_load.get_slice(tidx)
        keys_left = seqlen_k - key0
        kv_coord = thr_load.partition_S(cute.make_identity_tensor((B_c, D)))
        for tensor, smem in ((mK, sK), (mV, sV)):
            tile = cute.local_tile(sequence_rows(tensor, batch, k_start, head_kv), (B_c, D),
                                   (n_block, 0))
            load_rows(gmem_load, thr_load.partition_S(tile), thr_load.partition_D(smem),
                      kv_coord, keys_left, B_c)

        # ---- MMA fragments and shared->register copies ------------------------------------
        thr_kv = mma_kv.get_slice(tidx)
        thr_dq = mma_dq.get_slice(tidx)
        frags = (thr_kv.make_fragment_A(thr_kv.partition_A(sK)),
                 thr_kv.make_fragment_B(thr_kv.partition_B(sQ[None, None, 0])),
                 thr_kv.make_fragment_A(thr_kv.partition_A(sV)),
                 thr_kv.make_fragment_B(thr_kv.partition_B(sdO[None, None, 0])),
                 thr_kv.make_fragment_B(thr_kv.partition_B(sdOt[None, None, 0])),
                 thr_kv.make_fragment_B(thr_kv.partition_B(sQt[None, None, 0])),
                 thr_dq.make_fragment_A(thr_dq.partition_A(sdSt)),
                 thr_dq.make_fragment_B(thr_dq.partition_B(sKt)))
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                   self.dtype)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4),
                                     self.dtype)
        # (tiled copy, shared source, register view) per operand, in ``frags``' order; the
        # Q and dO sources keep their stage mode.
        sources = (sK, sQ, sV, sdO, sdOt, sQt, sdSt, sKt)
        tiled = (cute.make_tiled_copy_A(ldsm, mma_kv), cute.make_tiled_copy_B(ldsm, mma_kv),
                 cute.make_tiled_copy_A(ldsm, mma_kv), cute.make_tiled_copy_B(ldsm, mma_kv),
                 cute.make_tiled_copy_B(ldsm_t, mma_kv), cute.make_tiled_copy_B(ldsm_t, mma_kv),
                 cute.make_tiled_copy_A(ldsm_t, mma_dq), cute.make_tiled_copy_B(ldsm_t, mma_dq))
        loads = []
        for copy, src, frag in zip(tiled, sources, frags, strict=True):
            thr = copy.get_slice(tidx)
            loads.append((copy, thr.partition_S(src), thr.retile(frag)))

        acc_dK = cute.make_rmem_tensor(thr_kv.partition_shape_C((B_c, D)), cutlass.Float32)
        acc_dV = cute.make_rmem_tensor(thr_kv.partition_shape_C((B_c, D)), cutlass.Float32)
        acc_dK.fill(0.0)
        acc_dV.fill(0.0)
        # (key, query) of each S^T element, and (query, d) of each dQ element, in the tile.
        tScS_mn = acc_mn_view(thr_kv.partition_C(cute.make_identity_tensor((B_c, B_r))))
        tdQcdQ = thr_dq.partition_C(cute.make_identity_tensor((B_r, D)))

        # ---- the walk: every query head of the group, its query blocks in mask phases -----
        first_head = head_kv * group
        per_head = m_max - m_min
        if per_head > 0:
            self._load_q_block(mQ, mdO, sQ, sdO, gmem_load, thr_load, batch, q_start,
                               first_head, m_min, 0, seqlen_q)
        cute.arch.cp_async_commit_group()
        walk = (first_head, group, m_min, m_max, per_head, batch, q_start, key0, seqlen_q,
                seqlen_k, window_left, window_right, softmax_scale, mQ, mdO, mLSE, mdPsum,
                mdQacc, mSem, sQ, sdO, sdS, gmem_load, thr_load, mma_kv, mma_dq, thr_kv,
                thr_dq, frags, loads, acc_dK, acc_dV, tScS_mn, tdQcdQ, n_block, tidx)
        for member in cutlass.range(group, unroll=1):
            for p in cutlass.range_constexpr(len(bounds)):
                lo, hi = bounds[p]
                # Literal flags: a Python value carried into a dynamic loop would turn dynamic.
                if cutlass.const_expr(phase_masked(self.windowed, p)):
                    for i in cutlass.range(hi - lo, unroll=1):
                        self._query_block(member, lo + i, *walk, masked=True)
                else:
                    for i in cutlass.range(hi - lo, unroll=1):
                        self._query_block(member, lo + i, *walk, masked=False)

        # ---- epilogue: dK (scaled) and dV through K's and V's shared memory ---------------
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        acc_dK.store(acc_dK.load() * softmax_scale)
        stage_o(acc_dK, sK, mma_kv, tidx, self.dtype)
        stage_o(acc_dV, sV, mma_kv, tidx, self.dtype)
        gdK, gdV = (cute.local_tile(sequence_rows(grad, batch, k_start, head_kv), (B_c, D),
                                    (n_block, 0)) for grad in (mdK, mdV))
        store_rows(gmem_store, sK, gdK, tidx, keys_left, cute.arch.sync_threads)
        # The barrier above made both staged tiles visible.
        store_rows(gmem_store, sV, gdV, tidx, keys_left, lambda: None)

    # ----------------------------------------------------------------------------------------
    @cute.jit
    def _load_q_block(self, mQ: cute.Tensor, mdO: cute.Tensor, sQ: cute.Tensor,
                      sdO: cute.Tensor, gmem_load: cute.TiledCopy, thr_load, batch, q_start,
                      head, m_block, stage, seqlen_q):
        """Start copying Q_i and dO_i of ``head`` into ``stage`` (zero rows past Sq)."""
        B_r = self.cfg.block_m
        coord = thr_load.partition_S(cute.make_identity_tensor((B_r, self.head_dim)))
        for tensor, smem in ((mQ, sQ), (mdO, sdO)):
            tile = cute.local_tile(sequence_rows(tensor, batch, q_start, head),
                                   (B_r, self.head_dim), (m_block, 0))
            load_rows(gmem_load, thr_load.partition_S(tile),
                      thr_load.partition_D(smem[None, None, stage]), coord,
                      seqlen_q - m_block * B_r, B_r)

    @cute.jit
    def _query_block(self, g, m_block, first_head, group, m_min, m_max, per_head, batch,
                     q_start, key0, seqlen_q, seqlen_k, window_left, window_right,
                     softmax_scale, mQ, mdO, mLSE, mdPsum, mdQacc, mSem, sQ, sdO, sdS,
                     gmem_load, thr_load, mma_kv, mma_dq, thr_kv, thr_dq, frags, loads,
                     acc_dK, acc_dV, tScS_mn, tdQcdQ, n_block, tidx,
                     masked: cutlass.Constexpr):
        """Query block ``m_block`` of query head ``first_head + g``: the five GEMMs."""
        cfg = self.cfg
        B_r, B_c = cfg.block_m, cfg.block_n
        head = first_head + g
        query0 = m_block * B_r
        it = g * per_head + m_block - m_min
        stage = it % cfg.q_stages
        if cutlass.const_expr(cfg.q_stages > 1):
            # The ring: this block was issued an iteration ago. After this barrier every
            # thread is done with the previous block (and dS^T), so its stage takes the next.
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            next_m, next_g = m_block + 1, g
            if next_m >= m_max:
                next_m, next_g = m_min, g + 1
            if next_g < group:
                self._load_q_block(mQ, mdO, sQ, sdO, gmem_load, thr_load, batch, q_start,
                                   first_head + next_g, next_m, 1 - stage, seqlen_q)
            cute.arch.cp_async_commit_group()
        else:
            if it > 0:
                cute.arch.sync_threads()
                self._load_q_block(mQ, mdO, sQ, sdO, gmem_load, thr_load, batch, q_start,
                                   head, m_block, 0, seqlen_q)
                cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()

        tK, tQ, tV, tdO, tdOt, tQt, tdS, tKt = frags
        lK, lQ, lV, ldO, ldOt, lQt, ldS, lKt = loads

        def staged(load):
            return (load[0], load[1][None, None, None, stage], load[2])

        ncols = cute.size(tScS_mn, mode=[1])
        rows0 = q_start + query0
        # S^T = K_j Q_i^T, then P^T from the saved log-sum-exp (per column: a query row).
        lse = cute.make_rmem_tensor((ncols,), cutlass.Float32)
        for c in cutlass.range_constexpr(ncols):
            lse[c] = mLSE[batch, head, rows0 + tScS_mn[0, c][1]]
        acc_S = cute.make_rmem_tensor(thr_kv.partition_shape_C((B_c, B_r)), cutlass.Float32)
        acc_S.fill(0.0)
        gemm(mma_kv, acc_S, tK, tQ, lK, staged(lQ), FRAGS, FRAGS, True)
        if cutlass.const_expr(masked):
            apply_mask_transposed(acc_S, tScS_mn, key0, query0, seqlen_q, seqlen_k,
                                  window_left, window_right, self.windowed)
        scale_log2 = softmax_scale * LOG2_E
        s_mn = acc_mn_view(acc_S)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for c in cutlass.range_constexpr(ncols):
                s_mn[r, c] = cute.math.exp2(s_mn[r, c] * scale_log2 - lse[c], fastmath=True)

        # dP^T = V_j dO_i^T, then dS^T = P^T (dP^T - D_i).
        dpsum = cute.make_rmem_tensor((ncols,), cutlass.Float32)
        for c in cutlass.range_constexpr(ncols):
            dpsum[c] = mdPsum[batch, head, rows0 + tScS_mn[0, c][1]]
        acc_dP = cute.make_rmem_tensor(thr_kv.partition_shape_C((B_c, B_r)), cutlass.Float32)
        acc_dP.fill(0.0)
        gemm(mma_kv, acc_dP, tV, tdO, lV, staged(ldO), FRAGS, FRAGS, True)
        dp_mn = acc_mn_view(acc_dP)
        for r in cutlass.range_constexpr(cute.size(dp_mn, mode=[0])):
            for c in cutlass.range_constexpr(ncols):
                dp_mn[r, c] = s_mn[r, c] * (dp_mn[r, c] - dpsum[c])

        # dV_j += P^T dO_i and dK_j += dS^T Q_i, A from the accumulators' registers; dS^T
        # to shared memory for dQ.
        rP = cute.make_fragment_like(acc_S, self.dtype)
        rP.store(acc_S.load().to(self.dtype))
        gemm(mma_kv, acc_dV, acc_as_operand_a(rP), tdOt, None, staged(ldOt), 0, FRAGS, True)
        rdS = cute.make_fragment_like(acc_dP, self.dtype)
        rdS.store(acc_dP.load().to(self.dtype))
        store_fragment(rdS, sdS, mma_kv, tidx)
        gemm(mma_kv, acc_dK, acc_as_operand_a(rdS), tQt, None, staged(lQt), 0, FRAGS, True)
        cute.arch.sync_threads()

        # dQ_i += dS K_j, added to dq_accum (in block order when deterministic).
        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((B_r, self.head_dim)),
                                       cutlass.Float32)
        acc_dQ.fill(0.0)
        gemm(mma_dq, acc_dQ, tdS, tKt, ldS, lKt, FRAGS, FRAGS, True)
        gdQ = cute.local_tile(sequence_rows(mdQacc, batch, q_start, head),
                              (B_r, self.head_dim), (m_block, 0))
        tdQgdQ = thr_dq.partition_C(gdQ)
        rows_left = seqlen_q - query0
        turn = None
        if cutlass.const_expr(self.deterministic):
            turn = self._await_turn(mSem, mQ.shape[2], head, m_block, query0, seqlen_q,
                                    seqlen_k, window_left, window_right, n_block, tidx)
        for i in cutlass.range_constexpr(cute.size(acc_dQ)):
            if tdQcdQ[i][0] < rows_left:
                cute.arch.red(tdQgdQ.iterator + cute.crd2idx(i, tdQgdQ.layout), acc_dQ[i],
                              op="add", dtype="f32", sem="relaxed", scope="gpu")
        if cutlass.const_expr(self.deterministic):
            # Every thread's adds are done (and visible GPU-wide) before the next block's turn.
            cute.arch.fence_acq_rel_gpu()
            cute.arch.sync_threads()
            if tidx == 0:
                cute.arch.store(turn, cutlass.Int32(n_block + 1), sem="release", scope="gpu")

    @cute.jit
    def _await_turn(self, mSem: cute.Tensor, num_heads, head, m_block, query0, seqlen_q,
                    seqlen_k, window_left, window_right, n_block, tidx):
        """Wait until the K/V blocks before ``n_block`` that see query block ``m_block``
        have added their dQ parts (``deterministic``). The counter of (sequence, head, query
        block) holds one past the last K/V block that added; blocks add in launch order, the
        first that sees the query block finding it at its own index. Returns the counter."""
        cfg = self.cfg
        _, _, seq = cute.arch.block_idx()
        blocks_per_head = mSem.shape[0] // (cute.arch.grid_dim()[2] * num_heads)
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
        cute.arch.sync_threads()
        return counter
