"""FlashAttention-2 forward for sm80+ (``mma.sync``), one kernel configured by ``FlashConfig``.

The idea (FlashAttention-2): a CTA owns ``block_m`` query rows (B_r) and streams the keys and
values in tiles of ``block_n`` rows (B_c). For each tile it computes S = Q K^T on the tensor
cores, folds S into an online softmax (running row max and sum, O rescaled when the max moves),
and accumulates O += P V with P taken straight from the S registers. O is normalised once at
the end, so the Sq x Sk score matrix never leaves the chip.

Every knob of the seeds' kernels 1-16 is a compile-time branch of this one kernel:

* ``async_copy``: gmem->smem with ``cp.async.cg`` (LDGSTS, L1 bypass) or LDG + STS.
* ``swizzle``: the shared-memory layout (``kernels/common/layouts.py``).
* ``eager_kv_loads``: K_{j+1} and V_j are in flight while the tensor cores work on the other
  operand; without it each tile is loaded, waited for, then used.
* ``*_frags_per_load`` / ``double_buffer_smem_to_rf``: the schedule of ``ldmatrix`` against the
  MMAs in each GEMM (``ldmatrix_gemm.gemm``); ``d_head_tile`` (kernel 15) also splits each V
  sub-tile of O += P V into column chunks of the head dim.
* ``fused_softmax``: see ``kernels/common/softmax.py``.
* ``interleave_softmax``: the softmax rescales O for the tile's row maxima, then turns S into
  P one MMA_K slice of keys at a time inside O += P V (``ldmatrix_gemm.p_slice`` before each
  k-block's MMAs), so the exp2s of a slice sit between the MMAs of the slices before it in
  program order.
* ``tma_kv_loads`` (sm_90): each K/V tile is one TMA bulk-tensor copy issued by warp 0 and
  counted on an mbarrier of its stage, instead of a cp.async per thread and 16 bytes; the
  block barrier stays (it frees a stage for the next copy).

A block's stage is its index modulo ``kv_stages``; with TMA loads, the phase its stage's
barrier completes is the number of earlier blocks in that stage, mod 2. A persistent CTA
initialises the barriers once and carries each stage's phase from tile to tile
(``phases_after_tile``, ``tma_wait_parity``), so its later tiles wait for the right
completion.

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

from attnlab.config import ConfigError
from attnlab.kernels.abi import ForwardArgs, ForwardSpec
from attnlab.kernels.common.base import (
    ForwardKernel,
    shared_storage,
    shared_tile,
)
from attnlab.kernels.common.epilogue import stage_o, store_lse, store_rows
from attnlab.kernels.common.layouts import (
    COPY_BITS,
    acc_as_operand_a,
    acc_mn_view,
    row_copy,
    smem_tile_layout,
    tma_swizzle,
)
from attnlab.kernels.common.mask import (
    apply_mask,
    kv_block_range,
    masked_block_bounds,
    phase_bounds,
    phase_masked,
)
from attnlab.kernels.common.softmax import OnlineSoftmax
from attnlab.kernels.common.tensors import load_rows, sequence_extent, sequence_rows
from attnlab.kernels.common.tile_scheduler import TileScheduler
from attnlab.kernels.common.tma import rows_first, tile_partition
from attnlab.kernels.sm80.ldmatrix_gemm import gemm

#: Indices of the K and V tiles in the kernel's K/V load plumbing.
K, V = 0, 1


def tma_wait_parity(i, stage, stages: int, phases=None):
    """The phase parity to wait for on ``stage``'s TMA barrier for the ``i``-th K/V block of a
    tile: its stage's ``i // stages``-th completion in the tile (consecutive blocks alternate
    between the stages), after those of a persistent CTA's earlier tiles (bit ``stage`` of
    ``phases``; None for a CTA of one tile). Plain arithmetic: Python ints or DSL values."""
    parity = (i // stages) % 2
    if phases is not None:
        parity = parity ^ ((phases >> stage) % 2)
    return parity


def phases_after_tile(phases, first_stage, blocks, stages: int):
    """``phases`` after a tile of ``blocks`` K/V blocks whose first went to ``first_stage``:
    a stage's bit flips when the tile loaded an odd number of blocks into it (with two
    stages, the first block's stage takes the odd one out)."""
    if stages == 1:
        return phases ^ (blocks % 2)
    return (phases ^ ((((blocks + 1) // 2) % 2) << first_stage)
            ^ (((blocks // 2) % 2) << (1 - first_stage)))


class FlashForwardSm80(ForwardKernel):
    """Compile-time description of one ``mma.sync`` forward kernel (a ``ForwardSpec``).

    Called (through ``cute.compile``) with the ``kernels.abi.ForwardArgs`` and a CUDA stream.
    """

    def __init__(self, spec: ForwardSpec):
        super().__init__(spec)
        if self.cfg.tma_kv_loads and spec.varlen:
            raise ConfigError(
                "tma_kv_loads does not serve packed (varlen) sequences: a tile past the end of "
                "one sequence would read the next instead of zeros; use cp.async loads")
        # Column chunks of O += P V (kernel 15's tiling along d_head).
        self.v_chunks = (spec.head_dim // self.cfg.d_head_tile if self.cfg.d_head_tile
                         else 1)

    # ----------------------------------------------------------------------------------------
    # Host side: layouts, copy atoms, tiled MMA, launch
    # ----------------------------------------------------------------------------------------
    def launch(self, t: ForwardArgs, num_seqs: cutlass.Int32, stream: cuda.CUstream):
        """Layouts, copy atoms and the tiled MMA of the config, then the launch."""
        mQ, mK, mV, mO, mLSE = t.q, t.k, t.v, t.out, t.lse
        D = self.head_dim
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
        gmem_load = row_copy(load_atom, cfg.num_threads, D)
        gmem_store = row_copy(store_atom, cfg.num_threads, D)

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
            (cfg.num_warps, 1, 1),
            # N = 16 lets one ldmatrix.x4 feed two n8 MMAs of the B operand.
            permutation_mnk=(cfg.num_warps * 16, 16, 16),
        )
        num_m_blocks = cute.ceil_div(t.max_seqlen_q, cfg.block_m)
        grid = TileScheduler(num_m_blocks, num_seqs, mQ.shape[2], cfg.persistent,
                             self.windowed, cfg.lpt).grid(t.num_ctas)
        self.kernel(
            mQ, mK, mV, mO, mLSE, t.cu_seqlens_q, t.cu_seqlens_k, t.window_left,
            t.window_right, t.softmax_scale, sQ_layout, sKV_layout, gmem_load, gmem_store,
            tiled_mma, SharedStorage, num_m_blocks, num_seqs, kv_tma,
        ).launch(grid=grid, block=[cfg.num_threads, 1, 1], stream=stream)

    def _shared_storage(self, sQ_layout, sKV_layout):
        """The CTA's shared memory: the Q tile, the K and V stages and, for TMA loads, one
        transaction barrier per K and per V stage."""
        fields = {"sQ": shared_tile(self.dtype, sQ_layout),
                  "sK": shared_tile(self.dtype, sKV_layout),
                  "sV": shared_tile(self.dtype, sKV_layout)}
        if self.cfg.tma_kv_loads:
            fields["kv_bars"] = cute.struct.MemRange[cutlass.Int64, 2 * self.cfg.kv_stages]
        return shared_storage(fields)

    def _make_tma_loads(self, mK: cute.Tensor, mV: cute.Tensor, sKV_layout) -> tuple:
        """``(atom, coordinate tensor)`` of K and of V, for TMA loads of one stage (of
        ``tma.rows_first`` views); the TMA unit zero-fills the rows past the sequence."""
        op = cpasync.CopyBulkTensorTileG2SOp()
        one_stage = cute.make_composed_layout(tma_swizzle(self.head_dim), 0,
                                              cute.slice_(sKV_layout, (None, None, 0)).outer)
        return tuple(tuple(cpasync.make_tiled_tma_atom(op, rows_first(tensor), one_stage,
                                                       (self.cfg.block_n, self.head_dim)))
                     for tensor in (mK, mV))

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
        storage = None
        if cutlass.const_expr(self.cfg.persistent):
            # One allocation for all the CTA's tiles (a second would be placed after the
            # first), and the TMA barriers initialised once. A CTA of one tile does both in
            # _tile, so its binary stays the one measured before.
            storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
            if cutlass.const_expr(self.cfg.tma_kv_loads):
                self._init_kv_barriers(storage.kv_bars.data_ptr(), cute.arch.thread_idx()[0])
        operands = (mQ, mK, mV, mO, mLSE, mCuQ, mCuK, window_left, window_right,
                    softmax_scale, sQ_layout, sKV_layout, gmem_load, gmem_store, tiled_mma,
                    SharedStorage, storage, kv_tma)
        # A persistent CTA carries its TMA barriers' phases (one bit per stage) from tile to
        # tile. Between tiles, the next tile's Q lands where this one's O was staged.
        self.tile_scheduler(num_m_blocks, num_seqs, mQ.shape[2], mQ.shape[2] // mK.shape[2],
                            mK.shape[1], self.cfg.persistent).for_each_tile(
            lambda m_block, seq, head, phases: self._tile(m_block, seq, head, phases,
                                                          *operands),
            cute.arch.sync_threads, cutlass.Int32(0) if self.cfg.persistent else 0)

    @cute.jit
    def _tile(self, m_block, seq, head, phases, mQ: cute.Tensor, mK: cute.Tensor,
              mV: cute.Tensor,
              mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
              window_left: cutlass.Int32, window_right: cutlass.Int32,
              softmax_scale: cutlass.Float32, sQ_layout, sKV_layout, gmem_load: cute.TiledCopy,
              gmem_store: cute.TiledCopy, tiled_mma: cute.TiledMma,
              SharedStorage: cutlass.Constexpr, storage, kv_tma):
        """One output tile: ``block_m`` query rows of one sequence and head. ``phases``: the
        TMA barriers' phase per stage before it (a persistent CTA's); returns them after it."""
        cfg = self.cfg
        D = self.head_dim
        tidx, _, _ = cute.arch.thread_idx()
        head_kv = head // (mQ.shape[2] // mK.shape[2])

        # ---- this CTA's sequence: its rows in the (possibly packed) tensors ---------------
        batch, q_start, k_start, seqlen_q, seqlen_k = sequence_extent(
            seq, mQ, mK, mCuQ, mCuK, self.varlen)
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

        if cutlass.const_expr(storage is None):
            storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
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
        load_rows(gmem_load, tQgQ, tQsQ, tQcQ, q_rows_left, cfg.block_m,
                  cfg.unpredicated_full_tiles)
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
        bounds = phase_bounds(n_min, left_end, right_start, n_max, self.windowed,
                              cfg.reverse_kv)
        operands = (phases, row0, seqlen_q, seqlen_k, window_left, window_right, tiled_mma,
                    thr_mma, acc_O, softmax, kv_loads, tSrQ, tSrK,
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
            if cutlass.const_expr(phase_masked(self.windowed, p, cfg.reverse_kv)):
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
        return self._ring_phases(phases, first_block, n_max - n_min)

    # ----------------------------------------------------------------------------------------
    # Pieces of the kernel
    # ----------------------------------------------------------------------------------------
    def _stage(self, n_block):
        """The shared-memory stage of K/V block ``n_block`` (consecutive blocks alternate)."""
        return n_block % self.cfg.kv_stages if self.cfg.kv_stages > 1 else 0

    def _ring_phases(self, phases, first_block, blocks):
        """The TMA barriers' phases after this tile (a persistent CTA keeps them; a CTA of
        one tile starts from 0)."""
        if cutlass.const_expr(not (self.cfg.persistent and self.cfg.tma_kv_loads)):
            return phases
        return phases_after_tile(phases, self._stage(first_block), blocks, self.cfg.kv_stages)

    @cute.jit
    def _kv_block(self, n_block, n_min, n_max, phases, row0, seqlen_q, seqlen_k, window_left,
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
            self._await_kv(kv_loads, (K, V), n_block, n_min, n_max, phases)
        elif cutlass.const_expr(cfg.eager_kv_loads):
            # K_j is in flight since the previous block; everyone is done with V_{j-1}.
            self._wait_all_and_sync()
            self._load_kv(kv_loads, (V,), n_block, kv_rows_left)
            self._commit()
            self._await_kv(kv_loads, (K,), n_block, n_min, n_max, phases)
        else:
            # No barrier before overwriting K: every thread passed the one after S_{j-1}.
            self._load_kv(kv_loads, (K,), n_block, kv_rows_left)
            self._commit()
            self._wait_all_and_sync()

        # S = Q K_j^T
        gemm(tiled_mma, acc_S, tSrQ, tSrK, load_q, load_k, cfg.q_frags_per_load,
             cfg.k_frags_per_load, cfg.double_buffer_smem_to_rf)

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
            self._await_kv(kv_loads, (V,), n_block, n_min, n_max, phases)

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
        gemm(tiled_mma, acc_O, acc_as_operand_a(rP), tOrVt, None, load_v, 0,
             cfg.v_frags_per_load, cfg.double_buffer_smem_to_rf, self.v_chunks, p_slices)

    @cute.jit
    def _tma_partitions(self, kv_tma: tuple, bars: cute.Pointer, sK: cute.Tensor,
                        sV: cute.Tensor, head_kv, batch, tidx):
        """The TMA side of ``kv_loads``: per tensor (atom, global blocks, shared stages),
        the transaction barriers (K stages, then V stages) and whether this thread issues."""
        cfg = self.cfg
        if cutlass.const_expr(not cfg.persistent):
            self._init_kv_barriers(bars, tidx)
        parts = []
        for tma, smem in zip(kv_tma, (sK, sV), strict=True):
            to_smem, from_gmem = tile_partition(tma, smem, (cfg.block_n, self.head_dim),
                                                (None, 0), head_kv, batch)
            parts.append((tma[0], from_gmem, to_smem))
        # A whole warp takes the branch (one elected lane arms the barrier, the copy elects
        # its own): a per-thread branch around TMA makes ptxas add divergent fallbacks.
        return tuple(parts), bars, cute.arch.make_warp_uniform(cute.arch.warp_idx()) == 0

    @cute.jit
    def _init_kv_barriers(self, bars: cute.Pointer, tidx):
        """The TMA loads' transaction barriers (K stages, then V stages), once per CTA,
        before any load can signal them."""
        if tidx == 0:
            for b in cutlass.range_constexpr(2 * self.cfg.kv_stages):
                cute.arch.mbarrier_init(bars + b, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

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
                load_rows(gmem_load, gmem[None, None, None, n_block],
                          smem[None, None, None, stage], coord, rows_left, cfg.block_n,
                          cfg.unpredicated_full_tiles)

    @cute.jit
    def _await_kv(self, kv_loads, which: tuple, n_block, n_min, n_max, phases):
        """Wait until block ``n_block`` of each tensor in ``which`` has landed (TMA: on its
        stage's barrier; ``cp.async`` waits in ``_wait_all_and_sync``)."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.tma_kv_loads):
            _, bars, _ = kv_loads
            # Blocks are consumed in load order: the i-th block of the tile is its stage's
            # (i // kv_stages)-th completion in the tile, after those of earlier tiles.
            i = n_max - 1 - n_block if cfg.reverse_kv else n_block - n_min
            stage = self._stage(n_block)
            for t in which:
                cute.arch.mbarrier_wait(
                    bars + t * cfg.kv_stages + stage,
                    tma_wait_parity(i, stage, cfg.kv_stages, phases if cfg.persistent else None))

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

    @cute.jit
    def _store_o(self, mO_rows: cute.Tensor, m_block, sQ: cute.Tensor, acc_O: cute.Tensor,
                 tiled_mma: cute.TiledMma, gmem_store: cute.TiledCopy, tidx,
                 rows_left: cutlass.Int32):
        """O: registers -> shared memory (the Q tile's space) -> 16-byte global stores.

        ``mO_rows`` is this sequence's and head's (rows, head_dim) view of O.
        """
        cfg = self.cfg
        # Reusing Q's space is safe: every copy into it landed and every thread is past its
        # last read of Q (the barrier at the start of the epilogue).
        sO = sQ
        stage_o(acc_O, sO, tiled_mma, tidx, self.dtype)

        store_rows(gmem_store, sO, cute.local_tile(mO_rows, (cfg.block_m, self.head_dim),
                                                   (m_block, 0)), tidx, rows_left,
                   cute.arch.sync_threads)
