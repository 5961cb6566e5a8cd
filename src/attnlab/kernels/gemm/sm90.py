"""HGEMM for sm_90a: ``C = A @ B`` with warpgroup MMAs fed by a TMA ring (a ``GemmSpec``).

The lab's HGEMM steps (shared-memory tiles, ``ldmatrix`` fragments, cp.async double
buffering, the 16-warp 128 x 128 / 128 x 256 tiles, swizzled shared memory, the staged
epilogue) are what this kernel is made of, in their Hopper form:

* **Warp specialisation.** Warpgroup 0 is the producer: one warp issues the TMA copies of A's
  and B's K tiles into a ``stages``-deep ring (one "full" transaction barrier and one "empty"
  barrier per stage), and gives its registers (``setmaxnreg``) to the consumers. Each
  consumer warpgroup owns 64 rows of the ``block_m x block_n`` tile; its ``wgmma`` reads A
  and B straight from the 128-byte-swizzled stages (no ``ldmatrix``, no operand registers),
  one stage's MMAs in flight while it waits for the next stage (``wait_group(1)``).
* **Persistent walk.** CTAs walk the output tiles (``kernels/gemm/tiles.py``: raster groups,
  then K slices). The producer runs ahead into the next tile while the consumers finish this
  one, so the ring never drains between tiles.
* **Epilogue by TMA.** A consumer warpgroup converts its accumulator, stages it in its own
  slice of shared memory and one warp issues a TMA store of the 64 x ``block_n`` box (which
  clips the rows and columns past M and N); the store drains while the next tile's MMAs run,
  and is waited for only before the slice is written again.
* **Split-K.** Work item ``(m, n, s)`` covers K tiles ``[s * per, (s + 1) * per)``. With
  ``split="serial"`` slice ``s`` stores its fp32 partial sums straight from registers to
  ``workspace[s]`` and counts itself in at the tile's counter (a fence, then one atomic per
  warpgroup); the slice that counts last adds the tile's partials up in split order (two
  slices: the other's onto its registers; more: all read back, four slices' loads in flight),
  resets the counter and runs the epilogue: one kernel, deterministic. With
  ``split="cluster"`` a tile's slices are one thread-block cluster and meet in distributed
  shared memory (``kernels/gemm/cluster_split.py``): one kernel, no workspace, deterministic.
  With ``split="workspace"`` C is fp32 ``[splits, M, N]`` and slice ``s`` stores to ``C[s]``
  (summed in order by ``kernels/gemm/reduce.py``); with ``split="atomic"`` the epilogue's TMA
  copy is a reduce-add into an fp32 C (the adds happen in L2).

* **2:4 sparse A** (``GemmSpec.sparse``, the lab's Observation N on Hopper). A's ring holds
  only its kept halves (``block_k / 2`` columns a stage), and each 32-deep K step is one
  ``wgmma.mma_async.sp`` m64 x ``block_n`` x k32 per consumer warpgroup instead of two dense
  k16 ones: half of A's bytes and half the MMA instructions. The dense tiled MMA still lays out
  the stages and builds their shared-memory descriptors (A's compressed 16-column block is a
  dense k16 block, B's 32 rows start where its dense k16 block ``2 step`` does); the
  instruction is inline PTX on those descriptors (the DSL has no sparse ``wgmma``), and each
  thread pair of a quad (selector 0) hands it the metadata of its rows g and g + 8: words
  laid out on the host in the order threads read them (``attnlab.gemm.sparse.wgmma_words``),
  one vector load a K tile, issued while the previous stage's MMAs run (per-row 16-bit loads
  were the kernel's limit: ``docs/gemm.md``). With ``GemmConfig.sparse_meta="tma"`` the
  producer copies each K tile's words of the tile's rows into a ring of its own (one slot
  fewer than A's and B's: a consumer frees its slot as soon as its threads hold their
  words), and the vector load reads shared memory; with ``"global"`` it reads the words in
  global memory.

The host guarantees every slice at least one K tile (``attnlab.gemm.dispatch``); a K tail
past the tensor is zero-filled by the TMA unit, so M, N and K need not be tile multiples.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.tensor_utils import LayoutEnum

from attnlab.config import WGMMA_M
from attnlab.gemm_config import PARTIAL_PAD
from attnlab.kernels.common.barriers import NamedBarrier, count_in
from attnlab.kernels.common.base import shared_storage, shared_tile
from attnlab.kernels.common.epilogue import store_fragment
from attnlab.kernels.common.layouts import acc_mn_view
from attnlab.kernels.gemm.abi import PAD_META, SPARSE_MMA_K, WORDS_K, GemmArgs, GemmSpec
from attnlab.kernels.gemm.base import GemmKernel
from attnlab.kernels.gemm.cluster_split import stage_partials, sum_band
from attnlab.kernels.gemm.ptx_mma import add_s8x4, retire_words, wgmma_sp
from attnlab.kernels.gemm.tiles import k_tiles_per_split, tile_coords
from attnlab.kernels.sm90.registers import CONSUMER_REGS, PRODUCER_REGS
from attnlab.kernels.sm90.wgmma import smem_descriptor, uniform_stage, wgmma_gemm

#: Threads of one warpgroup.
WARPGROUP = 128
#: Metadata words of one 16-row block and K group: 16 thread places x 4 32-deep steps.
GROUP_WORDS = 16 * (WORDS_K // SPARSE_MMA_K)


class HgemmSm90(GemmKernel):
    """Compile-time description of one sm_90a GEMM (a ``GemmSpec`` of a ``GemmConfig``)."""

    def __init__(self, spec: GemmSpec):
        super().__init__(spec)
        self.num_consumers = self.cfg.num_consumers
        self.cluster = spec.split == "cluster"
        self.stages = self.cfg.ring_stages(spec.arch, spec.out_dtype, spec.dtype, spec.sparse,
                                           self.cluster)
        self.tile = (self.cfg.block_m, self.cfg.block_n, self.cfg.block_k)
        # How A's TMA coordinates are tiled: (rows, K step) of an [M, K] matrix (of its kept
        # halves [M, K / 2] when A is 2:4 sparse).
        self.a_tiler = (self.cfg.block_m, self.a_block_k)
        # s8 x s8 MMAs accumulate exactly in int32; 16-bit ones in fp32.
        self.acc_dtype = cutlass.Int32 if spec.dtype == "int8" else cutlass.Float32
        # 2:4 sparse A's metadata ring (``GemmConfig.sparse_meta="tma"``; 0: none).
        self.meta_slots = self.cfg.meta_slots(self.stages, spec.sparse)

    # ----------------------------------------------------------------------------------------
    # Host side
    # ----------------------------------------------------------------------------------------
    def launch(self, t: GemmArgs, stream: cuda.CUstream):
        """The TMA atoms, layouts and MMAs of the spec, then the persistent launch."""
        a, b, c = t.a, t.b, t.c
        cfg = self.cfg
        bm, bn, bk = self.tile
        # B as (N, K) and C as (M, N, splits): the modes the MMA and the TMA unit index.
        mB = cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 0]))
        if cutlass.const_expr(self.spec.split == "workspace"):
            mC = cute.make_tensor(c.iterator, cute.select(c.layout, mode=[1, 2, 0]))
        else:
            mC = cute.make_tensor(c.iterator, cute.append(c.layout, cute.make_layout(1)))
        a_enum = LayoutEnum.ROW_MAJOR if self.spec.a_major == "k" else LayoutEnum.COL_MAJOR
        b_enum = LayoutEnum.ROW_MAJOR if self.spec.b_major == "k" else LayoutEnum.COL_MAJOR
        mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, a_enum.sm90_mma_major_mode(), b_enum.sm90_mma_major_mode(),
            self.acc_dtype, (self.num_consumers, 1, 1), (WGMMA_M, bn))
        # One warpgroup's share: the accumulator layout its epilogue writes out.
        mma_wg = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, a_enum.sm90_mma_major_mode(), b_enum.sm90_mma_major_mode(),
            self.acc_dtype, (1, 1, 1), (WGMMA_M, bn))
        sA_layout = sm90_utils.make_smem_layout_a(a_enum, (bm, bn, self.a_block_k), self.dtype,
                                                  self.stages)
        sB_layout = sm90_utils.make_smem_layout_b(b_enum, self.tile, self.dtype, self.stages)
        sC_layout = sm90_utils.make_smem_layout_epi(self.out_dtype, LayoutEnum.ROW_MAJOR,
                                                    (WGMMA_M, bn), self.num_consumers)
        tma_a, m_rows, k_tiles = self._a_operand(a, self._stage(sA_layout))
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_b = tuple(cpasync.make_tiled_tma_atom(load, mB, self._stage(sB_layout), (bn, bk)))
        store = (cpasync.CopyReduceBulkTensorTileS2GOp() if self.spec.split == "atomic"
                 else cpasync.CopyBulkTensorTileS2GOp())
        tma_c = tuple(cpasync.make_tiled_tma_atom(store, mC, self._stage(sC_layout),
                                                  (WGMMA_M, bn)))
        fields = {
            "sA": shared_tile(self.dtype, sA_layout), "sB": shared_tile(self.dtype, sB_layout),
            "sC": shared_tile(self.out_dtype, sC_layout),
            "ring_bars": cute.struct.MemRange[cutlass.Int64, 2 * self.stages],
            # Serial split-K: each warpgroup's count at its tile's counter, for all its threads.
            "arrivals": cute.struct.MemRange[cutlass.Int32, self.num_consumers]}
        meta = t.meta
        if cutlass.const_expr(self.meta_slots > 0):
            meta = self._words_operand(meta)
            fields["sWords"] = cute.struct.Align[cute.struct.MemRange[
                cutlass.Int32, cute.cosize(self._words_layout())], 128]
            fields["words_bars"] = cute.struct.MemRange[cutlass.Int64, 2 * self.meta_slots]
        cluster = None
        if cutlass.const_expr(self.cluster):
            fields["sPartial"] = cute.struct.Align[cute.struct.MemRange[
                cutlass.Float32, cfg.partial_bytes() // 4], 16]
            cluster = [cfg.split_k, 1, 1]
        SharedStorage = shared_storage(fields)
        m_tiles = cute.ceil_div(m_rows, bm)
        n_tiles = cute.ceil_div(mB.shape[0], bn)
        epilogue = (t.scale_a, t.scale_b, t.zero_b, t.bias)
        self.kernel(tma_a, tma_b, tma_c, t.workspace, t.counters, epilogue, meta, mma, mma_wg,
                    sA_layout, sB_layout, sC_layout, SharedStorage, m_tiles, n_tiles, k_tiles,
                    t.num_splits, c).launch(
            grid=[t.num_ctas, 1, 1], block=[cfg.num_threads, 1, 1], cluster=cluster,
            stream=stream, min_blocks_per_mp=1, use_pdl=cfg.pdl)

    def _a_operand(self, a: cute.Tensor, a_stage) -> tuple:
        """A's TMA atom and coordinates (tiled by ``a_tiler``), the rows of C and the K
        tiles: here A is the ``[M, K]`` matrix itself (the implicit-GEMM convolution reads
        it from an image instead)."""
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma = tuple(cpasync.make_tiled_tma_atom(load, a, a_stage, self.a_tiler))
        return tma, a.shape[0], cute.ceil_div(a.shape[1], self.a_block_k)

    @staticmethod
    def _stage(staged_layout):
        """One stage of a staged shared-memory layout (what one TMA copy fills)."""
        return cute.slice_(staged_layout, (None, None, 0))

    def _words_tile(self) -> tuple[int, int]:
        """One TMA copy of metadata words: the tile's row blocks x one K group's words."""
        return self.cfg.block_m // 16, GROUP_WORDS

    def _words_layout(self, by_place: bool = False) -> cute.Layout:
        """The metadata ring in shared memory: ``(row block, word, slot)`` as the TMA unit
        fills it, or ``(row block, thread place, step, slot)`` (``by_place``) as threads
        read it; the words of a block's K group in ``wgmma_words``' order."""
        blocks, words = self._words_tile()
        slot = blocks * words
        if by_place:
            steps = WORDS_K // SPARSE_MMA_K
            return cute.make_layout((blocks, words // steps, steps, self.meta_slots),
                                    stride=(words, steps, 1, slot))
        return cute.make_layout((blocks, words, self.meta_slots), stride=(words, 1, slot))

    def _words_operand(self, meta: cute.Tensor) -> tuple:
        """The TMA atom and coordinates of the metadata words (``GemmArgs.meta``, contiguous)
        read as a row-major ``[row blocks, K groups x GROUP_WORDS]`` matrix, tiled by
        ``_words_tile``: a tile's words of K group ``g`` are its box ``(m, g)``."""
        rows = cute.make_tensor(meta.iterator, cute.make_layout(
            (meta.shape[0], meta.shape[1] * GROUP_WORDS), stride=(meta.stride[0], 1)))
        return tuple(cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), rows, self._stage(self._words_layout()),
            self._words_tile()))

    def _tma_ring(self, barriers, stages: int, tx_count: int):
        """A ring of ``stages`` that the producer thread fills by TMA (``tx_count`` bytes a
        stage) and each consumer warp releases."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers, num_stages=stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     4 * self.num_consumers),
            tx_count=tx_count, defer_sync=True)

    def _words_state(self, state: pipeline.PipelineState, first_phase: int
                     ) -> pipeline.PipelineState:
        """The metadata ring's state at the K tile of the A/B ring's ``state``: both rings
        advance once a K tile (so no second state is carried through the loops), the words'
        over ``meta_slots`` slots; ``first_phase``: the side's phase at count 0 (producer 1,
        consumer 0)."""
        # Unsigned: a count is never negative, and its division needs no floor correction.
        count = cutlass.Uint32(state.count)
        laps = count // self.meta_slots
        return pipeline.PipelineState(self.meta_slots, state.count,
                                      cutlass.Int32(count - laps * self.meta_slots),
                                      cutlass.Int32((laps + first_phase) % 2))

    # ----------------------------------------------------------------------------------------
    # Device side
    # ----------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, tma_a: tuple, tma_b: tuple, tma_c: tuple, workspace: cute.Tensor | None,
               counters: cute.Tensor | None, epilogue: tuple, meta: cute.Tensor | tuple | None,
               mma: cute.TiledMma,
               mma_wg: cute.TiledMma, sA_layout, sB_layout, sC_layout,
               SharedStorage: cutlass.Constexpr, m_tiles: cutlass.Int32,
               n_tiles: cutlass.Int32, k_tiles: cutlass.Int32, num_splits: cutlass.Int32,
               c: cute.Tensor):
        if cutlass.const_expr(self.cfg.pdl):
            # The next kernel may launch now: it waits for this grid's end before its first
            # global access, and meanwhile sets up on the SMs this grid leaves idle.
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        # The swizzle on the pointer: the form both the TMA partition and wgmma take.
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        ring = self._tma_ring(storage.ring_bars.data_ptr(), self.stages,
                              cute.size_in_bytes(self.dtype, self._stage(sA_layout))
                              + cute.size_in_bytes(self.dtype, self._stage(sB_layout)))
        # 2:4 sparse A's metadata: the words tensor, or with their ring the producer's (TMA
        # atom and coordinates, slots, ring) and the consumers' (slots by place, ring).
        words_in, words_out = meta, meta
        if cutlass.const_expr(self.meta_slots > 0):
            words_ring = self._tma_ring(storage.words_bars.data_ptr(), self.meta_slots,
                                        self.cfg.meta_bytes())
            sWords = storage.sWords.get_tensor(self._words_layout())
            words_in = (meta, sWords, words_ring)
            words_out = (cute.make_tensor(sWords.iterator, self._words_layout(by_place=True)),
                         words_ring)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(self.cfg.pdl):
            # Launched before the stream's previous kernel ended: nothing it writes (A, B,
            # the split-K partials and counters) is read, nor C written, before it has.
            cute.arch.griddepcontrol_wait()

        walk = (m_tiles, n_tiles, k_tiles, num_splits)
        if warp_idx // 4 == 0:
            cute.arch.warpgroup_reg_dealloc(PRODUCER_REGS[self.num_consumers])
            if warp_idx == 0:
                self._produce(tma_a, tma_b, sA, sB, ring, walk, words_in)
            if cutlass.const_expr(self.cluster):
                # Every thread of the cluster meets both of the meeting's barriers, rather
                # than leaning on the cluster barrier's waiving of threads that have exited.
                for _ in cutlass.range_constexpr(2):
                    cute.arch.cluster_arrive_relaxed()
                    cute.arch.cluster_wait()
        else:
            cute.arch.warpgroup_reg_alloc(CONSUMER_REGS[self.num_consumers])
            arrivals = storage.arrivals.get_tensor(cute.make_layout(self.num_consumers))
            partial = None
            if cutlass.const_expr(self.cluster):
                bm, bn, _ = self.tile
                partial = storage.sPartial.get_tensor(cute.make_layout(
                    (bm, bn), stride=(bn + PARTIAL_PAD, 1)))
            self._consume(tidx - WARPGROUP, mma, mma_wg, sA, sB, sC, tma_c, ring, walk,
                          (workspace, counters, arrivals), epilogue, words_out, (partial, c))

    def _items(self, walk: tuple):
        """This CTA's work items (``range`` arguments) and the K tiles of a slice. A cluster
        split's grid is its items, a tile's slices side by side (one cluster): CTA ``c``
        takes slice ``c % splits`` of tile ``c // splits``, and only that."""
        m_tiles, n_tiles, k_tiles, num_splits = walk
        first, _, _ = cute.arch.block_idx()
        stride, _, _ = cute.arch.grid_dim()
        items = m_tiles * n_tiles * num_splits
        if cutlass.const_expr(self.cluster):
            tile = first // num_splits
            first = (first - tile * num_splits) * m_tiles * n_tiles + tile
            stride = items
        return first, items, stride, k_tiles_per_split(k_tiles, num_splits)

    def _k_range(self, split, per_split, k_tiles):
        k0 = split * per_split
        return k0, cutlass.min(k0 + per_split, k_tiles)

    @cute.jit
    def _produce(self, tma_a: tuple, tma_b: tuple, sA: cute.Tensor, sB: cute.Tensor, ring,
                 walk: tuple, words: cute.Tensor | tuple | None):
        """The producer warp: A's and B's K tiles of every item, in the consumers' order, and
        with the metadata ring (``words``: its TMA atom and coordinates, slots and ring) each
        K tile's words, first (the consumers wait for them first)."""
        bm, bn, bk = self.tile
        m_tiles, n_tiles, k_tiles, _ = walk
        first, items, stride, per_split = self._items(walk)
        a_smem, a_gmem = self._tma_tiles(tma_a, sA, self.a_tiler)
        b_smem, b_gmem = self._tma_tiles(tma_b, sB, (bn, bk))
        if cutlass.const_expr(self.meta_slots > 0):
            tma_words, sWords, words_ring = words
            words_smem, words_gmem = self._tma_tiles(tma_words, sWords, self._words_tile())
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for item in cutlass.range(first, items, stride, unroll=1):
            m, n, split = tile_coords(item, m_tiles, n_tiles, self.cfg.raster_group)
            k0, k1 = self._k_range(split, per_split, k_tiles)
            for k in cutlass.range(k0, k1, unroll=1):
                ring.producer_acquire(state)
                if cutlass.const_expr(self.meta_slots > 0):
                    slot = self._words_state(state, first_phase=1)
                    words_ring.producer_acquire(slot)
                    cute.copy(tma_words[0], words_gmem[None, m, self._words_group(k)],
                              words_smem[None, slot.index],
                              tma_bar_ptr=words_ring.producer_get_barrier(slot))
                barrier = ring.producer_get_barrier(state)
                cute.copy(tma_a[0], a_gmem[None, m, k], a_smem[None, state.index],
                          tma_bar_ptr=barrier)
                cute.copy(tma_b[0], b_gmem[None, n, k], b_smem[None, state.index],
                          tma_bar_ptr=barrier)
                state.advance()

    @staticmethod
    def _tma_tiles(tma: tuple, smem: cute.Tensor, tile: tuple) -> tuple:
        """``(smem stages, global tiles)`` of an operand's TMA copies; a global tile is
        indexed by (row tile, K tile)."""
        atom, coords = tma
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                                     cute.group_modes(cute.local_tile(coords, tile,
                                                                      (None, None)), 0, 2))

    @cute.jit
    def _consume(self, ctidx, mma: cute.TiledMma, mma_wg: cute.TiledMma, sA: cute.Tensor,
                 sB: cute.Tensor, sC: cute.Tensor, tma_c: tuple, ring, walk: tuple,
                 serial: tuple, epilogue: tuple, meta: cute.Tensor | tuple | None,
                 cluster: tuple):
        """A consumer warpgroup: its 64 rows of every item's tile, then their epilogue
        (``serial``: the workspace, the tile counters and the warpgroups' arrival slots;
        ``epilogue``: INT8's scales and zero points, and the bias; ``meta``: 2:4 sparse A's
        metadata words in global memory, or their ring's slots by place and the ring;
        ``cluster``: the cluster split's partial tile and C)."""
        bm, bn, _ = self.tile
        m_tiles, n_tiles, k_tiles, _ = walk
        first, items, stride, per_split = self._items(walk)
        wg = cute.arch.make_warp_uniform(cute.arch.warp_idx()) // 4 - 1
        # Operand descriptors depend on the warpgroup only: sliced by a warp-uniform index.
        wg_mma = mma.get_slice(wg * WARPGROUP)
        tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA))
        tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB))
        acc = cute.make_rmem_tensor(mma.get_slice(ctidx).partition_shape_C((bm, bn)),
                                    self.acc_dtype)
        coords = mma.get_slice(ctidx).partition_C(cute.make_identity_tensor((bm, bn)))
        # INT8 with zero points: the row sums of A this thread's accumulator rows need.
        row_sums = None
        if cutlass.const_expr(self.spec.dequant == "scale_zero"):
            row_sums = cute.make_rmem_tensor((cute.size(acc_mn_view(coords), mode=[0]),),
                                             cutlass.Int32)
        # 2:4 sparse A: the metadata words, this thread's 16-row block of the tile (its warp's)
        # and its place among the block's 16 words (quad g's lane h, h = lane % 2: selector 0
        # reads lanes 0 and 1 of a quad), and a zero ptxas cannot see through (the grid is
        # one-dimensional; ``retire_words``).
        sparse = None
        if cutlass.const_expr(self.spec.sparse):
            wtidx = ctidx % WARPGROUP
            sparse = (meta, wg * WGMMA_M // 16 + wtidx // 32, wtidx % 32 // 4 * 2 + wtidx % 2,
                      cute.arch.block_idx()[2])
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        # The stage to release next: one behind ``state`` while a stage's MMAs are in flight.
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for item in cutlass.range(first, items, stride, unroll=1):
            m, n, split = tile_coords(item, m_tiles, n_tiles, self.cfg.raster_group)
            k0, k1 = self._k_range(split, per_split, k_tiles)
            acc.fill(0)
            if cutlass.const_expr(row_sums is not None):
                row_sums.fill(0)
            # The first K tile (every slice has one), then one stage's MMAs in flight while
            # the next stage is awaited.
            operands = (tCrA, tCrB, sA, coords)
            words = None
            if cutlass.const_expr(sparse is not None):
                words = self._metadata_words(sparse, m, k0, state)
            state = self._mma_stage(ring, state, mma, acc, operands, row_sums, words)
            for k in cutlass.range(k0 + 1, k1, unroll=1):
                if cutlass.const_expr(sparse is not None):
                    # wgmma.mma_async.sp reads its metadata register after it issues, and
                    # ptxas does not count that register as in flight: the next stage's
                    # words, loaded first (to land under the MMAs), replace a stage's only
                    # once its MMAs are waited for (``retire_words``); one stage in flight,
                    # as in CUTLASS's sparse mainloop.
                    loaded = self._metadata_words(sparse, m, k, state)
                    warpgroup.wait_group(0)
                    retire_words(words, sparse[3], loaded)
                    ring.consumer_release(release)
                    release.advance()
                    state = self._mma_stage(ring, state, mma, acc, operands, row_sums, words)
                else:
                    state = self._mma_stage(ring, state, mma, acc, operands, row_sums, words)
                    warpgroup.wait_group(1)
                    ring.consumer_release(release)
                    release.advance()
            warpgroup.wait_group(0)
            if cutlass.const_expr(sparse is not None):
                retire_words(words, sparse[3])
            ring.consumer_release(release)
            release.advance()
            if cutlass.const_expr(row_sums is not None):
                # The four lanes of a row each summed a quarter of its bytes.
                for r in cutlass.range_constexpr(cute.size(row_sums)):
                    for offset in (1, 2):
                        row_sums[r] = row_sums[r] + cute.arch.shuffle_sync_bfly(
                            row_sums[r], offset=offset)
            if cutlass.const_expr(self.cluster):
                self._meet_in_cluster(acc, coords, cluster, epilogue[3], m, n, ctidx)
            elif cutlass.const_expr(self.spec.split == "serial"):
                if self._count_in(acc, coords, serial, ctidx % WARPGROUP, wg, (m, n, split),
                                  walk):
                    self._epilogue(self._finish(acc, coords, epilogue, row_sums, m, n),
                                   sC, tma_c, mma_wg, ctidx % WARPGROUP, wg, m, n, 0)
            else:
                self._epilogue(self._finish(acc, coords, epilogue, row_sums, m, n), sC, tma_c,
                               mma_wg, ctidx % WARPGROUP, wg, m, n, split)
        if ctidx % WARPGROUP < 32:
            # Shared memory must outlive the last store's reads of it.
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _mma_stage(self, ring, state, mma: cute.TiledMma, acc: cute.Tensor, operands: tuple,
                   row_sums, words):
        """Wait for ``state``'s stage, issue its MMAs (not waited for), and while they run
        add the stage's A bytes into ``row_sums`` (if not None); returns the advanced state
        (a jit function's changes to its arguments do not reach a caller's loop).
        ``operands``: the stages' descriptors of A and B, A's stages, the accumulator's
        coordinates; ``words``: 2:4 sparse A's metadata words of the stage (else None)."""
        tCrA, tCrB, sA, coords = operands
        ring.consumer_wait(state)
        stage = uniform_stage(state)
        if cutlass.const_expr(words is not None):
            self._sparse_wgmma(acc, tCrA[None, None, None, stage],
                               tCrB[None, None, None, stage], words)
        else:
            wgmma_gemm(mma, acc, tCrA[None, None, None, stage], tCrB[None, None, None, stage],
                       zero_init=False, wait=False)
        if cutlass.const_expr(row_sums is not None):
            self._add_row_bytes(sA[None, None, stage], coords, row_sums)
        state.advance()
        return state

    @cute.jit
    def _metadata_words(self, sparse: tuple, m, k, state) -> cute.Tensor:
        """This thread's metadata words of K tile ``k`` (the A/B ring's ``state``) of row
        block ``m``, one per 32-deep step, as one vector load: from the words' ring (its slot
        waited for, and handed back once the warp holds its words) or from the words'
        layout in global memory (``attnlab.gemm.sparse.wgmma_words``, ``[row blocks of 16,
        K groups of 128, 16, 4]``, padding past M)."""
        source, block, place, _ = sparse
        bm, _, bk = self.tile
        steps = bk // SPARSE_MMA_K
        words = cute.make_rmem_tensor((steps,), cutlass.Int32)
        if cutlass.const_expr(self.meta_slots > 0):
            slots, words_ring = source
            slot = self._words_state(state, first_phase=0)
            words_ring.consumer_wait(slot)
            cute.autovec_copy(self._step_words(slots[block, place, None, slot.index], k),
                              words)
            # Every lane's read before the slot goes back to the TMA unit (one lane arrives).
            cute.arch.sync_warp()
            words_ring.consumer_release(slot)
        else:
            row_block = m * (bm // 16) + block
            if row_block < source.shape[0]:
                cute.autovec_copy(self._step_words(
                    source[row_block, self._words_group(k), place, None], k), words)
            else:
                words.fill(PAD_META | PAD_META << 16)
        return words

    def _words_group(self, k):
        """The K group of words that K tile ``k`` lies in."""
        return k * self.cfg.block_k // WORDS_K

    def _step_words(self, place_words: cute.Tensor, k) -> cute.Tensor:
        """K tile ``k``'s words among a thread place's words of its K group: all of them at a
        128-deep K step, half at a 64-deep one."""
        bk = self.cfg.block_k
        return cute.local_tile(place_words, (bk // SPARSE_MMA_K,), (k % (WORDS_K // bk),))

    @cute.jit
    def _sparse_wgmma(self, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
                      words: cute.Tensor):
        """One stage of 2:4 sparse A as one commit group: per 32-deep step, A's compressed
        k16 block ``step`` against B's 32 rows from its k16 block ``2 step``."""
        ptx_dtype = "bf16" if self.dtype == cutlass.BFloat16 else "f16"
        warpgroup.fence()
        for step in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            d = wgmma_sp([acc[i] for i in range(cute.size(acc))],
                         smem_descriptor(tCrA[None, None, step]),
                         smem_descriptor(tCrB[None, None, 2 * step]), words[step],
                         self.cfg.block_n, ptx_dtype, self.spec.b_major == "n")
            for i in cutlass.range_constexpr(cute.size(acc)):
                acc[i] = d[i]
        warpgroup.commit_group()

    @cute.jit
    def _add_row_bytes(self, sA: cute.Tensor, coords: cute.Tensor, row_sums: cute.Tensor):
        """Add the int8 values of one K tile's rows of A (``sA``, rows x ``block_k`` bytes)
        that this thread's accumulator holds into ``row_sums``: the four lanes that share a
        row take a quarter of its bytes each (8 at ``block_k`` 32), up to 16 at a time (one
        shared-memory vector, then a ``dp4a`` per 4 bytes)."""
        per_lane = self.cfg.block_k // 4
        width = min(16, per_lane)
        chunks = per_lane // width
        quarter = cute.arch.lane_idx() % 4
        coords_mn = acc_mn_view(coords)
        values = cute.make_rmem_tensor((width,), self.dtype)
        words = cute.recast_tensor(values, cutlass.Int32)
        for r in cutlass.range_constexpr(cute.size(row_sums)):
            row = coords_mn[r, 0][0]
            for h in cutlass.range_constexpr(chunks):
                cute.autovec_copy(cute.local_tile(sA[row, None], (width,),
                                                  (quarter * chunks + h,)), values)
                for w in cutlass.range_constexpr(width // 4):
                    row_sums[r] = add_s8x4(words[w], row_sums[r])

    @cute.jit
    def _finish(self, acc: cute.Tensor, coords: cute.Tensor, epilogue: tuple, row_sums, m, n
                ) -> cute.Tensor:
        """A tile's sums as C takes them: dequantized (INT8; ``row_sums``: A's row sums
        for the zero points), with the bias added."""
        out = acc
        if cutlass.const_expr(self.spec.dequant != "none"):
            out = self._dequantize(acc, coords, epilogue, row_sums, m, n)
        if cutlass.const_expr(self.spec.bias):
            # fp32 here: the HGEMM's accumulator, or INT8's dequantized tile.
            out = self._add_bias(out, coords, epilogue[3], n)
        return out

    @cute.jit
    def _add_bias(self, acc: cute.Tensor, coords: cute.Tensor, bias: cute.Tensor, n
                  ) -> cute.Tensor:
        """``acc[i, j] + bias[j]`` in fp32, in place (no fp32 copy of the tile beside it):
        each of the thread's ``block_n / 4`` columns' bias loaded once (``acc_mn_view``),
        none past N."""
        first_col = n * self.cfg.block_n
        cols_left = bias.shape[0] - first_col
        acc_mn, coords_mn = acc_mn_view(acc), acc_mn_view(coords)
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            col = coords_mn[0, c][1]
            value = cutlass.Float32(0.0)
            if col < cols_left:
                value = cutlass.Float32(bias[first_col + col])
            for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
                acc_mn[r, c] = acc_mn[r, c] + value
        return acc

    @cute.jit
    def _dequantize(self, acc: cute.Tensor, coords: cute.Tensor, dequant: tuple, row_sums,
                    m, n) -> cute.Tensor:
        """INT8's epilogue math: ``scale_a[i] * scale_b[j] * (acc - zero_b[j] * sum_k
        a_q[i, k])`` (the zero-point term with ``dequant="scale_zero"``, its row sums
        ``row_sums`` summed from A's tiles in shared memory), in fp32. A thread's accumulator
        spans two rows and ``block_n / 4`` columns, so each row's and each column's factors
        are loaded once (``acc_mn_view``); rows and columns past M and N read none (their
        values are clipped by the store)."""
        scale_a, scale_b, zero_b, _ = dequant
        bm, bn, _ = self.tile
        first_row, first_col = m * bm, n * bn
        rows_left = scale_a.shape[0] - first_row
        cols_left = scale_b.shape[0] - first_col
        out = cute.make_fragment_like(acc, cutlass.Float32)
        out.store(acc.load().to(cutlass.Float32))
        out_mn, coords_mn = acc_mn_view(out), acc_mn_view(coords)
        rows = cute.size(out_mn, mode=[0])
        row_scale = cute.make_rmem_tensor((rows,), cutlass.Float32)
        row_sum = cute.make_rmem_tensor((rows,), cutlass.Float32)
        for r in cutlass.range_constexpr(rows):
            row = coords_mn[r, 0][0]
            row_scale[r] = cutlass.Float32(0.0)
            row_sum[r] = cutlass.Float32(0.0)
            if row < rows_left:
                row_scale[r] = scale_a[first_row + row]
                if cutlass.const_expr(self.spec.dequant == "scale_zero"):
                    row_sum[r] = cutlass.Float32(row_sums[r])
        for c in cutlass.range_constexpr(cute.size(out_mn, mode=[1])):
            col = coords_mn[0, c][1]
            col_scale = cutlass.Float32(0.0)
            zero = cutlass.Float32(0.0)
            if col < cols_left:
                col_scale = scale_b[first_col + col]
                if cutlass.const_expr(self.spec.dequant == "scale_zero"):
                    zero = zero_b[first_col + col]
            for r in cutlass.range_constexpr(rows):
                out_mn[r, c] = row_scale[r] * col_scale * (out_mn[r, c] - zero * row_sum[r])
        return out

    @cute.jit
    def _meet_in_cluster(self, acc: cute.Tensor, coords: cute.Tensor, cluster: tuple,
                         bias: cute.Tensor | None, m, n, ctidx):
        """The cluster split's meeting (``kernels/gemm/cluster_split.py``): this slice's
        partials staged, the cluster barrier, this slice's band of rows summed over every
        slice (plus the bias) and stored, and a barrier that keeps the partials until all
        have read them (the producer warpgroup meets both barriers too)."""
        partial, c = cluster
        stage_partials(acc, coords, partial)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        sum_band(partial, c, bias, m, n, ctidx, WARPGROUP * self.num_consumers,
                 self.cfg.split_k)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()

    @cute.jit
    def _count_in(self, acc: cute.Tensor, coords: cute.Tensor, serial: tuple, wtidx, wg,
                  item: tuple, walk: tuple) -> cutlass.Boolean:
        """Serial split-K: store this slice's partial sums, count in at the tile's counter;
        the slice that counts last sums the tile's partials into ``acc`` in split order
        (deterministic: the same sums whichever slice is last), resets the counter and
        returns True."""
        workspace, counters, arrivals = serial
        m, n, split = item
        m_tiles, n_tiles, _, num_splits = walk
        counter = (m * n_tiles + n) * self.num_consumers + wg
        self._partial(acc, coords, workspace, m, n, split, load=False)
        last = count_in(counters, counter, arrivals, wg, wtidx == 0, num_splits - 1,
                        NamedBarrier.GEMM_EPILOGUE, WARPGROUP, wg)
        if last:
            if num_splits == 2:
                # The other slice's partials onto this one's registers: one L2 round trip, and
                # the same sum as in split order (two terms commute exactly).
                self._partial(acc, coords, workspace, m, n, 1 - split, load=True)
            else:
                # Every slice's partials read back, its own too (the values its registers
                # hold), in a branch-free loop unrolled by four: four slices' loads in flight
                # where one slice's at a time waited out an L2 round trip each.
                total = cute.make_fragment_like(acc)
                total.fill(0.0)
                for s in cutlass.range(num_splits, unroll=4):
                    self._partial(total, coords, workspace, m, n, s, load=True)
                acc.store(total.load())
            if wtidx == 0:
                counters[counter] = 0
        return last

    @cute.jit
    def _partial(self, acc: cute.Tensor, coords: cute.Tensor, workspace: cute.Tensor, m, n,
                 split, load: cutlass.Constexpr):
        """``acc`` (this thread's accumulator of tile ``(m, n)``) stored to
        ``workspace[split]``, or with ``load`` the slice's partials added to it; column pairs
        (8-byte accesses), the tile's rows and columns past M and N left alone."""
        bm, bn, _ = self.tile
        rows_left = workspace.shape[1] - m * bm
        cols_left = workspace.shape[2] - n * bn
        tile = cute.local_tile(workspace[split, None, None], (bm, bn), (m, n))
        pair = cute.make_rmem_tensor((2,), cutlass.Float32)
        for i in cutlass.range_constexpr(cute.size(acc) // 2):
            row, col = coords[2 * i]
            if row < rows_left:
                if col < cols_left:
                    dst = cute.local_tile(tile[row, None], (2,), (col // 2,))
                    if cutlass.const_expr(load):
                        pair.store(dst.load())
                        acc[2 * i] = acc[2 * i] + pair[0]
                        acc[2 * i + 1] = acc[2 * i + 1] + pair[1]
                    else:
                        pair[0] = acc[2 * i]
                        pair[1] = acc[2 * i + 1]
                        dst.store(pair.load())

    @cute.jit
    def _epilogue(self, acc: cute.Tensor, sC: cute.Tensor, tma_c: tuple,
                  mma_wg: cute.TiledMma, wtidx, wg, m, n, split):
        """This warpgroup's 64 rows: converted, staged in its slice of ``sC``, then one TMA
        store (or reduce-add) issued by its first warp."""
        bn = self.cfg.block_n
        first_warp = wtidx < 32
        if first_warp:
            # The slice's previous store must have read it.
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        NamedBarrier.GEMM_EPILOGUE.sync(WARPGROUP, wg)
        rC = cute.make_fragment_like(acc, self.out_dtype)
        rC.store(acc.load().to(self.out_dtype))
        store_fragment(rC, sC[None, None, wg], mma_wg, wtidx)
        # Generic-proxy writes, read next by the TMA unit (async proxy).
        cute.arch.fence_proxy("async.shared", space="cta")
        NamedBarrier.GEMM_EPILOGUE.sync(WARPGROUP, wg)
        if first_warp:
            atom, coords = tma_c
            boxes = cute.local_tile(coords[None, None, split], (WGMMA_M, bn), (None, None))
            src, dst = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                             cute.group_modes(sC, 0, 2),
                                             cute.group_modes(boxes, 0, 2))
            cute.copy(atom, src[None, wg], dst[None, m * self.num_consumers + wg, n])
            cute.arch.cp_async_bulk_commit_group()
