"""FlashAttention-2 forward for sm80+ (``mma.sync``), one kernel configured by ``FlashConfig``.

The idea (FlashAttention-2): a CTA owns ``block_m`` query rows (B_r) and streams the keys and
values in tiles of ``block_n`` rows (B_c). For each tile it computes S = Q K^T on the tensor
cores, folds S into an online softmax (running row max and sum, O rescaled when the max moves),
and accumulates O += P V with P taken straight from the S registers. O is normalised once at
the end, so the Sq x Sk score matrix never leaves the chip.

Every knob of the seeds' kernels 1-7 is a compile-time branch of this one kernel:

* ``async_copy``: gmem->smem with ``cp.async.cg`` (LDGSTS, L1 bypass) or LDG + STS.
* ``swizzle``: the shared-memory layout (``kernels/common/layouts.py``).
* ``eager_kv_loads``: K_{j+1} and V_j are in flight while the tensor cores work on the other
  operand; without it each tile is loaded, waited for, then used.
* ``*_frags_per_load`` / ``double_buffer_smem_to_rf``: the schedule of ``ldmatrix`` against the
  MMAs in each GEMM (``_gemm``).
* ``fused_softmax``: see ``kernels/common/softmax.py``.

Tail tiles need no divisibility: Q rows past Sq and K/V rows past Sk are zero-filled in shared
memory (never read from global memory), key columns past Sk are masked to -inf in the last
tile, and O/LSE rows past Sq are not stored.
"""


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from attnlab.config import FRAG_COLS, MMA_K, FlashConfig
from attnlab.kernels.common.layouts import acc_as_operand_a, acc_mn_view, smem_tile_layout
from attnlab.kernels.common.softmax import OnlineSoftmax

#: Bits moved by one thread per gmem<->smem copy instruction (16 bytes = 8 halves).
COPY_BITS = 128
#: Threads that cover one 64-column stretch of a row with 16-byte copies (128 bytes).
THREADS_PER_ROW = 8


class FlashForwardSm80:
    """Compile-time description of one forward kernel: a config, a head dim and a dtype.

    Call (through ``cute.compile``) with pointers to Q, K, V, O (BSHD) and to a contiguous
    ``[B, H, Sq]`` fp32 LSE, the sizes, the (batch, seq, head) strides, the softmax scale and a
    CUDA stream.
    """

    def __init__(self, config: FlashConfig, head_dim: int, dtype: type[cutlass.Numeric]):
        config.check_problem(head_dim)
        self.cfg = config
        self.head_dim = head_dim
        self.dtype = dtype

    # ----------------------------------------------------------------------------------------
    # Host side: layouts, copy atoms, tiled MMA, launch
    # ----------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        batch: cutlass.Int32,
        seqlen_q: cutlass.Int32,
        seqlen_k: cutlass.Int32,
        heads: cutlass.Int32,
        q_strides: tuple,
        k_strides: tuple,
        v_strides: tuple,
        o_strides: tuple,
        softmax_scale: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        """Build BSHD tensors from raw pointers and launch.

        Raw pointers and explicit (batch, seq, head) strides, rather than DLPack tensors, give
        one fixed signature for cross-compilation and launch, and let us state what validation
        guarantees: strides are multiples of 8 elements and the head dim is contiguous.
        """
        mQ, mK, mV, mO = (
            cute.make_tensor(ptr, cute.make_layout(
                (batch, seqlen, heads, self.head_dim),
                stride=(cute.assume(st[0], divby=8), cute.assume(st[1], divby=8),
                        cute.assume(st[2], divby=8), 1)))
            for ptr, seqlen, st in ((q_ptr, seqlen_q, q_strides), (k_ptr, seqlen_k, k_strides),
                                    (v_ptr, seqlen_k, v_strides), (o_ptr, seqlen_q, o_strides))
        )
        mLSE = cute.make_tensor(lse_ptr, cute.make_layout(
            (batch, heads, seqlen_q), stride=(heads * seqlen_q, seqlen_q, 1)))
        cfg = self.cfg
        sQ_layout = smem_tile_layout(cfg.swizzle, cfg.block_m, self.head_dim)
        sKV_layout = smem_tile_layout(cfg.swizzle, cfg.block_n, self.head_dim)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        if cutlass.const_expr(cfg.async_copy):
            load_op = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        else:
            load_op = cute.nvgpu.CopyUniversalOp()
        load_atom = cute.make_copy_atom(load_op, self.dtype, num_bits_per_copy=COPY_BITS)
        store_atom = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=COPY_BITS
        )
        elems_per_copy = COPY_BITS // self.dtype.width
        thr_layout = cute.make_layout(
            (cfg.num_threads // THREADS_PER_ROW, THREADS_PER_ROW), stride=(THREADS_PER_ROW, 1)
        )
        val_layout = cute.make_layout((1, elems_per_copy))
        gmem_load = cute.make_tiled_copy_tv(load_atom, thr_layout, val_layout)
        gmem_store = cute.make_tiled_copy_tv(store_atom, thr_layout, val_layout)

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (cfg.num_warps, 1, 1),
            # N = 16 lets one ldmatrix.x4 feed two n8 MMAs of the B operand.
            permutation_mnk=(cfg.num_warps * 16, 16, 16),
        )
        grid = (cute.ceil_div(mQ.shape[1], cfg.block_m), cute.size(mQ.shape[0]),
                cute.size(mQ.shape[2]))
        self.kernel(
            mQ, mK, mV, mO, mLSE, softmax_scale, sQ_layout, sKV_layout, gmem_load, gmem_store,
            tiled_mma, SharedStorage,
        ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream)

    # ----------------------------------------------------------------------------------------
    # Device side
    # ----------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        softmax_scale: cutlass.Float32,
        sQ_layout,
        sKV_layout,
        gmem_load: cute.TiledCopy,
        gmem_store: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        cfg = self.cfg
        D = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        m_block, batch, head = cute.arch.block_idx()
        seqlen_q = mQ.shape[1]
        seqlen_k = mK.shape[1]
        n_blocks = cute.ceil_div(seqlen_k, cfg.block_n)

        # ---- tiles of this CTA in global memory, and their coordinates --------------------
        gQ = cute.local_tile(mQ[batch, None, head, None], (cfg.block_m, D), (m_block, 0))
        gK = cute.local_tile(mK[batch, None, head, None], (cfg.block_n, D), (None, 0))
        gV = cute.local_tile(mV[batch, None, head, None], (cfg.block_n, D), (None, 0))
        cQ = cute.make_identity_tensor((cfg.block_m, D))
        cKV = cute.make_identity_tensor((cfg.block_n, D))

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        # V^T view: (D, block_n) for the B operand of O += P V.
        sVt = cute.composition(sV, cute.make_layout((D, cfg.block_n), stride=(cfg.block_n, 1)))

        thr_load = gmem_load.get_slice(tidx)
        tQgQ, tQsQ, tQcQ = (thr_load.partition_S(gQ), thr_load.partition_D(sQ),
                            thr_load.partition_S(cQ))
        tKgK, tKsK = thr_load.partition_S(gK), thr_load.partition_D(sK)
        tVgV, tVsV = thr_load.partition_S(gV), thr_load.partition_D(sV)
        tKVcKV = thr_load.partition_S(cKV)

        # ---- MMA partitions and shared->register copies -----------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, D)),
                                      cutlass.Float32)
        acc_O.fill(0.0)

        ldsm = warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4)
        ldsm_t = warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4)
        s2r_Q = cute.make_tiled_copy_A(cute.make_copy_atom(ldsm, self.dtype), tiled_mma)
        s2r_K = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm, self.dtype), tiled_mma)
        s2r_V = cute.make_tiled_copy_B(cute.make_copy_atom(ldsm_t, self.dtype), tiled_mma)
        thr_s2r_Q = s2r_Q.get_slice(tidx)
        thr_s2r_K = s2r_K.get_slice(tidx)
        thr_s2r_V = s2r_V.get_slice(tidx)
        q_src, q_dst = thr_s2r_Q.partition_S(sQ), thr_s2r_Q.retile(tSrQ)
        k_src, k_dst = thr_s2r_K.partition_S(sK), thr_s2r_K.retile(tSrK)
        v_src, v_dst = thr_s2r_V.partition_S(sVt), thr_s2r_V.retile(tOrVt)

        softmax = OnlineSoftmax.create(cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1]),
                                softmax_scale, cfg.fused_softmax)
        # Column index of each S accumulator element inside a tile, for the Sk mask.
        tScS_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor(
            (cfg.block_m, cfg.block_n))))

        # ---- prologue: Q (and K_0 when loads are eager) -----------------------------------
        q_rows_left = seqlen_q - m_block * cfg.block_m
        self._load_rows(gmem_load, tQgQ, tQsQ, tQcQ, q_rows_left)
        if cutlass.const_expr(cfg.eager_kv_loads):
            self._load_rows(gmem_load, tKgK[None, None, None, 0], tKsK, tKVcKV, seqlen_k)
        self._commit()
        load_q = (s2r_Q, q_src, q_dst)
        if cutlass.const_expr(cfg.q_frags_per_load == 0):
            # Q stays in registers for the whole main loop: load it once.
            self._wait_all_and_sync()
            for k in cutlass.range_constexpr(cute.size(q_src, mode=[2])):
                cute.copy(s2r_Q, q_src[None, None, k], q_dst[None, None, k])
            load_q = None

        # ---- main loop over K/V tiles -----------------------------------------------------
        for n_block in cutlass.range(n_blocks, unroll=1):
            kv_rows_left = seqlen_k - n_block * cfg.block_n
            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, cfg.block_n)),
                                          cutlass.Float32)
            acc_S.fill(0.0)
            if cutlass.const_expr(cfg.eager_kv_loads):
                # K_j is in flight since the previous iteration; everyone is done with V_{j-1}.
                self._wait_all_and_sync()
                self._load_rows(gmem_load, tVgV[None, None, None, n_block], tVsV, tKVcKV,
                                kv_rows_left)
                self._commit()
            else:
                # No barrier before overwriting K: every thread passed the one after S_{j-1}.
                self._load_rows(gmem_load, tKgK[None, None, None, n_block], tKsK, tKVcKV,
                                kv_rows_left)
                self._commit()
                self._wait_all_and_sync()

            # S = Q K_j^T
            self._gemm(tiled_mma, acc_S, tSrQ, tSrK, load_q, (s2r_K, k_src, k_dst),
                       cfg.q_frags_per_load, cfg.k_frags_per_load)

            if cutlass.const_expr(cfg.eager_kv_loads):
                # V_j has landed and everyone is done reading K_j: start K_{j+1}.
                self._wait_all_and_sync()
                if n_block + 1 < n_blocks:
                    self._load_rows(gmem_load, tKgK[None, None, None, n_block + 1], tKsK,
                                    tKVcKV, kv_rows_left - cfg.block_n)
                    self._commit()
            else:
                self._load_rows(gmem_load, tVgV[None, None, None, n_block], tVsV, tKVcKV,
                                kv_rows_left)
                self._commit()
                self._wait_all_and_sync()

            if kv_rows_left < cfg.block_n:
                self._mask_keys(acc_S, tScS_mn, kv_rows_left)
            softmax.update(acc_S, acc_O)

            # O += P V_j, with P converted in registers to the input dtype.
            rP = cute.make_fragment_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            tOrP = acc_as_operand_a(rP)
            self._gemm(tiled_mma, acc_O, tOrP, tOrVt, None, (s2r_V, v_src, v_dst),
                       0, cfg.v_frags_per_load)

        # ---- epilogue ---------------------------------------------------------------------
        lse_rows = cute.make_rmem_tensor((cute.size(softmax.row_max),), cutlass.Float32)
        softmax.finalize(acc_O, lse_rows)
        self._store_lse(mLSE, batch, head, m_block, thr_mma, lse_rows, q_rows_left)
        self._store_o(mO, batch, head, m_block, sQ, acc_O, tiled_mma, gmem_store, tidx,
                      q_rows_left)

    # ----------------------------------------------------------------------------------------
    # Pieces of the kernel
    # ----------------------------------------------------------------------------------------
    @cute.jit
    def _load_rows(self, tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
                   coord: cute.Tensor, rows_left: cutlass.Int32):
        """Copy a tile to shared memory, zero-filling the rows at or past ``rows_left``.

        Rows past the end are never read from global memory; zeros keep stale shared memory
        (possibly NaN bit patterns) out of the MMAs.
        """
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            if coord[0, m, 0][0] < rows_left:
                cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    def _commit(self):
        if cutlass.const_expr(self.cfg.async_copy):
            cute.arch.cp_async_commit_group()

    def _wait_all_and_sync(self):
        if cutlass.const_expr(self.cfg.async_copy):
            cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

    def _gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor,
              tCrB: cute.Tensor, load_a, load_b, a_frags: cutlass.Constexpr,
              b_frags: cutlass.Constexpr):
        """``acc += A @ B`` over the k-blocks (MMA_K = 16 columns) of the reduction dimension.

        ``load_a``/``load_b`` are ``(tiled_copy, smem_view, reg_view)`` for an operand that has
        to come from shared memory, or None when it already sits in registers. ``*_frags`` is
        the sub-tile size in 8-column fragments (0: the whole tile before the first MMA).
        With double buffering the ldmatrix of the next sub-tile is issued before the MMAs of the
        current one, so shared-memory latency hides behind tensor-core work.
        """
        num_k = cute.size(tCrA, mode=[2])
        plan = []
        for spec, frags in ((load_a, a_frags), (load_b, b_frags)):
            if spec is not None:
                step = num_k if frags == 0 else frags * FRAG_COLS // MMA_K
                plan.append((spec, step))
        ahead = self.cfg.double_buffer_smem_to_rf
        if ahead:
            for spec, step in plan:
                self._load_ksteps(spec, 0, step)
        for k in range(num_k):
            for spec, step in plan:
                if k % step == 0:
                    first = k + step if ahead else k
                    if first < num_k:
                        self._load_ksteps(spec, first, step)
            cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)

    def _load_ksteps(self, spec, first: int, count: int):
        tiled_copy, src, dst = spec
        for k in range(first, first + count):
            cute.copy(tiled_copy, src[None, None, k], dst[None, None, k])

    @cute.jit
    def _mask_keys(self, acc_S: cute.Tensor, tScS_mn: cute.Tensor, cols_left: cutlass.Int32):
        """Set S to -inf in the key columns at or past ``cols_left`` (the Sk tail)."""
        s_mn = acc_mn_view(acc_S)
        for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
            if tScS_mn[0, c][1] >= cols_left:
                for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
                    s_mn[r, c] = -cutlass.Float32.inf

    @cute.jit
    def _store_lse(self, mLSE: cute.Tensor, batch, head, m_block, thr_mma, lse_rows,
                   rows_left: cutlass.Int32):
        """One lane of each quad writes the LSE of its rows."""
        cO_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor(
            (self.cfg.block_m, self.head_dim))))
        lane = cute.arch.lane_idx()
        for r in cutlass.range_constexpr(cute.size(lse_rows)):
            row = cO_mn[r, 0][0]
            if lane % 4 == 0:
                if row < rows_left:
                    mLSE[batch, head, m_block * self.cfg.block_m + row] = lse_rows[r]

    @cute.jit
    def _store_o(self, mO: cute.Tensor, batch, head, m_block, sQ: cute.Tensor,
                 acc_O: cute.Tensor, tiled_mma: cute.TiledMma, gmem_store: cute.TiledCopy,
                 tidx, rows_left: cutlass.Int32):
        """O: registers -> shared memory (the Q tile's space) -> 16-byte global stores."""
        cfg = self.cfg
        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        # Reusing Q's space is safe: every thread passed the barrier after the last S GEMM.
        sO = sQ
        # 4-byte stores: a thread's accumulator holds column pairs.
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(),
                                                         self.dtype, num_bits_per_copy=32),
                                     tiled_mma)
        thr_r2s = r2s.get_slice(tidx)
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))

        gO = cute.local_tile(mO[batch, None, head, None], (cfg.block_m, self.head_dim),
                             (m_block, 0))
        thr_store = gmem_store.get_slice(tidx)
        tOsO = thr_store.partition_S(sO)
        tOgO = thr_store.partition_D(gO)
        tOcO = thr_store.partition_D(cute.make_identity_tensor((cfg.block_m, self.head_dim)))
        tOrO = cute.make_fragment_like(tOgO, self.dtype)
        cute.arch.sync_threads()
        cute.copy(gmem_store, tOsO, tOrO)
        for m in cutlass.range_constexpr(cute.size(tOrO, mode=[1])):
            if tOcO[0, m, 0][0] < rows_left:
                cute.copy(gmem_store, tOrO[None, m, None], tOgO[None, m, None])
