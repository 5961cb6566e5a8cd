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
  MMAs in each GEMM (``_gemm``); ``d_head_tile`` (kernel 15) also splits each V sub-tile of
  O += P V into column chunks of the head dim.
* ``fused_softmax``: see ``kernels/common/softmax.py``.
* ``interleave_softmax``: the softmax rescales O for the tile's row maxima, then turns S into
  P one MMA_K slice of keys at a time inside O += P V (``_p_slice`` before each k-block's
  MMAs), so the exp2s of a slice sit between the MMAs of the slices before it in program
  order.
* ``tma_kv_loads`` (sm_90): each K/V tile is one TMA bulk-tensor copy issued by warp 0 and
  counted on an mbarrier of its stage, instead of a cp.async per thread and 16 bytes; the
  block barrier stays (it frees a stage for the next copy).

Tail tiles need no divisibility: Q rows past Sq and K/V rows past Sk are zero-filled in shared
memory (never read from global memory), key columns past Sk are masked to -inf in the last
tile, and O/LSE rows past Sq are not stored.

Beyond the ladder (compile-time variants, so plain attention pays nothing for them):

* ``windowed``: causal / sliding-window attention (``kernels/common/mask.py``): K/V blocks
  outside the band are skipped, and only blocks crossing a band edge are masked.
* ``varlen``: packed ``[total, H, D]`` sequences located by ``cu_seqlens``; a CTA past the end
  of its sequence does no work.
* GQA/MQA (always): query head ``h`` reads K/V head ``h // (Hq / Hkv)``; nothing is copied.
"""


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from attnlab.config import FRAG_COLS, MMA_K, ConfigError
from attnlab.kernels.abi import ForwardSpec
from attnlab.kernels.common.epilogue import store_lse
from attnlab.kernels.common.layouts import (
    acc_as_operand_a,
    acc_mn_view,
    atom_cols,
    smem_tile_layout,
    tma_swizzle,
)
from attnlab.kernels.common.mask import apply_mask, kv_block_range, masked_block_bounds
from attnlab.kernels.common.softmax import OnlineSoftmax
from attnlab.kernels.common.tensors import element_type, problem_tensors, sequence_rows

#: Bits moved by one thread per gmem<->smem copy instruction (16 bytes = 8 halves).
COPY_BITS = 128
#: Indices of the K and V tiles in the kernel's K/V load plumbing.
K, V = 0, 1


class FlashForwardSm80:
    """Compile-time description of one ``mma.sync`` forward kernel (a ``ForwardSpec``).

    Called (through ``cute.compile``) with the ``kernels.abi.ForwardArgs`` and a CUDA stream.
    """

    def __init__(self, spec: ForwardSpec):
        config = spec.config
        config.check_problem(spec.head_dim, arch=None)
        if config.tma_kv_loads and spec.varlen:
            raise ConfigError(
                "tma_kv_loads does not serve packed (varlen) sequences: a tile past the end of "
                "one sequence would read the next instead of zeros; use cp.async loads")
        self.cfg = config
        self.head_dim = spec.head_dim
        # Column chunks of O += P V (kernel 15's tiling along d_head).
        self.v_chunks = spec.head_dim // config.d_head_tile if config.d_head_tile else 1
        self.dtype = element_type(spec.dtype)
        self.windowed = spec.windowed
        self.varlen = spec.varlen

    # ----------------------------------------------------------------------------------------
    # Host side: layouts, copy atoms, tiled MMA, launch
    # ----------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q: cute.Tensor,
        k: cute.Tensor,
        v: cute.Tensor,
        out: cute.Tensor,
        lse: cute.Tensor | None,
        cu_seqlens_q: cute.Tensor | None,
        cu_seqlens_k: cute.Tensor | None,
        softmax_scale: cutlass.Float32,
        window_left: cutlass.Int32,
        window_right: cutlass.Int32,
        max_seqlen_q: cutlass.Int32,
        num_ctas: cutlass.Int32 | None,
        stream: cuda.CUstream,
    ):
        """Build the layouts and launch; the arguments are ``kernels.abi.ForwardArgs``."""
        D = self.head_dim
        mQ, mK, mV, mO, mLSE = problem_tensors(q, k, v, out, lse, self.varlen)
        num_seqs = cu_seqlens_q.shape[0] - 1 if self.varlen else q.shape[0]
        cfg = self.cfg
        sQ_layout = smem_tile_layout(cfg.swizzle, cfg.block_m, self.head_dim)
        sKV_layout = smem_tile_layout(cfg.swizzle, cfg.block_n, self.head_dim, cfg.kv_stages)

        SharedStorage = self._shared_storage(sQ_layout, sKV_layout)
        kv_tma = self._make_tma_loads(mK, mV, sKV_layout) if cfg.tma_kv_loads else None

        if cutlass.const_expr(cfg.async_copy):
            load_op = cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
        else:
            load_op = cute.nvgpu.CopyUniversalOp()
        load_atom = cute.make_copy_atom(load_op, self.dtype, num_bits_per_copy=COPY_BITS)
        store_atom = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=COPY_BITS
        )
        elems_per_copy = COPY_BITS // self.dtype.width
        # One swizzle atom's width per group of threads, 16 bytes each.
        threads_per_row = atom_cols(D) // elems_per_copy
        thr_layout = cute.make_layout(
            (cfg.num_threads // threads_per_row, threads_per_row), stride=(threads_per_row, 1)
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
        num_m_blocks = cute.ceil_div(max_seqlen_q, cfg.block_m)
        grid = (num_m_blocks, num_seqs, mQ.shape[2])
        if cutlass.const_expr(cfg.persistent):
            grid = (num_ctas, 1, 1)
        self.kernel(
            mQ, mK, mV, mO, mLSE, cu_seqlens_q, cu_seqlens_k, window_left, window_right,
            softmax_scale, sQ_layout, sKV_layout, gmem_load, gmem_store, tiled_mma,
            SharedStorage, num_m_blocks, num_seqs, kv_tma,
        ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream)

    def _shared_storage(self, sQ_layout, sKV_layout):
        """The CTA's shared memory: the Q tile, the K and V stages and, for TMA loads, one
        transaction barrier per K and per V stage. (Plain Python: the DSL would turn a
        branch inside a class body into a dynamic one.)"""
        tile_kv = cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)],
                                    1024]
        fields = {"sQ": cute.struct.Align[cute.struct.MemRange[
                      self.dtype, cute.cosize(sQ_layout)], 1024],
                  "sK": tile_kv, "sV": tile_kv}
        if self.cfg.tma_kv_loads:
            fields["kv_bars"] = cute.struct.MemRange[cutlass.Int64, 2 * self.cfg.kv_stages]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def _make_tma_loads(self, mK: cute.Tensor, mV: cute.Tensor, sKV_layout) -> tuple:
        """``(atom, coordinate tensor)`` of K, then of V, for TMA loads of one stage.

        The tensors are viewed as (rows, D, heads, batch), so that a tile is the leading
        (block_n, D) modes; the TMA unit zero-fills the rows past the end of the sequence.
        """
        op = cpasync.CopyBulkTensorTileG2SOp()
        one_stage = cute.make_composed_layout(tma_swizzle(self.head_dim), 0,
                                              cute.slice_(sKV_layout, (None, None, 0)).outer)
        loads = []
        for tensor in (mK, mV):
            view = cute.make_tensor(tensor.iterator, cute.select(tensor.layout, mode=[1, 3, 2, 0]))
            loads.extend(cpasync.make_tiled_tma_atom(op, view, one_stage,
                                                     (self.cfg.block_n, self.head_dim)))
        return tuple(loads)

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
        mCuQ: cute.Tensor,
        mCuK: cute.Tensor,
        window_left: cutlass.Int32,
        window_right: cutlass.Int32,
        softmax_scale: cutlass.Float32,
        sQ_layout,
        sKV_layout,
        gmem_load: cute.TiledCopy,
        gmem_store: cute.TiledCopy,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
        num_m_blocks: cutlass.Int32,
        num_seqs: cutlass.Int32,
        kv_tma,
    ):
        tiles = (mQ, mK, mV, mO, mLSE, mCuQ, mCuK, window_left, window_right, softmax_scale,
                 sQ_layout, sKV_layout, gmem_load, gmem_store, tiled_mma, SharedStorage,
                 num_m_blocks, kv_tma)
        if cutlass.const_expr(self.cfg.persistent):
            # Tiles in the order a plain grid would start them (row blocks of one head
            # together, so they share K/V in L2), dealt round-robin to the resident CTAs.
            first, _, _ = cute.arch.block_idx()
            stride, _, _ = cute.arch.grid_dim()
            num_tiles = num_m_blocks * num_seqs * mQ.shape[2]
            for tile in cutlass.range(first, num_tiles, stride, unroll=1):
                self._tile(tile % num_m_blocks, (tile // num_m_blocks) % num_seqs,
                           tile // (num_m_blocks * num_seqs), *tiles)
                # The next tile's Q lands where this tile's O was staged.
                cute.arch.sync_threads()
        else:
            m_block, seq, head = cute.arch.block_idx()
            self._tile(m_block, seq, head, *tiles)

    @cute.jit
    def _tile(self, m_block, seq, head, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
              mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
              window_left: cutlass.Int32, window_right: cutlass.Int32,
              softmax_scale: cutlass.Float32, sQ_layout, sKV_layout, gmem_load: cute.TiledCopy,
              gmem_store: cute.TiledCopy, tiled_mma: cute.TiledMma,
              SharedStorage: cutlass.Constexpr, num_m_blocks: cutlass.Int32, kv_tma):
        """One output tile: ``block_m`` query rows of one sequence and head."""
        cfg = self.cfg
        D = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(self.windowed):
            # Causal row blocks near the end see the most keys: start them first, so the
            # short ones fill the tail of the grid instead of the long ones.
            m_block = num_m_blocks - 1 - m_block
        head_kv = head // (mQ.shape[2] // mK.shape[2])

        # ---- this CTA's sequence: its rows in the (possibly packed) tensors ---------------
        batch, q_start, k_start = seq, 0, 0
        seqlen_q, seqlen_k = mQ.shape[1], mK.shape[1]
        if cutlass.const_expr(self.varlen):
            batch = 0
            q_start, k_start = mCuQ[seq], mCuK[seq]
            seqlen_q, seqlen_k = mCuQ[seq + 1] - q_start, mCuK[seq + 1] - k_start
        row0 = m_block * cfg.block_m
        n_min, n_max = kv_block_range(row0, seqlen_q, seqlen_k, window_left, window_right,
                                      cfg.block_m, cfg.block_n, self.windowed)
        if cutlass.const_expr(self.varlen):
            # Past the end of a short sequence (the grid is sized for the longest): no work.
            n_max = n_min if row0 >= seqlen_q else n_max

        # ---- tiles of this CTA in global memory, and their coordinates --------------------
        gQ = cute.local_tile(sequence_rows(mQ, batch, q_start, head), (cfg.block_m, D),
                             (m_block, 0))
        cQ = cute.make_identity_tensor((cfg.block_m, D))

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout)[None, None, 0]
        # K and V: (block_n, D, kv_stages); a block's stage is picked when it is loaded/used.
        sK = storage.sK.get_tensor(sKV_layout)
        sV = storage.sV.get_tensor(sKV_layout)
        # V^T view: (D, block_n, kv_stages) for the B operand of O += P V.
        sVt = cute.composition(sV, cute.make_layout((D, cfg.block_n, cfg.kv_stages),
                                                    stride=(cfg.block_n, 1, cfg.block_n * D)))

        thr_load = gmem_load.get_slice(tidx)
        tQgQ, tQsQ, tQcQ = (thr_load.partition_S(gQ), thr_load.partition_D(sQ),
                            thr_load.partition_S(cQ))
        if cutlass.const_expr(cfg.tma_kv_loads):
            # The TMA partition wants the swizzle on the pointer (in bytes), not composed into
            # the layout: the same shared memory as sK and sV.
            kv_loads = self._tma_partitions(
                kv_tma, storage.kv_bars.data_ptr(),
                *(buf.get_tensor(sKV_layout.outer, swizzle=tma_swizzle(D))
                  for buf in (storage.sK, storage.sV)),
                head_kv, batch, tidx)
        else:
            # Per thread: (global blocks, shared stages) of K and of V, and the tile
            # coordinates of its rows (for the zero-filled tail).
            kv_loads = (gmem_load, tuple(
                (thr_load.partition_S(cute.local_tile(sequence_rows(m, batch, k_start, head_kv),
                                                      (cfg.block_n, D), (None, 0))),
                 thr_load.partition_D(smem)) for m, smem in ((mK, sK), (mV, sV))),
                thr_load.partition_S(cute.make_identity_tensor((cfg.block_n, D))))

        # ---- MMA partitions and shared->register copies -----------------------------------
        thr_mma = tiled_mma.get_slice(tidx)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, D)),
                                      cutlass.Float32)
        # Zero also for a CTA that sees no key (its epilogue writes this O).
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

        softmax = OnlineSoftmax.create(
            cute.size(acc_O, mode=[0, 1]) * cute.size(acc_O, mode=[1]), softmax_scale,
            cfg.fused_softmax, guard_empty_rows=self.windowed or self.varlen,
            sum_chains=cfg.row_sum_chains)
        # Column index of each S accumulator element inside a tile, for the Sk mask.
        tScS_mn = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor(
            (cfg.block_m, cfg.block_n))))

        # ---- prologue: Q (and K_0 when loads are eager) -----------------------------------
        q_rows_left = seqlen_q - row0
        self._load_rows(gmem_load, tQgQ, tQsQ, tQcQ, q_rows_left, cfg.block_m)
        # Kernel 13: walking the K/V blocks backwards takes the masked tail (and a causal
        # diagonal) first, while the row maxima are still being established.
        first_block = n_max - 1 if cfg.reverse_kv else n_min
        if cutlass.const_expr(cfg.eager_kv_loads):
            if n_min < n_max:
                # The ring takes V_0 along; otherwise V_j is loaded as block j starts.
                self._load_kv(kv_loads, (K, V)[:2 if cfg.kv_stages > 1 else 1], first_block,
                              seqlen_k - first_block * cfg.block_n)
        self._commit(q=True)
        if cutlass.const_expr(cfg.tma_kv_loads or cfg.q_frags_per_load == 0):
            # Q has to land before its first read: here, not at every block, when it is the
            # only cp.async (TMA loads), or when it is read into registers once.
            self._wait_all_and_sync(q=True)
        load_q = (s2r_Q, q_src, q_dst)
        if cutlass.const_expr(cfg.q_frags_per_load == 0):
            # Q stays in registers for the whole main loop: load it once.
            for k in cutlass.range_constexpr(cute.size(q_src, mode=[2])):
                cute.copy(s2r_Q, q_src[None, None, k], q_dst[None, None, k])
            load_q = None

        # ---- main loop over K/V tiles -----------------------------------------------------
        # One loop per mask phase (FA2's split): the unmasked middle runs a body with no mask
        # code at all; only the band-edge and tail blocks run the masked body.
        left_end, right_start = masked_block_bounds(
            row0, seqlen_q, seqlen_k, window_left, window_right, n_min, n_max, cfg.block_m,
            cfg.block_n, self.windowed)
        bounds = [(n_min, left_end)] if self.windowed else []
        bounds += [(left_end, right_start), (right_start, n_max)]
        if cfg.reverse_kv:
            bounds = bounds[::-1]
        operands = (row0, seqlen_q, seqlen_k, window_left, window_right, tiled_mma, thr_mma,
                    acc_O, softmax, kv_loads, tSrQ, tSrK,
                    tOrVt, load_q, (s2r_K, k_src, k_dst), (s2r_V, v_src, v_dst), tScS_mn)
        if cutlass.const_expr(cfg.peel_first_kv_block):
            # Kernel 10: the first block runs on its own (masked body: any block may be it);
            # the phase loops below start after it.
            if n_min < n_max:
                self._kv_block(first_block, n_min, n_max, *operands, masked=True, first=True)
        for p in cutlass.range_constexpr(len(bounds)):
            lo, hi = bounds[p]
            if cutlass.const_expr(cfg.peel_first_kv_block):
                if cutlass.const_expr(cfg.reverse_kv):
                    hi = cutlass.min(hi, n_max - 1)
                else:
                    lo = cutlass.max(lo, n_min + 1)
            # Literal flags: a Python value carried into a dynamic loop would turn dynamic.
            if cutlass.const_expr(self._phase_masked(p)):
                for i in cutlass.range(hi - lo, unroll=1):
                    n_block = hi - 1 - i if cfg.reverse_kv else lo + i
                    self._kv_block(n_block, n_min, n_max, *operands, masked=True)
            else:
                for i in cutlass.range(hi - lo, unroll=1):
                    n_block = hi - 1 - i if cfg.reverse_kv else lo + i
                    self._kv_block(n_block, n_min, n_max, *operands, masked=False)

        # ---- epilogue ---------------------------------------------------------------------
        # O is staged in Q's shared memory: drain the copies still in flight (all of them when
        # the main loop ran no iteration, e.g. a causal row block that sees no key).
        self._wait_all_and_sync()
        lse_rows = cute.make_rmem_tensor((cute.size(softmax.row_max),), cutlass.Float32)
        softmax.finalize(acc_O, lse_rows)
        if cutlass.const_expr(mLSE is not None):
            store_lse(mLSE, batch, head, q_start + row0, thr_mma, (cfg.block_m, D), lse_rows,
                      q_rows_left)
        self._store_o(sequence_rows(mO, batch, q_start, head), m_block, sQ, acc_O, tiled_mma,
                      gmem_store, tidx, q_rows_left)

    # ----------------------------------------------------------------------------------------
    # Pieces of the kernel
    # ----------------------------------------------------------------------------------------
    def _stage(self, n_block):
        """The shared-memory stage of K/V block ``n_block`` (consecutive blocks alternate)."""
        return n_block % self.cfg.kv_stages if self.cfg.kv_stages > 1 else 0

    def _phase_masked(self, phase: int) -> bool:
        """Whether main-loop phase ``phase`` runs the masked body (phases as in ``kernel``).

        A method, not a local tuple: the DSL turns Python locals seen by a loop dynamic.
        """
        masks = (True, False, True) if self.windowed else (False, True)
        return (masks[::-1] if self.cfg.reverse_kv else masks)[phase]

    @cute.jit
    def _kv_block(self, n_block, n_min, n_max, row0, seqlen_q, seqlen_k, window_left,
                  window_right, tiled_mma, thr_mma, acc_O, softmax, kv_loads, tSrQ, tSrK, tOrVt,
                  load_q, load_k, load_v, tScS_mn,
                  masked: cutlass.Constexpr, first: cutlass.Constexpr = False):
        """One K/V block: S = Q K^T, (mask,) online softmax, O += P V, next loads in flight."""
        cfg = self.cfg
        step = -1 if cfg.reverse_kv else 1
        kv_rows_left = seqlen_k - n_block * cfg.block_n
        following = n_block + step
        stage = self._stage(n_block)
        s2r_K, k_src, k_dst = load_k
        s2r_V, v_src, v_dst = load_v
        load_k = (s2r_K, k_src[None, None, None, stage], k_dst)
        load_v = (s2r_V, v_src[None, None, None, stage], v_dst)
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, cfg.block_n)),
                                      cutlass.Float32)
        acc_S.fill(0.0)
        if cutlass.const_expr(cfg.kv_stages > 1):
            # The ring: K_j and V_j were issued a whole block ago. After this barrier every
            # thread is done with block j-1, so its stage takes block j+1.
            self._wait_all_and_sync()
            if following >= n_min:
                if following < n_max:
                    self._load_kv(kv_loads, (K, V), following, kv_rows_left - step * cfg.block_n)
            self._commit()
            self._await_kv(kv_loads, (K, V), n_block, n_min, n_max)
        elif cutlass.const_expr(cfg.eager_kv_loads):
            # K_j is in flight since the previous block; everyone is done with V_{j-1}.
            self._wait_all_and_sync()
            self._load_kv(kv_loads, (V,), n_block, kv_rows_left)
            self._commit()
            self._await_kv(kv_loads, (K,), n_block, n_min, n_max)
        else:
            # No barrier before overwriting K: every thread passed the one after S_{j-1}.
            self._load_kv(kv_loads, (K,), n_block, kv_rows_left)
            self._commit()
            self._wait_all_and_sync()

        # S = Q K_j^T
        self._gemm(tiled_mma, acc_S, tSrQ, tSrK, load_q, load_k, cfg.q_frags_per_load,
                   cfg.k_frags_per_load)

        if cutlass.const_expr(not cfg.eager_kv_loads):
            self._load_kv(kv_loads, (V,), n_block, kv_rows_left)
            self._commit()
            self._wait_all_and_sync()
        elif cutlass.const_expr(cfg.kv_stages == 1):
            # V_j has landed and everyone is done reading K_j: start the next K.
            self._wait_all_and_sync()
            if following >= n_min:
                if following < n_max:
                    self._load_kv(kv_loads, (K,), following, kv_rows_left - step * cfg.block_n)
                    self._commit()
            self._await_kv(kv_loads, (V,), n_block, n_min, n_max)

        if cutlass.const_expr(masked):
            apply_mask(acc_S, tScS_mn, row0, n_block * cfg.block_n, seqlen_q, seqlen_k,
                       window_left, window_right, self.windowed)
        if cutlass.const_expr(cfg.interleave_softmax):
            softmax.rescale(acc_S, acc_O, first=first)
        else:
            softmax.update(acc_S, acc_O, first=first)
        if cutlass.const_expr(first):
            # O is still empty: a zero accumulator right before the MMAs becomes C = RZ.
            acc_O.fill(0.0)

        # O += P V_j, with P converted in registers to the input dtype.
        rP = cute.make_fragment_like(acc_S, self.dtype)
        p_slices = None
        if cutlass.const_expr(cfg.interleave_softmax):
            p_slices = (softmax, acc_S, rP)
        else:
            rP.store(acc_S.load().to(self.dtype))
        self._gemm(tiled_mma, acc_O, acc_as_operand_a(rP), tOrVt, None, load_v, 0,
                   cfg.v_frags_per_load, self.v_chunks, p_slices)

    @cute.jit
    def _tma_partitions(self, kv_tma: tuple, bars: cute.Pointer, sK: cute.Tensor,
                        sV: cute.Tensor, head_kv, batch, tidx):
        """The TMA side of ``kv_loads``: per tensor (atom, global blocks, shared stages),
        the transaction barriers (K stages, then V stages) and whether this thread issues.

        The barriers are initialised here, before any load can signal them.
        """
        cfg = self.cfg
        if tidx == 0:
            for b in cutlass.range_constexpr(2 * cfg.kv_stages):
                cute.arch.mbarrier_init(bars + b, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        parts = []
        for atom, tensor, smem in ((kv_tma[0], kv_tma[1], sK), (kv_tma[2], kv_tma[3], sV)):
            blocks = cute.local_tile(tensor[None, None, head_kv, batch],
                                     (cfg.block_n, self.head_dim), (None, 0))
            to_smem, from_gmem = cpasync.tma_partition(
                atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                cute.group_modes(blocks, 0, 2))
            parts.append((atom, from_gmem, to_smem))
        # A whole warp takes the branch (one elected lane arms the barrier, the copy elects
        # its own): a per-thread branch around TMA makes ptxas add divergent fallbacks.
        return tuple(parts), bars, cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0

    @cute.jit
    def _load_kv(self, kv_loads, which: tuple, n_block, rows_left):
        """Start loading block ``n_block`` of each tensor in ``which`` (``K``, ``V``) into its
        stage: ``cp.async`` by every thread, or one TMA copy on the stage's barrier."""
        cfg = self.cfg
        stage = self._stage(n_block)
        if cutlass.const_expr(cfg.tma_kv_loads):
            parts, bars, issuer = kv_loads
            if issuer:
                for t in which:
                    atom, from_gmem, to_smem = parts[t]
                    bar = bars + t * cfg.kv_stages + stage
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(
                            bar, cfg.block_n * self.head_dim * self.dtype.width // 8)
                    cute.copy(atom, from_gmem[None, n_block], to_smem[None, stage],
                              tma_bar_ptr=bar)
        else:
            gmem_load, tiles, coord = kv_loads
            for t in which:
                gmem, smem = tiles[t]
                self._load_rows(gmem_load, gmem[None, None, None, n_block],
                                smem[None, None, None, stage], coord, rows_left, cfg.block_n)

    @cute.jit
    def _await_kv(self, kv_loads, which: tuple, n_block, n_min, n_max):
        """Wait until block ``n_block`` of each tensor in ``which`` has landed (TMA: on its
        stage's barrier; ``cp.async`` waits in ``_wait_all_and_sync``)."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.tma_kv_loads):
            _, bars, _ = kv_loads
            # Blocks are consumed in load order: the i-th block a CTA takes is its stage's
            # (i // kv_stages)-th completion, so the barrier's phase parity is that, mod 2.
            i = n_max - 1 - n_block if cfg.reverse_kv else n_block - n_min
            for t in which:
                cute.arch.mbarrier_wait(bars + t * cfg.kv_stages + self._stage(n_block),
                                        (i // cfg.kv_stages) % 2)

    @cute.jit
    def _load_rows(self, tiled_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
                   coord: cute.Tensor, rows_left: cutlass.Int32, tile_rows: cutlass.Constexpr):
        """Copy a ``tile_rows``-row tile to shared memory, zero-filling rows past ``rows_left``.

        Rows past the end are never read from global memory; zeros keep stale shared memory
        (possibly NaN bit patterns) out of the MMAs. With ``unpredicated_full_tiles``, a tile
        wholly inside the sequence takes one uniform branch to plain copies instead of a
        predicated copy / zero-fill pair per row (both halves of a pair issue either way).
        """
        if cutlass.const_expr(self.cfg.unpredicated_full_tiles):
            if rows_left >= tile_rows:
                cute.copy(tiled_copy, src, dst)
            else:
                self._load_rows_predicated(tiled_copy, src, dst, coord, rows_left)
        else:
            self._load_rows_predicated(tiled_copy, src, dst, coord, rows_left)

    @cute.jit
    def _load_rows_predicated(self, tiled_copy: cute.TiledCopy, src: cute.Tensor,
                              dst: cute.Tensor, coord: cute.Tensor, rows_left: cutlass.Int32):
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            if coord[0, m, 0][0] < rows_left:
                cute.copy(tiled_copy, src[None, m, None], dst[None, m, None])
            else:
                dst[None, m, None].fill(0)

    def _copies_by_cp_async(self, q: bool) -> bool:
        """Whether this thread has cp.async copies to commit or wait for: those of K/V
        (none with TMA loads), or with ``q`` the prologue's (Q, and K/V unless by TMA)."""
        return self.cfg.async_copy and (q or not self.cfg.tma_kv_loads)

    def _commit(self, q: bool = False):
        if cutlass.const_expr(self._copies_by_cp_async(q)):
            cute.arch.cp_async_commit_group()

    def _wait_all_and_sync(self, q: bool = False):
        """Wait for this thread's cp.async copies (as ``_commit``), then a block barrier."""
        if cutlass.const_expr(self._copies_by_cp_async(q)):
            cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

    def _gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor,
              tCrB: cute.Tensor, load_a, load_b, a_frags: cutlass.Constexpr,
              b_frags: cutlass.Constexpr, b_chunks: cutlass.Constexpr = 1, p_slices=None):
        """``acc += A @ B`` over the k-blocks (MMA_K = 16 columns) of the reduction dimension.

        ``load_a``/``load_b`` are ``(tiled_copy, smem_view, reg_view)`` for an operand that has
        to come from shared memory, or None when it already sits in registers. ``*_frags`` is
        the sub-tile size in 8-column fragments (0: the whole tile before the first MMA).
        With double buffering the ldmatrix of the next sub-tile is issued before the MMAs of the
        current one, so shared-memory latency hides behind tensor-core work.

        ``b_chunks`` > 1 (kernel 15, A in registers) splits each B sub-tile into that many
        column chunks, loaded one after the other: a B sub-tile in registers is one chunk
        wide. The MMAs still walk k-block by k-block (all chunks of one k-block, then the
        next), so each k-block keeps every accumulator independent of the others.

        ``p_slices`` = (softmax, S accumulator, P fragment) makes A = P one k-block at a
        time, right before that k-block's MMAs (``interleave_softmax``).
        """
        if b_chunks > 1 and load_a is not None:
            raise ValueError("column chunks of B need A in registers (it is not reloaded)")
        num_k = cute.size(tCrA, mode=[2])
        plan = []
        for spec, frags in ((load_a, a_frags), (load_b, b_frags)):
            if spec is not None:
                step = num_k if frags == 0 else frags * FRAG_COLS // MMA_K
                # Sub-tiles in the order the MMAs first use them: (first k-block, chunk).
                chunks = b_chunks if spec is load_b else 1
                units = [(k, c) for k in range(0, num_k, step) for c in range(chunks)]
                plan.append((spec, step, chunks, units))
        ahead = self.cfg.double_buffer_smem_to_rf
        if ahead:
            for spec, step, chunks, units in plan:
                self._load_ksteps(spec, units[0], step, chunks)
        for k in range(num_k):
            for c in range(b_chunks):
                for spec, step, chunks, units in plan:
                    if k % step == 0 and c < chunks:
                        nxt = units.index((k, c)) + (1 if ahead else 0)
                        if nxt < len(units):
                            self._load_ksteps(spec, units[nxt], step, chunks)
                if cutlass.const_expr(p_slices is not None and c == 0):
                    self._p_slice(*p_slices, k)
                if cutlass.const_expr(b_chunks == 1):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
                else:
                    # N split as (atoms of a chunk, chunks): one MMA call per chunk.
                    atoms = cute.size(tCrB, mode=[1]) // b_chunks
                    acc_c = cute.logical_divide(acc, (None, None, atoms))[None, None, (None, c)]
                    tCrB_c = cute.logical_divide(tCrB, (None, atoms))[None, (None, c), k]
                    cute.gemm(tiled_mma, acc_c, tCrA[None, None, k], tCrB_c, acc_c)

    def _p_slice(self, softmax: OnlineSoftmax, acc_S: cute.Tensor, rP: cute.Tensor, k: int):
        """P for k-block ``k`` of O += P V (``interleave_softmax``): exp2 of its S columns
        (two n8 tiles, two columns each per thread), converted to the input dtype."""
        tiles = MMA_K // FRAG_COLS
        softmax.exponentiate(acc_S, 2 * tiles * k, 2 * tiles)
        for n in range(tiles * k, tiles * (k + 1)):
            rP[None, None, n].store(acc_S[None, None, n].load().to(self.dtype))

    def _load_ksteps(self, spec, unit: tuple[int, int], count: int, chunks: int):
        """ldmatrix ``count`` k-blocks from ``unit`` = (first k-block, column chunk of
        ``chunks``); a copy's column index runs along the operand's N columns in order."""
        tiled_copy, src, dst = spec
        first, chunk = unit
        per_chunk = cute.size(src, mode=[1]) // chunks
        for k in range(first, first + count):
            if chunks == 1:
                cute.copy(tiled_copy, src[None, None, k], dst[None, None, k])
            else:
                for j in range(chunk * per_chunk, (chunk + 1) * per_chunk):
                    cute.copy(tiled_copy, src[None, j, k], dst[None, j, k])

    @cute.jit
    def _store_o(self, mO_rows: cute.Tensor, m_block, sQ: cute.Tensor, acc_O: cute.Tensor,
                 tiled_mma: cute.TiledMma, gmem_store: cute.TiledCopy, tidx,
                 rows_left: cutlass.Int32):
        """O: registers -> shared memory (the Q tile's space) -> 16-byte global stores.

        ``mO_rows`` is this sequence's and head's (rows, head_dim) view of O.
        """
        cfg = self.cfg
        rO = cute.make_fragment_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        # Reusing Q's space is safe: every copy into it landed and every thread is past its
        # last read of Q (the barrier at the start of the epilogue).
        sO = sQ
        # 4-byte stores: a thread's accumulator holds column pairs.
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(),
                                                         self.dtype, num_bits_per_copy=32),
                                     tiled_mma)
        thr_r2s = r2s.get_slice(tidx)
        cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))

        gO = cute.local_tile(mO_rows, (cfg.block_m, self.head_dim), (m_block, 0))
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
