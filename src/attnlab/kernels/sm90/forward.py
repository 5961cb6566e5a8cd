"""FlashAttention forward for sm_90a with warpgroup MMAs (``wgmma``), configured by ``FlashConfig``
with ``wgmma=True``.

The algorithm is the one of ``kernels/sm80/forward.py`` (online softmax over K/V tiles, P
straight from the S registers, O normalised once); what changes is who does the work:

* **Warpgroup MMAs.** A warpgroup (4 warps) issues one ``wgmma.mma_async`` for a 64 x N x 16
  step; the tensor cores read Q and K straight from shared memory through matrix
  descriptors, so no ``ldmatrix`` and no operand registers sit between shared memory and the
  MMA (the register pressure that made the 32-rows-per-warp ``mma.sync`` tile spill). O += P V
  takes P from registers: the S accumulator, converted to 16 bits, is already laid out as
  the A operand (``layouts.acc_as_wgmma_operand_a``).
* **Warp specialisation.** Warpgroup 0 is the producer: one warp issues every TMA copy (Q once,
  then K_j and V_j into a ``kv_stages`` ring), each stage guarded by a "full" transaction
  barrier the consumers wait on and an "empty" barrier they release once their MMAs have
  read it. It gives up its registers (``setmaxnreg``) to the consumer warpgroups, which own
  64 query rows each and run the softmax and the MMAs.
* **Epilogue by TMA.** O is staged in Q's shared memory (each warpgroup reads only its own
  64 rows of Q) and written by one TMA store, which also clips the rows past Sq.
* **Packed (varlen) sequences.** The TMA boxes of a sequence start at its first row
  (``cu_seqlens``) in the packed tensors, so a tail box reads the next sequence's rows: its
  keys are masked as the Sk tail, its query rows are computed and dropped. O leaves by 16-byte
  copies of the sequence's rows only (a TMA store would write the next sequence's).
* **Schedule knobs** (FlashAttention-3's two overlaps). ``intra_wg_overlap``: a warpgroup
  issues block j's S = Q K^T together with block j-1's O += P V and runs block j's softmax
  while both are on the tensor cores (``_overlapped_blocks``). ``pingpong``: the two consumer
  warpgroups take turns at the tensor cores (round robin, one named barrier each), so one's
  softmax runs under the others' MMAs (``_turn_begin`` / ``_turn_end``).
  ``rescale_o_before_pv`` (with the overlap): O is rescaled for block j-1's maxima while
  block j's S = Q K^T runs, before block j-1's P V is issued, instead of after that P V
  completes, where the rescale (D / 2 multiplies per thread per block) delays the next turn.
* **Persistent grid** (``persistent``). One CTA per SM walks the tiles (the tile
  scheduler's snake over waves); Q and the K/V ring run on across tiles, so the producer
  loads the next tile's first K/V block and its Q while the consumers finish this tile. Where
  shared memory has room O is staged in its own tile (``stages_o_apart``): Q is then
  released after the last S = Q K^T, and a tile's O store is waited for only before the next
  tile stages its O. With one Q buffer the next Q loads only once this tile's is released,
  so consumers back from a short tile's epilogue wait for it; ``q_stages=2`` rings Q over two
  buffers, loading the next tile's Q while this tile's K/V blocks are walked.
* **K and V multicast in clusters of two** (``cluster_m``, persistent unmasked walks). The two
  CTAs of a cluster compute neighbouring row blocks of one head, so they walk the same K/V
  blocks: each loads half of every block and the TMA unit writes it into both CTAs' rings
  (FA3's cluster on Hopper), so the L2 reads each block once per two row blocks (the SMs
  still receive every byte). A stage's full barrier counts both halves' bytes; its empty
  barrier counts both CTAs' consumer warps (each warp releases the stage in both CTAs), so
  neither producer refills a stage the other CTA still reads; before a CTA exits, its
  producer waits until every stage has been released, so no release from the other CTA
  arrives after it.
* **The tail in runs of K/V blocks** (``split_tail``, persistent unmasked walks). The last
  full wave of tiles and the partial one are dealt out as equal runs of K/V blocks instead of
  whole tiles (``tile_scheduler``), so no CTA idles through a partial last wave. A tile split
  between two CTAs: the one with its later blocks leaves O (not normalised) and the rows'
  statistics in global scratch and raises a flag (``_donate``); the one with its earlier blocks
  waits for the flag, merges (``OnlineSoftmax.merge``) and stores the tile
  (``_merge_donated``).
* **Tile height.** One to three consumer warpgroups of 64 rows (``block_m`` 64, 128 or 192):
  three share the registers three ways (160 each), enough at small head dims, where a taller
  tile loads K and V once for more rows.

Masking (Sk tail, causal and sliding windows) and the mask phases of the main loop are those
of the ``mma.sync`` kernel (``kernels/common/mask.py``).
"""

from typing import NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from attnlab.config import WGMMA_M, ConfigError
from attnlab.kernels.abi import ForwardArgs, ForwardSpec, split_tail_values
from attnlab.kernels.common import mask
from attnlab.kernels.common.barriers import NamedBarrier
from attnlab.kernels.common.base import (
    ForwardKernel,
    shared_storage,
    shared_tile,
)
from attnlab.kernels.common.epilogue import stage_o, store_lse, store_rows
from attnlab.kernels.common.layouts import (
    COPY_BITS,
    acc_as_wgmma_operand_a,
    acc_mn_view,
    row_copy,
)
from attnlab.kernels.common.softmax import OnlineSoftmax
from attnlab.kernels.common.tensors import sequence_rows
from attnlab.kernels.common.tile_scheduler import (
    DONOR,
    FINISHER,
    WHOLE,
    KvPiece,
    TileScheduler,
    cluster_rank,
    count_out,
)
from attnlab.kernels.common.tma import rows_first, tile_partition
from attnlab.kernels.sm90.registers import CONSUMER_REGS, PRODUCER_REGS
from attnlab.kernels.sm90.wgmma import uniform_stage, wait_full, wgmma_gemm

#: Threads that meet at a ping-pong turn barrier: the warpgroup whose turn it is and the one
#: that hands it over.
TURN_THREADS = 256


def fence_registers(t: cute.Tensor) -> None:
    """Pin the values of register tensor ``t``: an empty inline-asm statement reads and writes
    each 32-bit register, so the compiler cannot move the instructions that compute them past
    this point (FA3's ``warpgroup_fence_operand``). Its size in bytes must be a multiple of 4."""
    words = cute.recast_tensor(t, cutlass.Int32)
    for i in range(cute.size(words)):
        words[i] = opaque(words[i])


def opaque(value) -> cutlass.Int32:
    """``value`` (32 bits) through an empty inline-asm read-write: the compiler can neither see
    where the result comes from nor drop the statement, so what is computed from it stays
    after this point."""
    return cutlass.Int32(llvm.inline_asm(cutlass.Int32.mlir_type,
                                         [cutlass.Int32(value).ir_value()], "", "=r,0",
                                         has_side_effects=True))


class TileExtent(NamedTuple):
    """Where one output tile lies (``FlashForwardSm90._tile``): its row block and heads, its
    sequence (batch element or packed ``origins``) and lengths, its first row, its K/V block
    range and masked-phase bounds, and whether it has rows at all."""

    m_block: object
    head: object
    head_kv: object
    batch: object
    origins: object
    seqlen_q: object
    seqlen_k: object
    row0: object
    n_min: object
    n_max: object
    left_end: object
    right_start: object
    has_rows: object
    role: object = WHOLE


class FlashForwardSm90(ForwardKernel):
    """Compile-time description of one Hopper forward kernel (a ``ForwardSpec`` of a
    ``wgmma`` config); launched like every ``ForwardKernel``."""

    def __init__(self, spec: ForwardSpec):
        if not spec.config.wgmma:
            raise ConfigError("FlashForwardSm90 runs wgmma configs (FlashConfig.wgmma)")
        super().__init__(spec)
        self.num_consumers = self.cfg.num_warps // 4

    # ----------------------------------------------------------------------------------------
    # Host side
    # ----------------------------------------------------------------------------------------
    def launch(self, t: ForwardArgs, num_seqs: cutlass.Int32, stream: cuda.CUstream):
        """Build the TMA descriptors and launch (no ``num_ctas``: one CTA per output tile)."""
        mQ, mK, mV, mO = t.q, t.k, t.v, t.out
        cfg, D = self.cfg, self.head_dim
        tile_qk = (cfg.block_m, cfg.block_n, D)
        tile_pv = (cfg.block_m, D, cfg.block_n)
        major_k, major_mn = warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN
        # One 64-row wgmma atom per consumer warpgroup, stacked along M.
        atoms = (self.num_consumers, 1, 1)
        mma_qk = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, major_k, major_k, cutlass.Float32, atoms,
            (WGMMA_M, cfg.block_n))
        mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, major_k, major_mn, cutlass.Float32, atoms, (WGMMA_M, D),
            warpgroup.OperandSource.RMEM)
        sQ_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile_qk, self.dtype,
                                                  cfg.q_stages)
        sO_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile_qk, self.dtype, 1)
        sK_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile_qk, self.dtype,
                                                  cfg.kv_stages)
        # V is the B operand of P V with N = head dim contiguous: MN-major.
        sV_layout = sm90_utils.make_smem_layout_b(LayoutEnum.COL_MAJOR, tile_pv, self.dtype,
                                                  cfg.kv_stages)

        # TMA views: tile modes first, then (heads, batch). V as (D, rows) for its MN-major tile.
        v_view = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[3, 1, 2, 0]))
        load = cpasync.CopyBulkTensorTileG2SOp()
        load_kv, cluster = load, cfg.cluster_m
        if cutlass.const_expr(cluster > 1):
            load_kv = cpasync.CopyBulkTensorTileG2SMulticastOp()
        # (atom, coordinate tensor) pairs: what the kernel partitions and copies with.
        tma_q = tuple(cpasync.make_tiled_tma_atom(load, rows_first(mQ),
                                                  self._stage(sQ_layout), (cfg.block_m, D)))
        tma_k = tuple(cpasync.make_tiled_tma_atom(load_kv, rows_first(mK),
                                                  self._stage(sK_layout), (cfg.block_n, D),
                                                  num_multicast=cluster))
        tma_v = tuple(cpasync.make_tiled_tma_atom(load_kv, v_view, self._stage(sV_layout),
                                                  (D, cfg.block_n), num_multicast=cluster))
        if cutlass.const_expr(self.varlen):
            o_store = (mO, row_copy(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(),
                                                         self.dtype, num_bits_per_copy=COPY_BITS),
                                    cfg.num_warps * 32, D))
        else:
            o_store = tuple(cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(),
                                                        rows_first(mO), self._stage(sO_layout),
                                                        (cfg.block_m, D)))

        SharedStorage = self._shared_storage(sQ_layout, sO_layout, sK_layout, sV_layout)
        num_m_blocks = cute.ceil_div(t.max_seqlen_q, cfg.block_m)
        scheduler = TileScheduler(num_m_blocks, num_seqs, mQ.shape[2], cfg.persistent,
                                  self.windowed, cfg.lpt)
        self.kernel(
            tma_q, tma_k, tma_v, o_store, t.lse, t.cu_seqlens_q, t.cu_seqlens_k, t.window_left,
            t.window_right, t.softmax_scale, mma_qk, mma_pv, sQ_layout, sO_layout, sK_layout,
            sV_layout, SharedStorage, num_m_blocks, num_seqs, mQ.shape[2] // mK.shape[2],
            t.tile_counter, t.scratch,
        ).launch(grid=scheduler.grid(t.num_ctas), block=[cfg.num_threads, 1, 1],
                 cluster=[cluster, 1, 1] if cluster > 1 else None, stream=stream,
                 min_blocks_per_mp=1)

    @staticmethod
    def _stage(staged_layout):
        """One stage of a staged shared-memory layout (what one TMA copy fills)."""
        return cute.slice_(staged_layout, (None, None, 0))

    def _shared_storage(self, sQ_layout, sO_layout, sK_layout, sV_layout):
        """Q's ring, O's own tile where ``stages_o_apart``, the K and V rings, the barriers
        (full/empty per Q, K and V stage), and with ``dynamic_tiles`` the tile slots."""
        stages, q_stages = self.cfg.kv_stages, self.cfg.q_stages
        fields = {"sQ": shared_tile(self.dtype, sQ_layout)}
        if cutlass.const_expr(self.cfg.stages_o_apart(self.head_dim)):
            fields["sO"] = shared_tile(self.dtype, sO_layout)
        fields.update({
            "sK": shared_tile(self.dtype, sK_layout), "sV": shared_tile(self.dtype, sV_layout),
            "q_bars": cute.struct.MemRange[cutlass.Int64, 2 * q_stages],
            "k_bars": cute.struct.MemRange[cutlass.Int64, 2 * stages],
            "v_bars": cute.struct.MemRange[cutlass.Int64, 2 * stages]})
        if cutlass.const_expr(self.cfg.dynamic_tiles):
            fields["tile_slots"] = cute.struct.MemRange[cutlass.Int32, self._tile_slots()]
        return shared_storage(fields)

    def _tile_slots(self) -> int:
        """Slots of the tiles drawn with ``dynamic_tiles``, by the Q ring's count: the
        producer writes a tile's slot before it waits for the tile's Q stage, so it may be
        ``q_stages`` tiles past one whose slot the consumers have yet to read; twice the Q
        stages keep those slots apart."""
        return 2 * self.cfg.q_stages

    # ----------------------------------------------------------------------------------------
    # Device side
    # ----------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_q: tuple, tma_k: tuple, tma_v: tuple, o_store: tuple,
               mLSE: cute.Tensor, mCuQ: cute.Tensor, mCuK: cute.Tensor,
               window_left: cutlass.Int32, window_right: cutlass.Int32,
               softmax_scale: cutlass.Float32, mma_qk: cute.TiledMma, mma_pv: cute.TiledMma,
               sQ_layout, sO_layout, sK_layout, sV_layout, SharedStorage: cutlass.Constexpr,
               num_m_blocks: cutlass.Int32, num_seqs: cutlass.Int32,
               heads_per_kv: cutlass.Int32, mTileCounter: cute.Tensor, mScratch: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tile_grid = (num_m_blocks, num_seqs, tma_q[1].shape[2], heads_per_kv,
                     tma_k[1].shape[0], cfg.persistent)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        # The swizzle on the pointer: the form both the TMA partition and wgmma take.
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sO = sQ
        if cutlass.const_expr(cfg.stages_o_apart(self.head_dim)):
            sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        # Q's ring: its "empty" side matters only to a persistent CTA, whose next Q waits for
        # the consumers to be done with the one ``q_stages`` tiles back.
        cluster = cfg.cluster_m
        pipes = [self._tma_pipeline(storage.q_bars.data_ptr(), sQ_layout, cfg.q_stages),
                 self._tma_pipeline(storage.k_bars.data_ptr(), sK_layout, cfg.kv_stages,
                                    cluster),
                 self._tma_pipeline(storage.v_bars.data_ptr(), sV_layout, cfg.kv_stages,
                                    cluster)]
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(cluster > 1):
            # The other CTA's copies and releases reach these barriers: both initialised.
            cute.arch.cluster_arrive_relaxed()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()
        tiles = (tma_q, tma_k, tma_v, mCuQ, mCuK, window_left, window_right, heads_per_kv)

        slots = None
        if cutlass.const_expr(cfg.dynamic_tiles):
            slots = storage.tile_slots.get_tensor(cute.make_layout(2))
        if warp_idx // 4 == 0:
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS[self.num_consumers])
            if warp_idx == 0:
                produce = lambda m_block, seq, head, states, piece=None: self._produce(  # noqa: E731
                    self._tile(m_block, seq, head, *tiles, piece), tma_q, tma_k, tma_v, sQ, sK,
                    sV, pipes, states)
                states = self._ring_states(pipeline.PipelineUserType.Producer)
                if cutlass.const_expr(cfg.dynamic_tiles):
                    self._produce_dynamic(self.tile_scheduler(*tile_grid), produce, states,
                                          mTileCounter, slots, tma_q, sQ, pipes[0])
                else:
                    states = self.tile_scheduler(*tile_grid).for_each_tile(
                        produce, lambda: None, states)
                    if cutlass.const_expr(cluster > 1):
                        # Every release of the other CTA's consumers is in before this
                        # CTA's barriers go away.
                        pipes[1].producer_tail(states[1].clone())
                        pipes[2].producer_tail(states[1].clone())
        else:
            cute.arch.warpgroup_reg_alloc(CONSUMER_REGS[self.num_consumers])
            ctidx = tidx - 128
            wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1
            if cutlass.const_expr(cfg.pingpong):
                if wg == 0:
                    # The first turn at the tensor cores is warpgroup 0's. Once per CTA: a
                    # persistent CTA's last turn of a tile hands over to its next tile's first.
                    NamedBarrier.SCHEDULER.arrive(TURN_THREADS, wg)
            split = (mTileCounter, mScratch) if self.splits_tail else None
            consume = lambda m_block, seq, head, states, piece=None: self._consume(  # noqa: E731
                self._tile(m_block, seq, head, *tiles, piece), ctidx, wg, mma_qk, mma_pv, sQ,
                sO, sK, sV, pipes, o_store, mLSE, softmax_scale, window_left, window_right,
                states, split, waited=cfg.dynamic_tiles)
            states = self._ring_states(pipeline.PipelineUserType.Consumer)
            if cutlass.const_expr(cfg.dynamic_tiles):
                self._consume_dynamic(self.tile_scheduler(*tile_grid), consume, states, slots,
                                      pipes[0])
            else:
                self.tile_scheduler(*tile_grid).for_each_tile(consume, lambda: None, states)
            if cutlass.const_expr(cfg.stages_o_apart(self.head_dim)):
                if ctidx < 32:
                    # The last tile's O store must have read its tile before the CTA ends.
                    cute.arch.cp_async_bulk_wait_group(0, read=True)

    def _ring_states(self, user: pipeline.PipelineUserType) -> tuple:
        """The positions in Q's ring and in the K/V ring, carried from tile to tile."""
        return (pipeline.make_pipeline_state(user, self.cfg.q_stages),
                pipeline.make_pipeline_state(user, self.cfg.kv_stages))

    @cute.jit
    def _produce_dynamic(self, scheduler: TileScheduler, produce, states: tuple,
                         counter: cute.Tensor, slots: cute.Tensor, tma_q: tuple,
                         sQ: cute.Tensor, q_pipe) -> None:
        """The producer warp's walk with ``dynamic_tiles``: each tile drawn goes to the
        consumers in the slot of its Q stage; then a tile past the last tells them to stop,
        delivered with a Q load like any other (the load's bytes complete the barrier)."""
        states = scheduler.draw_each_tile(
            lambda tile, m_block, seq, head, states: produce(
                m_block, seq, head, self._publish(slots, states, tile)),
            states, counter)
        q_state, _ = self._publish(slots, states, scheduler.num_tiles())
        q_smem, q_gmem = tile_partition(tma_q, sQ, (self.cfg.block_m, self.head_dim),
                                        (None, 0), 0, 0)
        self._load(q_pipe, q_state, tma_q, q_smem, q_gmem, 0)
        if cute.arch.lane_idx() == 0:
            ctas, _, _ = cute.arch.grid_dim()
            count_out(counter, ctas)

    @cute.jit
    def _publish(self, slots: cute.Tensor, states: tuple, tile) -> tuple:
        """``tile`` into the slot of the next Q stage (a tile without rows is not loaded, so
        the next one overwrites it); returns ``states``."""
        q_state, _ = states
        if cute.arch.lane_idx() == 0:
            slots[q_state.count % self._tile_slots()] = tile
        return states

    def _consume_dynamic(self, scheduler: TileScheduler, consume, states: tuple,
                         slots: cute.Tensor, q_pipe) -> None:
        """The consumers' walk with ``dynamic_tiles``: each tile from the slot of its Q stage,
        read once Q has landed, until the producer's tile past the last."""

        def receive(states):
            wait_full(q_pipe, states[0], self.cfg.try_wait_first)
            return slots[states[0].count % self._tile_slots()], states

        scheduler.take_each_tile(consume, states, receive)

    def _tma_pipeline(self, barriers: cute.Pointer, staged_layout, stages: int,
                      cluster: int = 1):
        """The full/empty barriers of a ring of TMA tiles: one producer thread arms a stage for
        its bytes; one lane per consumer warp releases it, in each of the ``cluster`` CTAs
        whose copies fill the stage (lane ``r`` in CTA ``r``)."""
        stage_bytes = cute.size_in_bytes(self.dtype, self._stage(staged_layout))
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers, num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     self.cfg.num_warps * cluster),
            tx_count=stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, cluster, 1, 1)) if cluster > 1 else None,
            defer_sync=True)

    @cute.jit
    def _tile(self, m_block, seq, head, tma_q: tuple, tma_k: tuple, tma_v: tuple,
              mCuQ: cute.Tensor, mCuK: cute.Tensor, window_left, window_right,
              heads_per_kv, piece: KvPiece | None = None) -> TileExtent:
        """Where tile ``(m_block, seq, head)`` lies: its sequence and its K/V blocks (with
        ``split_tail``, the ``piece`` of them a unit of the walk takes)."""
        cfg = self.cfg
        # A batch element, or rows of the packed tensors from ``origins``.
        batch, origins = seq, None
        seqlen_q, seqlen_k = tma_q[1].shape[0], tma_k[1].shape[0]
        if cutlass.const_expr(self.varlen):
            batch, origins = 0, (mCuQ[seq], mCuK[seq])
            seqlen_q, seqlen_k = mCuQ[seq + 1] - origins[0], mCuK[seq + 1] - origins[1]
        row0 = m_block * cfg.block_m
        n_min, n_max = mask.kv_block_range(row0, seqlen_q, seqlen_k, window_left,
                                           window_right, cfg.block_m, cfg.block_n,
                                           self.windowed)
        role = WHOLE
        # Past the end of a short packed sequence (the grid is sized for the longest):
        # nothing to load, compute or store. A dense grid has no such tile.
        has_rows = row0 < seqlen_q if self.varlen else True
        if cutlass.const_expr(piece is not None):
            n_min, n_max, role, has_rows = piece
        left_end, right_start = mask.masked_block_bounds(
            row0, seqlen_q, seqlen_k, window_left, window_right, n_min, n_max, cfg.block_m,
            cfg.block_n, self.windowed)
        return TileExtent(m_block, head, head // heads_per_kv, batch, origins, seqlen_q,
                          seqlen_k, row0, n_min, n_max, left_end, right_start, has_rows, role)

    @cute.jit
    def _produce(self, tile: TileExtent, tma_q: tuple, tma_k: tuple, tma_v: tuple,
                 sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, pipes: list,
                 states: tuple) -> tuple:
        """The producer warp's work for one tile: Q, then K_j and V_j for every block (a
        persistent CTA: K_0 first, then Q once its stage is free, i.e. once the consumers are
        done with the tile ``q_stages`` back, then V_j and K_{j+1}), each into the next free
        stage of its ring, blocks in the order the consumers take them. Returns the rings'
        states after it."""
        q_state, state = states
        if tile.has_rows:
            q_state, state = self._produce_rows(tile, tma_q, tma_k, tma_v, sQ, sK, sV, pipes,
                                                q_state, state)
        return q_state, state

    @cute.jit
    def _produce_rows(self, tile: TileExtent, tma_q: tuple, tma_k: tuple, tma_v: tuple,
                      sQ: cute.Tensor, sK: cute.Tensor, sV: cute.Tensor, pipes: list,
                      q_state, state) -> tuple:
        cfg, D = self.cfg, self.head_dim
        q_origin = k_origin = v_origin = None
        if cutlass.const_expr(self.varlen):
            q_origin = (tile.origins[0], 0)
            k_origin, v_origin = (tile.origins[1], 0), (0, tile.origins[1])
        q_smem, q_gmem = tile_partition(tma_q, sQ, (cfg.block_m, D), (None, 0),
                                        tile.head, tile.batch, q_origin)
        multicast, to_ctas = (0, 1), None
        if cutlass.const_expr(cfg.cluster_m > 1):
            multicast = (cluster_rank(), cfg.cluster_m)
            to_ctas = cutlass.Int16((1 << cfg.cluster_m) - 1)
        k_smem, k_gmem = tile_partition(tma_k, sK, (cfg.block_n, D), (None, 0),
                                        tile.head_kv, tile.batch, k_origin, multicast)
        v_smem, v_gmem = tile_partition(tma_v, sV, (D, cfg.block_n), (0, None),
                                        tile.head_kv, tile.batch, v_origin, multicast)
        if cutlass.const_expr(cfg.persistent):
            # K_0 first: it may load while the consumers still hold the previous tile's Q.
            if tile.n_min < tile.n_max:
                self._load(pipes[1], state, tma_k, k_smem, k_gmem, tile.n_min, to_ctas)
            self._load(pipes[0], q_state, tma_q, q_smem, q_gmem, tile.m_block)
            q_state.advance()
            for n_block in cutlass.range(tile.n_min, tile.n_max, unroll=1):
                self._load(pipes[2], state, tma_v, v_smem, v_gmem, n_block, to_ctas)
                state.advance()
                if n_block + 1 < tile.n_max:
                    self._load(pipes[1], state, tma_k, k_smem, k_gmem, n_block + 1, to_ctas)
        else:
            self._load(pipes[0], q_state, tma_q, q_smem, q_gmem, tile.m_block)
            q_state.advance()
            for n_block in cutlass.range(tile.n_min, tile.n_max, unroll=1):
                self._load(pipes[1], state, tma_k, k_smem, k_gmem, n_block)
                self._load(pipes[2], state, tma_v, v_smem, v_gmem, n_block)
                state.advance()
        return q_state, state

    @staticmethod
    def _load(pipe, state, tma_atom, smem: cute.Tensor, gmem: cute.Tensor, block,
              mcast_mask=None) -> None:
        """Block ``block`` of ``gmem`` into the ring stage of ``state``, once it is free
        (``mcast_mask``: also into the same stage of these CTAs of the cluster)."""
        pipe.producer_acquire(state)
        extra = {} if mcast_mask is None else {"mcast_mask": mcast_mask}
        cute.copy(tma_atom[0], gmem[None, block], smem[None, state.index],
                  tma_bar_ptr=pipe.producer_get_barrier(state), **extra)

    @cute.jit
    def _consume(self, tile: TileExtent, ctidx, wg, mma_qk: cute.TiledMma,
                 mma_pv: cute.TiledMma, sQ: cute.Tensor, sO: cute.Tensor, sK: cute.Tensor,
                 sV: cute.Tensor, pipes: list, o_store: tuple, mLSE: cute.Tensor,
                 softmax_scale: cutlass.Float32, window_left, window_right,
                 states: tuple, split: tuple | None, waited: cutlass.Constexpr = False) -> tuple:
        """A consumer warpgroup's share of one tile (none past the end of a packed
        sequence); returns the rings' states after it. ``waited``: Q has landed (the
        dynamic walk waits for it to read the tile). ``split``: ``split_tail``'s flags and
        scratch."""
        q_state, state = states
        if tile.has_rows:
            if cutlass.const_expr(not waited):
                wait_full(pipes[0], q_state, self.cfg.try_wait_first)
            q_state, state = self._consume_rows(tile, ctidx, wg, mma_qk, mma_pv, sQ, sO, sK,
                                                sV, pipes, o_store, mLSE, softmax_scale,
                                                window_left, window_right, q_state, state,
                                                split)
        return q_state, state

    @cute.jit
    def _consume_rows(self, tile: TileExtent, ctidx, wg, mma_qk: cute.TiledMma,
                      mma_pv: cute.TiledMma, sQ: cute.Tensor, sO: cute.Tensor,
                      sK: cute.Tensor, sV: cute.Tensor, pipes: list, o_store: tuple,
                      mLSE: cute.Tensor, softmax_scale: cutlass.Float32, window_left,
                      window_right, q_state, state, split: tuple | None) -> tuple:
        """Its 64 rows of S = Q K^T, softmax and O += P V per block, then its share of the
        epilogue. Q is released once nothing reads it: after the last S = Q K^T where O has
        its own tile, else once O, staged in Q's tile, has been read out."""
        cfg, D = self.cfg, self.head_dim
        thr_qk = mma_qk.get_slice(ctidx)
        thr_pv = mma_pv.get_slice(ctidx)
        # The shared-memory operands' descriptors depend on the warpgroup only: sliced by a
        # warp-uniform index (as FA4 does), and indexed by a warp-uniform stage
        # (``uniform_stage``), ptxas can build them in uniform registers.
        wg_qk = mma_qk.get_slice(wg * 128)
        wg_pv = mma_pv.get_slice(wg * 128)
        tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))[None, None, None,
                                                             uniform_stage(q_state)]
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        tOrV = wg_pv.make_fragment_B(wg_pv.partition_B(sV))
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((cfg.block_m, D)),
                                      cutlass.Float32)
        # Zero also for a tile that sees no key (its epilogue writes this O).
        acc_O.fill(0.0)
        softmax = OnlineSoftmax.create(
            cute.size(acc_mn_view(acc_O), mode=[0]), softmax_scale, cfg.fused_softmax,
            guard_empty_rows=self.windowed or self.varlen, lazy=cfg.lazy_rescale,
            correction_first=cfg.correction_first)
        tScS_mn = acc_mn_view(thr_qk.partition_C(cute.make_identity_tensor(
            (cfg.block_m, cfg.block_n))))

        q_pipe, kv_pipes = pipes[0], pipes[1:]
        operands = (mma_qk, mma_pv, thr_qk, tSrQ, tSrK, tOrV, acc_O, softmax, kv_pipes,
                    tScS_mn, tile.row0, tile.seqlen_q, tile.seqlen_k, window_left,
                    window_right, wg)
        n_min, n_max = tile.n_min, tile.n_max
        # Where this tile's rows start in the (packed) tensors and how many there are, taken
        # before the K/V loop: two values live through it instead of the four they come from.
        first_row = tile.row0
        if cutlass.const_expr(self.varlen):
            first_row = tile.origins[0] + tile.row0
        rows_left = tile.seqlen_q - tile.row0
        bounds = mask.phase_bounds(n_min, tile.left_end, tile.right_start, n_max,
                                   self.windowed)
        if cutlass.const_expr(cfg.intra_wg_overlap):
            state = self._overlapped_blocks(state, operands, bounds, n_min, n_max)
        else:
            for p in cutlass.range_constexpr(len(bounds)):
                lo, hi = bounds[p]
                if cutlass.const_expr(mask.phase_masked(self.windowed, p)):
                    for n_block in cutlass.range(lo, hi, unroll=1):
                        state = self._kv_block(n_block, state, *operands, masked=True)
                else:
                    for n_block in cutlass.range(lo, hi, unroll=1):
                        state = self._kv_block(n_block, state, *operands, masked=False)
        o_apart = cfg.stages_o_apart(self.head_dim)
        if cutlass.const_expr(o_apart):
            q_pipe.consumer_release(q_state)

        finish = (acc_O, softmax, mLSE, thr_pv, o_store, sO, mma_pv, ctidx, tile, first_row,
                  rows_left)
        if cutlass.const_expr(split is not None):
            flags, scratch = split
            cta, _, _ = cute.arch.block_idx()
            if tile.role == FINISHER:
                self._merge_donated(acc_O, softmax, flags, scratch, cta + cfg.cluster_m, ctidx)
            if tile.role == DONOR:
                self._donate(acc_O, softmax, flags, scratch, cta, ctidx)
            else:
                self._finish_tile(*finish)
        else:
            self._finish_tile(*finish)
        if cutlass.const_expr(cfg.persistent and not o_apart):
            q_pipe.consumer_release(q_state)
        q_state.advance()
        return q_state, state

    @cute.jit
    def _finish_tile(self, acc_O: cute.Tensor, softmax: OnlineSoftmax, mLSE: cute.Tensor,
                     thr_pv, o_store: tuple, sO: cute.Tensor, mma_pv: cute.TiledMma, ctidx,
                     tile: TileExtent, first_row, rows_left) -> None:
        """O normalised and stored, and the rows' LSE."""
        lse_rows = cute.make_rmem_tensor((cute.size(softmax.row_max),), cutlass.Float32)
        softmax.finalize(acc_O, lse_rows)
        if cutlass.const_expr(mLSE is not None):
            store_lse(mLSE, tile.batch, tile.head, first_row, thr_pv,
                      (self.cfg.block_m, self.head_dim), lse_rows, rows_left)
        self._store_o(o_store, sO, acc_O, mma_pv, ctidx, tile, first_row, rows_left)

    def _donated(self, scratch: cute.Tensor, slot, ctidx) -> cute.Tensor:
        """A consumer thread's values in ``slot`` of the scratch (``split_tail_values`` of
        them, one thread's after another's, so a warp's accesses are consecutive): O's rows
        in the order of ``acc_mn_view``, then the rows' maxima, then their sums."""
        threads = 32 * self.cfg.num_warps
        values = split_tail_values(self.cfg, self.head_dim)
        return cute.make_tensor(scratch.iterator + (slot * values * threads + ctidx),
                                cute.make_layout(values, stride=threads))

    @cute.jit
    def _donate(self, acc_O: cute.Tensor, softmax: OnlineSoftmax, flags: cute.Tensor,
                scratch: cute.Tensor, slot, ctidx) -> None:
        """``split_tail``, the later blocks of a split tile: O (not normalised) and the row
        statistics into the CTA's slot of the scratch, then its flag raised (each thread's
        release fence and the consumers' barrier order every write before it)."""
        donated = self._donated(scratch, slot, ctidx)
        o_mn = acc_mn_view(acc_O)
        rows, cols = cute.size(o_mn, mode=[0]), cute.size(o_mn, mode=[1])
        for r in cutlass.range_constexpr(rows):
            for c in cutlass.range_constexpr(cols):
                donated[r * cols + c] = o_mn[r, c]
            donated[rows * cols + r] = softmax.row_max[r]
            donated[rows * cols + rows + r] = softmax.row_sum[r]
        cute.arch.fence_acq_rel_gpu()
        NamedBarrier.EPILOGUE.sync(self.cfg.num_warps * 32)
        if ctidx == 0:
            cute.arch.store(flags.iterator + slot, cutlass.Int32(1), sem="release",
                            scope="gpu")

    @cute.jit
    def _merge_donated(self, acc_O: cute.Tensor, softmax: OnlineSoftmax, flags: cute.Tensor,
                       scratch: cute.Tensor, slot, ctidx) -> None:
        """``split_tail``, the earlier blocks of a split tile: once the donor's flag is up
        (each thread acquires it, so its reads follow the donor's writes), its O and row
        statistics merged into this CTA's; the flag is lowered for the next launch once every
        thread has seen it."""
        flag = flags.iterator + slot
        seen = cute.arch.load(flag, cutlass.Int32, sem="acquire", scope="gpu")
        while seen == 0:
            seen = cute.arch.load(flag, cutlass.Int32, sem="acquire", scope="gpu")
        donated = self._donated(scratch, slot, ctidx)
        rows = cute.size(softmax.row_max)
        cols = cute.size(acc_mn_view(acc_O), mode=[1])
        softmax.merge(acc_O, lambda r, c: donated[r * cols + c],
                      lambda r: donated[rows * cols + r],
                      lambda r: donated[rows * cols + rows + r])
        NamedBarrier.EPILOGUE.sync(self.cfg.num_warps * 32)
        if ctidx == 0:
            cute.arch.store(flag, cutlass.Int32(0))

    @cute.jit
    def _kv_block(self, n_block, state, mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, thr_qk,
                  tSrQ: cute.Tensor, tSrK: cute.Tensor, tOrV: cute.Tensor, acc_O: cute.Tensor,
                  softmax: OnlineSoftmax, pipes: list, tScS_mn: cute.Tensor, row0, seqlen_q,
                  seqlen_k, window_left, window_right, wg, masked: cutlass.Constexpr):
        """One K/V block of a consumer warpgroup; returns the advanced ring state. With
        ``pingpong`` the warpgroups take turns issuing their S = Q K^T: each waits for its
        turn, issues, and hands the turn over (a warpgroup that arrived twice before the other
        waited once would complete the other's barrier alone)."""
        cfg = self.cfg
        acc_S = self._start_s(state, mma_qk, thr_qk, tSrQ, tSrK, pipes, wg)
        self._turn_end(wg)
        warpgroup.wait_group(0)
        pipes[0].consumer_release(state)
        if cutlass.const_expr(masked):
            mask.apply_mask(acc_S, tScS_mn, row0, n_block * cfg.block_n, seqlen_q, seqlen_k,
                            window_left, window_right, self.windowed, paired_columns=True)
        softmax.update(acc_S, acc_O)
        rP = cute.make_fragment_like(acc_S, self.dtype)
        self._convert_p(acc_S, rP)
        wait_full(pipes[1], state, self.cfg.try_wait_first)
        wgmma_gemm(mma_pv, acc_O, acc_as_wgmma_operand_a(rP),
                   tOrV[None, None, None, uniform_stage(state)], zero_init=False)
        pipes[1].consumer_release(state)
        state.advance()
        return state

    @cute.jit
    def _overlapped_blocks(self, state, operands: tuple, bounds: list, n_min, n_max):
        """The main loop with ``intra_wg_overlap``: the first block's S and softmax on their
        own, then per block j its S = Q K^T and block j-1's O += P V issued together, block
        j's softmax while they run, O rescaled once the P V MMAs are done; the last block's
        O += P V after the loop. Returns the ring state after the tile's blocks."""
        if n_min < n_max:
            state = self._overlapped_walk(state, operands, bounds, n_min, n_max)
        return state

    @cute.jit
    def _overlapped_walk(self, state, operands: tuple, bounds: list, n_min, n_max):
        """``_overlapped_blocks`` over at least one block."""
        (mma_qk, mma_pv, thr_qk, tSrQ, tSrK, tOrV, acc_O, softmax, pipes, tScS_mn, row0,
         seqlen_q, seqlen_k, window_left, window_right, wg) = operands
        cfg = self.cfg
        s_shape = thr_qk.partition_shape_C((cfg.block_m, cfg.block_n))
        # P of the previous block, read by its O += P V while this block's S is computed.
        rP = cute.make_rmem_tensor(s_shape, self.dtype)
        corrections = cute.make_rmem_tensor((cute.size(softmax.row_max),), cutlass.Float32)
        acc_S = cute.make_rmem_tensor(s_shape, cutlass.Float32)
        wait_full(pipes[0], state, self.cfg.try_wait_first)
        wgmma_gemm(mma_qk, acc_S, tSrQ, tSrK[None, None, None, uniform_stage(state)],
                   zero_init=True)
        pipes[0].consumer_release(state)
        # Masked whatever its phase: any block may be the first.
        mask.apply_mask(acc_S, tScS_mn, row0, n_min * cfg.block_n, seqlen_q, seqlen_k,
                        window_left, window_right, self.windowed, paired_columns=True)
        softmax.update(acc_S, acc_O, first=True)
        self._convert_p(acc_S, rP)
        if cutlass.const_expr(cfg.rescale_o_before_pv):
            # O is still zero: the first block's rescale, applied before its P V, is 1.
            corrections.fill(1.0)
        v_state = state.clone()
        state.advance()
        blocks = (rP, corrections, *operands)
        for p in cutlass.range_constexpr(len(bounds)):
            lo, hi = bounds[p]
            lo = cutlass.max(lo, n_min + 1)
            if cutlass.const_expr(mask.phase_masked(self.windowed, p)):
                for n_block in cutlass.range(lo, hi, unroll=1):
                    state, v_state = self._overlapped_block(n_block, state, v_state,
                                                            *blocks, masked=True)
            else:
                for n_block in cutlass.range(lo, hi, unroll=1):
                    state, v_state = self._overlapped_block(n_block, state, v_state,
                                                            *blocks, masked=False)
        if cutlass.const_expr(cfg.rescale_o_before_pv):
            softmax.rescale_o(acc_O, corrections)
        wait_full(pipes[1], v_state, self.cfg.try_wait_first)
        wgmma_gemm(mma_pv, acc_O, acc_as_wgmma_operand_a(rP),
                   tOrV[None, None, None, uniform_stage(v_state)], zero_init=False)
        pipes[1].consumer_release(v_state)
        return state

    @cute.jit
    def _overlapped_block(self, n_block, state, v_state, rP: cute.Tensor,
                          corrections: cute.Tensor, mma_qk: cute.TiledMma,
                          mma_pv: cute.TiledMma, thr_qk, tSrQ: cute.Tensor, tSrK: cute.Tensor,
                          tOrV: cute.Tensor, acc_O: cute.Tensor, softmax: OnlineSoftmax,
                          pipes: list, tScS_mn: cute.Tensor, row0, seqlen_q, seqlen_k,
                          window_left, window_right, wg, masked: cutlass.Constexpr):
        """Block ``n_block``'s S and the previous block's O += P V (``v_state``'s V stage) in
        flight together; returns the ring states of the next block and of this one's V.
        ``corrections``: O's row factors for the previous block's maxima, applied after that
        block's P V, or with ``rescale_o_before_pv`` before it, while S is computed (then
        ``corrections`` carries the factors from one block to the next)."""
        cfg = self.cfg
        acc_S = self._start_s(state, mma_qk, thr_qk, tSrQ, tSrK, pipes, wg)
        if cutlass.const_expr(cfg.rescale_o_before_pv):
            softmax.rescale_o(acc_O, corrections)
        wait_full(pipes[1], v_state, self.cfg.try_wait_first)
        wgmma_gemm(mma_pv, acc_O, acc_as_wgmma_operand_a(rP),
                   tOrV[None, None, None, uniform_stage(v_state)], zero_init=False, wait=False)
        self._turn_end(wg)
        warpgroup.wait_group(1)  # S has landed; P V may still run
        pipes[0].consumer_release(state)
        if cutlass.const_expr(masked):
            mask.apply_mask(acc_S, tScS_mn, row0, n_block * cfg.block_n, seqlen_q, seqlen_k,
                            window_left, window_right, self.windowed, paired_columns=True)
        softmax.step(acc_S, corrections)
        warpgroup.wait_group(0)  # P V is done: O and the previous P are free
        pipes[1].consumer_release(v_state)
        if cutlass.const_expr(not cfg.rescale_o_before_pv):
            softmax.rescale_o(acc_O, corrections)
        self._convert_p(acc_S, rP)
        v_state = state.clone()
        state.advance()
        return state, v_state

    def _convert_p(self, acc_S: cute.Tensor, rP: cute.Tensor) -> None:
        """P = the softmaxed S in the input dtype, the A operand of O += P V (``fence_p``:
        pinned there)."""
        rP.store(acc_S.load().to(self.dtype))
        if cutlass.const_expr(self.cfg.fence_p):
            fence_registers(rP)

    def _start_s(self, state, mma_qk: cute.TiledMma, thr_qk, tSrQ: cute.Tensor,
                 tSrK: cute.Tensor, pipes: list, wg) -> cute.Tensor:
        """Wait for the block's K and this warpgroup's turn, then issue S = Q K^T (not waited
        for): the S accumulator."""
        acc_S = cute.make_rmem_tensor(
            thr_qk.partition_shape_C((self.cfg.block_m, self.cfg.block_n)), cutlass.Float32)
        wait_full(pipes[0], state, self.cfg.try_wait_first)
        self._turn_begin(wg)
        wgmma_gemm(mma_qk, acc_S, tSrQ, tSrK[None, None, None, uniform_stage(state)],
                   zero_init=True, wait=False)
        return acc_S

    def _turn_begin(self, wg):
        """``pingpong``: wait for this warpgroup's turn at the tensor cores."""
        if cutlass.const_expr(self.cfg.pingpong):
            NamedBarrier.SCHEDULER.sync(TURN_THREADS, wg)

    def _turn_end(self, wg):
        """``pingpong``: give the turn to the next warpgroup (round robin)."""
        if cutlass.const_expr(self.cfg.pingpong):
            # With two, ``1 - wg`` is the same turn without a remainder.
            following = (1 - wg if self.num_consumers == 2
                         else (wg + 1) % self.num_consumers)
            NamedBarrier.SCHEDULER.arrive(TURN_THREADS, following)

    @cute.jit
    def _store_o(self, o_store: tuple, sO: cute.Tensor, acc_O: cute.Tensor,
                 mma_pv: cute.TiledMma, ctidx, tile: TileExtent, first_row, rows_left):
        """O: registers -> shared memory -> one TMA store (rows past Sq are clipped), or for
        packed sequences 16-byte copies of the sequence's rows (``o_store``: the TMA atom and
        coordinates, or O and the tiled copy).

        ``sO`` is Q's tile, or O's own (``stages_o_apart``). In Q's, a warpgroup overwrites
        only its own rows, which no other warpgroup reads, after its last QK^T MMA has
        completed, and the store has read them before this returns. In its own, the previous
        tile's store may still be reading it: all wait for that first, and this tile's store
        is waited for at the next one (or at the CTA's end).
        """
        cfg, D = self.cfg, self.head_dim
        o_apart = cfg.stages_o_apart(self.head_dim)
        if cutlass.const_expr(o_apart):
            if cutlass.const_expr(not self.varlen):
                if ctidx < 32:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            NamedBarrier.EPILOGUE.sync(cfg.num_warps * 32)
        if cutlass.const_expr(cfg.late_o_addresses):
            ctidx = opaque(ctidx)
        stage_o(acc_O, sO[None, None, 0], mma_pv, ctidx, self.dtype)
        if cutlass.const_expr(self.varlen):
            mO, gmem_store = o_store
            gO = cute.local_tile(sequence_rows(mO, tile.batch, first_row, tile.head),
                                 (cfg.block_m, D), (0, 0))
            store_rows(gmem_store, sO[None, None, 0], gO, ctidx, rows_left,
                       lambda: NamedBarrier.EPILOGUE.sync(cfg.num_warps * 32))
        else:
            # Generic-proxy writes, read next by the TMA unit (async proxy).
            cute.arch.fence_proxy("async.shared", space="cta")
            NamedBarrier.EPILOGUE.sync(cfg.num_warps * 32)
            if ctidx < 32:
                o_smem, o_gmem = tile_partition(o_store, sO, (cfg.block_m, D), (None, 0),
                                                tile.head, tile.batch)
                cute.copy(o_store[0], o_smem[None, 0], o_gmem[None, tile.m_block])
                cute.arch.cp_async_bulk_commit_group()
                if cutlass.const_expr(not o_apart):
                    # Q's tile must outlive the store's reads of it.
                    cute.arch.cp_async_bulk_wait_group(0, read=True)

