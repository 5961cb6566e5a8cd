"""HGEMM with ``mma.sync`` (sm80 and newer): the lab's HGEMM steps as knobs of one kernel
(an ``MmaGemmConfig`` in a ``GemmSpec``).

``C = A @ B`` for a K-major A ``[M, K]`` and a K-major B (a transposed ``[N, K]`` weight), one
``block_m x block_n`` tile per CTA, split over a ``warps_m x warps_n`` grid of warps issuing
m16n8k16 MMAs. What the knobs change, in the lab's order:

* ``smem=False`` (the lab's starting point): every thread loads its MMA fragments straight
  from global memory, each element once per warp that needs it.
* ``smem``: the CTA's A and B tiles are copied to shared memory once per K step (16-byte
  copies, ``row_copy``) and the warps read their fragments there; ``ldmatrix`` reads a warp's
  8x8 fragments in one instruction instead of one 32-bit load per value pair.
* ``async_copy`` / ``stages``: ``cp.async`` copies skip the registers, and a ``stages``-deep
  ring issues K step ``k + stages - 1`` before computing step ``k`` (2: the lab's double
  buffering).
* ``warps_m x warps_n`` and the tile: 16 warps on 128 x 128 (the lab's canonical kernel), or
  128 x 256 (each warp's accumulator twice as wide).
* ``swizzle``: ``pad8`` (+8 halves a row, the lab's layout) or ``xor``, against ``none``'s
  8-way ``ldmatrix`` conflicts (``layouts.smem_tile_layout``).
* ``smem_epilogue``: C staged in shared memory and written by 16-byte row copies, instead of
  each thread's column pairs.

With ``GemmSpec.sparse`` A is 2:4 structured-sparse (the lab's Observation N): A's tiles hold
only its kept halves (``block_k / 2`` columns), and each 32-deep K step is one ``mma.sp``
m16n8k32 per 16 x 8 output block instead of two m16n8k16: half of A's bytes and half of the
MMAs. A's compressed 16 x 16 fragment is the dense m16n8k16 A fragment of the kept halves, B's
32 x 8 fragment two dense k16 ones, so the dense tiled MMA partitions both; the MMA itself is
inline PTX (CuTe DSL 4.8.1's sparse warp atom does not build, ``docs/gemm.md``), and each
thread pair (selector 0: lanes 0 and 1 of each quad) passes the metadata of its rows g and
g + 8 over one 16-column half of the step.

Shapes are whole tiles (``attnlab.gemm.ladder`` checks): this kernel is the ladder's subject,
not a dispatch target; the sm_90a kernel serves calls.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from attnlab.kernels.common.base import shared_storage
from attnlab.kernels.common.epilogue import store_fragment, store_rows
from attnlab.kernels.common.layouts import COPY_BITS, row_copy, smem_tile_layout
from attnlab.kernels.gemm.abi import META_COLUMNS, SPARSE_MMA_K, GemmArgs, GemmSpec
from attnlab.kernels.gemm.base import GemmKernel
from attnlab.kernels.gemm.online_int8 import online_int8_mmas
from attnlab.kernels.gemm.ptx_mma import mma_sp_16832

#: m16n8k16: the MMA's shape; a tiled MMA's N is 16 so one ldmatrix.x4 feeds two n8 MMAs.
MMA_SHAPE = (16, 8, 16)


class HgemmSm80(GemmKernel):
    """Compile-time description of one ``mma.sync`` HGEMM (a ``GemmSpec`` of an
    ``MmaGemmConfig``)."""

    def __init__(self, spec: GemmSpec):
        if spec.a_major != "k" or spec.b_major != "k":
            raise ValueError("the mma.sync HGEMM takes K-major A and B (B as w.t())")
        super().__init__(spec)

    def launch(self, t: GemmArgs, stream: cuda.CUstream):
        """Layouts, copies and the tiled MMA of the config, then one CTA per tile (split-K's
        and INT8's arguments unused; the metadata with 2:4 sparse A)."""
        a, b, c = t.a, t.b, t.c
        cfg = self.cfg
        mB = cute.make_tensor(b.iterator, cute.select(b.layout, mode=[1, 0]))
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, cutlass.Float32, MMA_SHAPE),
            (cfg.warps_m, cfg.warps_n, 1),
            permutation_mnk=(cfg.warps_m * 16, cfg.warps_n * 16, 16))
        fields = {}
        sA_layout = sB_layout = sC_layout = None
        if cutlass.const_expr(cfg.smem):
            sA_layout = smem_tile_layout(cfg.swizzle, cfg.block_m, self.a_block_k, cfg.stages)
            sB_layout = smem_tile_layout(cfg.swizzle, cfg.block_n, cfg.block_k, cfg.stages)
            fields["sA"] = cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(sA_layout)], 128]
            fields["sB"] = cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(sB_layout)], 128]
        if cutlass.const_expr(cfg.smem_epilogue):
            sC_layout = smem_tile_layout(cfg.swizzle, cfg.block_m, cfg.block_n)
            fields["sC"] = cute.struct.Align[
                cute.struct.MemRange[self.out_dtype, cute.cosize(sC_layout)], 128]
        q_layouts = None
        if cutlass.const_expr(self.spec.online_int8):
            # The int8 tiles as 16-bit pairs (what ldmatrix reads), and a scale per row.
            q_layouts = (smem_tile_layout("xor", cfg.block_m, cfg.block_k // 2),
                         smem_tile_layout("xor", cfg.block_n, cfg.block_k // 2))
            fields["qA"] = cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(q_layouts[0])], 128]
            fields["qB"] = cute.struct.Align[
                cute.struct.MemRange[self.dtype, cute.cosize(q_layouts[1])], 128]
            fields["scale_a"] = cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, cfg.block_m], 16]
            fields["scale_b"] = cute.struct.Align[
                cute.struct.MemRange[cutlass.Float32, cfg.block_n], 16]
        load_op = (cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL)
                   if cfg.async_copy else cute.nvgpu.CopyUniversalOp())
        load_atom = cute.make_copy_atom(load_op, self.dtype, num_bits_per_copy=COPY_BITS)
        gmem_load = row_copy(load_atom, cfg.num_threads, cfg.block_k)
        gmem_load_a = row_copy(load_atom, cfg.num_threads, self.a_block_k)
        gmem_store = row_copy(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(),
                                                  self.out_dtype, num_bits_per_copy=COPY_BITS),
                              cfg.num_threads, cfg.block_n)
        SharedStorage = shared_storage(fields) if fields else None
        self.kernel(a, mB, c, t.meta, tiled_mma, (gmem_load_a, gmem_load), gmem_store,
                    sA_layout, sB_layout, sC_layout, q_layouts, SharedStorage).launch(
            grid=[cute.ceil_div(c.shape[0], cfg.block_m), cute.ceil_div(c.shape[1], cfg.block_n),
                  1],
            block=[cfg.num_threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mE: cute.Tensor | None,
               tiled_mma: cute.TiledMma, gmem_loads: tuple, gmem_store: cute.TiledCopy,
               sA_layout, sB_layout, sC_layout, q_layouts, SharedStorage: cutlass.Constexpr):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        m, n, _ = cute.arch.block_idx()
        gA = self._a_tiles(mA, m)
        gB = cute.local_tile(mB, (cfg.block_n, cfg.block_k), (n, None))
        gC = cute.local_tile(mC, (cfg.block_m, cfg.block_n), (m, n))
        thr_mma = tiled_mma.get_slice(tidx)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((cfg.block_m, cfg.block_n)),
                                    cutlass.Float32)
        acc.fill(0.0)
        storage = None
        if cutlass.const_expr(SharedStorage is not None):
            storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        if cutlass.const_expr(cfg.smem):
            sA = storage.sA.get_tensor(sA_layout)
            sB = storage.sB.get_tensor(sB_layout)
            quant = None
            if cutlass.const_expr(self.spec.online_int8):
                quant = (storage.qA.get_tensor(q_layouts[0])[None, None, 0],
                         storage.qB.get_tensor(q_layouts[1])[None, None, 0],
                         storage.scale_a.get_tensor(cute.make_layout(cfg.block_m)),
                         storage.scale_b.get_tensor(cute.make_layout(cfg.block_n)))
            self._mainloop_smem(gA, gB, sA, sB, tiled_mma, thr_mma, gmem_loads, acc, tidx,
                                (mE, m, quant))
        else:
            self._mainloop_global(gA, gB, tiled_mma, thr_mma, acc)
        rC = cute.make_fragment_like(acc, self.out_dtype)
        rC.store(acc.load().to(self.out_dtype))
        if cutlass.const_expr(cfg.smem_epilogue):
            sC = storage.sC.get_tensor(sC_layout)[None, None, 0]
            store_fragment(rC, sC, tiled_mma, tidx)
            store_rows(gmem_store, sC, gC, tidx, cfg.block_m, cute.arch.sync_threads)
        else:
            # A thread's values are column pairs: one 32-bit store each.
            cute.autovec_copy(rC, thr_mma.partition_C(gC))

    def _a_tiles(self, mA: cute.Tensor, m):
        """A's source for the CTA's row block ``m``: its K tiles ``(block_m, block_k, k)``
        (the implicit-GEMM convolution gathers them from an image instead)."""
        return cute.local_tile(mA, (self.cfg.block_m, self.a_block_k), (m, None))

    def _a_loads(self, thr_load, gA, sA: cute.Tensor) -> tuple:
        """This thread's part of A's copies (source, shared stages) and the K tiles."""
        return (thr_load.partition_S(gA), thr_load.partition_D(sA)), cute.size(gA, mode=[2])

    @cute.jit
    def _load_a(self, gmem_load: cute.TiledCopy, a_load: tuple, k, stage):
        """A's K tile ``k`` into ring stage ``stage``."""
        src, dst = a_load
        cute.copy(gmem_load, src[None, None, None, k], dst[None, None, None, stage])

    @cute.jit
    def _mainloop_global(self, gA: cute.Tensor, gB: cute.Tensor, tiled_mma: cute.TiledMma,
                         thr_mma, acc: cute.Tensor):
        """The lab's first step: each K step's fragments loaded from global memory."""
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCrA = thr_mma.make_fragment_A(tCgA[None, None, None, 0])
        tCrB = thr_mma.make_fragment_B(tCgB[None, None, None, 0])
        for k in cutlass.range(cute.size(gA, mode=[2]), unroll=1):
            cute.autovec_copy(tCgA[None, None, None, k], tCrA)
            cute.autovec_copy(tCgB[None, None, None, k], tCrB)
            cute.gemm(tiled_mma, acc, tCrA, tCrB, acc)

    @cute.jit
    def _mainloop_smem(self, gA: cute.Tensor, gB: cute.Tensor, sA: cute.Tensor,
                       sB: cute.Tensor, tiled_mma: cute.TiledMma, thr_mma,
                       gmem_loads: tuple, acc: cute.Tensor, tidx, side: tuple):
        """Tiles through a ``stages``-deep shared-memory ring, fragments from there
        (``gmem_loads``: A's tiled copy and B's; ``side``: the 2:4 metadata and the CTA's
        row block, and online INT8's tiles and scales in shared memory)."""
        cfg = self.cfg
        gmem_load_a, gmem_load = gmem_loads
        thr_load = gmem_load.get_slice(tidx)
        a_load, k_tiles = self._a_loads(gmem_load_a.get_slice(tidx), gA, sA)
        loads = (a_load, (thr_load.partition_S(gB), thr_load.partition_D(sB)))
        tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA[None, None, 0]))
        tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB[None, None, 0]))
        if cutlass.const_expr(cfg.ldmatrix):
            atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                       self.dtype)
        else:
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                       num_bits_per_copy=32)
        atom_b = atom
        if cutlass.const_expr(cfg.ldmatrix and self.spec.sparse):
            # One n8 block's k16 pair per ldmatrix: mma.sp's B takes two such pairs as one
            # register quad, which an x4 spanning two n8 blocks would leave to 4 moves each.
            atom_b = cute.make_copy_atom(
                warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=2), self.dtype)
        s2r = [cute.make_tiled_copy_A(atom, tiled_mma).get_slice(tidx),
               cute.make_tiled_copy_B(atom_b, tiled_mma).get_slice(tidx)]
        frags = ((s2r[0].partition_S(sA), s2r[0].retile(tCrA)),
                 (s2r[1].partition_S(sB), s2r[1].retile(tCrB)))
        stages = cfg.stages
        for s in cutlass.range_constexpr(stages - 1):
            if s < k_tiles:
                self._load_tile(gmem_loads, loads, s, s)
            self._commit()
        tCcA = thr_mma.partition_A(cute.make_identity_tensor((cfg.block_m, self.a_block_k)))
        for k in cutlass.range(k_tiles, unroll=1):
            words = None
            if cutlass.const_expr(self.spec.sparse):
                # Global loads, issued before the wait so they overlap it.
                words = self._sparse_metadata(side[:2], tCcA, k, tidx)
            if cutlass.const_expr(stages == 1):
                self._load_tile(gmem_loads, loads, k, 0)
                self._commit()
                self._wait(0)
            else:
                self._wait(stages - 2)
            # The tile has landed for every thread; every thread is past its reads of the
            # stage the next load overwrites (read in the previous iteration).
            cute.arch.sync_threads()
            if cutlass.const_expr(stages > 1):
                ahead = k + stages - 1
                if ahead < k_tiles:
                    self._load_tile(gmem_loads, loads, ahead, ahead % stages)
                self._commit()
            stage = k % stages
            if cutlass.const_expr(self.spec.sparse):
                self._sparse_mmas(frags, s2r, tCrA, tCrB, acc, stage, words)
            elif cutlass.const_expr(self.spec.online_int8):
                online_int8_mmas((sA[None, None, stage], sB[None, None, stage]), side[2],
                                 thr_mma, s2r, acc, cfg.num_threads, tidx)
            else:
                for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                    for (src, dst), s2r_copy in zip(frags, s2r, strict=True):
                        cute.copy(s2r_copy, src[None, None, kb, stage], dst[None, None, kb])
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
            if cutlass.const_expr(stages == 1):
                cute.arch.sync_threads()

    @cute.jit
    def _sparse_metadata(self, meta: tuple, tCcA: cute.Tensor, k, tidx) -> cute.Tensor:
        """This thread's metadata words of K tile ``k``, one per (M atom, 32-deep step): the
        16-bit groups of its rows g (low half) and g + 8 (high half) over the step's first
        16 columns (lane 0 of a quad) or its last 16 (lane 1; lanes 2 and 3 load lane 0's and
        1's, which the MMA ignores under selector 0)."""
        mE, m = meta
        cfg = self.cfg
        steps = cfg.block_k // SPARSE_MMA_K
        words = cute.make_rmem_tensor((cute.size(tCcA, mode=[1]), steps), cutlass.Int32)
        half = tidx % 2
        for i in cutlass.range_constexpr(cute.size(tCcA, mode=[1])):
            row = m * cfg.block_m + tCcA[0, i, 0][0]
            for step in cutlass.range_constexpr(steps):
                col = (k * cfg.block_k + step * SPARSE_MMA_K) // META_COLUMNS + half
                low = cutlass.Int32(mE[row, col]) & 0xFFFF
                high = cutlass.Int32(mE[row + 8, col]) & 0xFFFF
                words[i, step] = low | (high << 16)
        return words

    @cute.jit
    def _sparse_mmas(self, frags: tuple, s2r: list, tCrA: cute.Tensor, tCrB: cute.Tensor,
                     acc: cute.Tensor, stage, words: cute.Tensor):
        """One K tile of 2:4 sparse A: per 32-deep step, A's compressed K block ``step`` and
        B's K blocks ``2 step`` and ``2 step + 1`` to registers, then one ``mma.sp`` per
        16 x 8 output block."""
        (a_src, a_dst), (b_src, b_dst) = frags
        ptx_dtype = "bf16" if self.dtype == cutlass.BFloat16 else "f16"
        for step in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.copy(s2r[0], a_src[None, None, step, stage], a_dst[None, None, step])
            for kb in cutlass.range_constexpr(2 * step, 2 * step + 2):
                cute.copy(s2r[1], b_src[None, None, kb, stage], b_dst[None, None, kb])
            for i in cutlass.range_constexpr(cute.size(acc, mode=[1])):
                a = cute.recast_tensor(tCrA[None, i, step], cutlass.Int32)
                for j in cutlass.range_constexpr(cute.size(acc, mode=[2])):
                    b = [cute.recast_tensor(tCrB[None, j, kb], cutlass.Int32)
                         for kb in (2 * step, 2 * step + 1)]
                    c = acc[None, i, j]
                    d = mma_sp_16832([a[w] for w in range(4)],
                                     [b[w // 2][w % 2] for w in range(4)],
                                     [c[v] for v in range(4)], words[i, step], ptx_dtype)
                    for v in cutlass.range_constexpr(4):
                        c[v] = d[v]

    def _load_tile(self, gmem_loads: tuple, loads: tuple, k, stage) -> None:
        """K tile ``k`` of A and B into ring stage ``stage`` (``gmem_loads``: their tiled
        copies)."""
        a_load, (src, dst) = loads
        self._load_a(gmem_loads[0], a_load, k, stage)
        cute.copy(gmem_loads[1], src[None, None, None, k], dst[None, None, None, stage])

    def _commit(self) -> None:
        if cutlass.const_expr(self.cfg.async_copy):
            cute.arch.cp_async_commit_group()

    def _wait(self, pending: int) -> None:
        if cutlass.const_expr(self.cfg.async_copy):
            cute.arch.cp_async_wait_group(pending)
