"""Split-KV decoding over a KV cache (FlashDecoding), ``mma.sync`` + ``cp.async`` for sm80+.

Decoding attends a few query rows to a long cache: the work is reading K and V once, so the
kernel is built for bandwidth, not for tensor-core rate.

* **Pack-GQA**: the query heads that share a K/V head become the rows of one tile (packed row
  ``r`` is query position ``r // group`` of head ``kv_head * group + r % group``), so each K
  and V byte is read once per group, not once per query head. A tile is 16 rows, one
  ``mma.sync`` row block; more packed rows take more tiles.
* **Split-KV** (the seed lab's split experiment, on the regime where it wins): a grid of
  (query tile, sequence x K/V head, split); each split walks its own range of K/V blocks and
  writes an fp32 partial output and LSE, which ``decode_combine.py`` merges. One split writes
  the output directly.
* **Loads before the length** (a contiguous cache, no window): split ``s`` walks blocks
  ``s, s + num_splits, ...``, so its first blocks' copies (bounded by the capacity) go out
  while the length is on its way; rows they bring past it are zeroed in V (masked in S). A
  paged cache read 0.3-4 % slower so: it keeps ranges and loads the length first.
* **Within a CTA** the four warps split each K/V block by keys (``keys_per_warp`` each),
  every warp running its own online softmax over its keys; at the end they merge through
  shared memory by their LSEs, the same merge as the splits'.
* **Gathered rows**: every K/V row is copied by ``cp.async`` from an address computed per
  row, so a paged cache (row ``p`` of sequence ``b`` lives at page ``block_table[b, p //
  page_size]``, row ``p % page_size``) and a contiguous one (``cache_batch_idx``) take the
  same path; blocks of ``kv_stages`` are in flight while the warps compute. A row's offset
  is computed once for K and V where their strides agree (``DecodeSpec.v_strides`` off).
* **K/V by the TMA unit** (``DecodeSpec.tma_rows``, sm_90a): one thread of warp 0 issues each
  block as boxes of a block or of a page on the stage's transaction barrier, instead of
  every thread copying its rows (``decode_tma.py``).
* **PDL** (programmatic dependent launch, sm_90): the kernel and the combine launch before
  the stream's previous kernel has ended and wait for it (``griddepcontrol.wait``) before
  reading anything; a split decoding lets the combine launch once past its K/V walk.
* **Cluster merge** (``DecodeSpec.cluster_splits``, sm_90a): a query tile's splits are one
  cluster's CTAs. Each stages its rows (merged over its warps) in shared memory; after the
  cluster barrier the threads deal out the tile's (row, 4 columns) items, each merged from
  every peer's (``ld.shared::cluster``) and written; a second barrier keeps the rows until
  all have read them. No partials, no counter, no second kernel.
* **Serial merge** (``DecodeSpec.serial_merge``): each split counts in at its query tile's
  counter once its partial is written, and the last merges the tile's partials and resets
  the counter (GEMM's serial split-K): one launch a call instead of two, paid for by a merge
  at the last split's end, short while a tile has few splits.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warp

from attnlab.kernels.abi import DECODE_WARPS, DecodeArgs, DecodeSpec
from attnlab.kernels.common import decode_tma
from attnlab.kernels.common.barriers import NamedBarrier, count_in
from attnlab.kernels.common.base import shared_storage, shared_tile
from attnlab.kernels.common.decode_combine import VEC, merge_splits
from attnlab.kernels.common.decode_tma import BoxLoads, make_box_loads
from attnlab.kernels.common.dsmem import load_peer_f32, load_peer_v4
from attnlab.kernels.common.epilogue import store_fragment
from attnlab.kernels.common.layouts import (
    COPY_BITS,
    acc_as_operand_a,
    acc_mn_view,
    row_copy,
    smem_tile_layout,
    tma_swizzle,
    transposed,
)
from attnlab.kernels.common.softmax import OnlineSoftmax
from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.sm80.ldmatrix_gemm import gemm

#: Packed query rows per tile: one mma.sync row block.
TILE_ROWS = 16
#: ldmatrix fragments per load, double buffered (the forward's schedule).
FRAGS = 2
THREADS = 32 * DECODE_WARPS
#: Splits whose partials a serial merge's thread has in flight at once.
MERGE_SPLITS = 16
#: fp32 padding of each row of the warps' staged outputs, where the K ring holds it. A warp's
#: accumulator store (8-byte column pairs) takes two half-warp phases of 4 rows each; rows of
#: 64-256 floats start on the same bank, so each phase is 4 wavefronts; 8 floats more a row
#: put the 4 rows on 4 different quarters of the banks: one wavefront.
O_PAD = 8


class FlashDecode:
    """Compile-time description of one decoding kernel (a ``DecodeSpec``); called (through
    ``cute.compile``) with the ``kernels.abi.DecodeArgs`` and a stream."""

    def __init__(self, spec: DecodeSpec):
        self.spec = spec
        self.dtype = element_type(spec.dtype)
        self.head_dim = spec.head_dim
        self.block_n = spec.keys_per_warp * DECODE_WARPS
        #: Row stride (floats) of the warps' outputs, staged in the K ring after the walk.
        ring_bytes = spec.kv_stages * self.block_n * self.head_dim * 2
        fits = DECODE_WARPS * TILE_ROWS * (self.head_dim + O_PAD) * 4 <= ring_bytes
        self.o_stride = self.head_dim + (O_PAD if fits else 0)
        #: ``PDL`` (module docstring).
        self.pdl = spec.arch == "sm_90a"
        #: ``Serial merge`` (module docstring).
        self.serial = spec.split and spec.serial_merge
        #: ``K/V by the TMA unit`` (module docstring).
        self.tma = spec.tma_rows > 0
        #: ``Loads before the length`` (module docstring); a window's first block and TMA
        #: boxes depend on it.
        self.early = not spec.windowed and not self.tma and not spec.paged
        #: ``Cluster merge`` (module docstring).
        self.cluster = spec.cluster_splits
        assert not self.cluster or (spec.arch == "sm_90a" and not spec.split
                                    and not self.tma), "a cluster merge needs sm_90a, no " \
            "partials and the row gathers"
        assert not self.tma or (spec.arch == "sm_90a" and self.block_n % spec.tma_rows == 0
                                and spec.tma_rows % 8 == 0), "TMA boxes need sm_90a and " \
            "a multiple of 8 keys that divides the block"

    @cute.jit
    def __call__(self, q: cute.Tensor, k_cache: cute.Tensor, v_cache: cute.Tensor,
                 cache_seqlens: cute.Tensor, cache_batch_idx: cute.Tensor | None,
                 block_table: cute.Tensor | None, out: cute.Tensor, lse: cute.Tensor,
                 softmax_scale: cutlass.Float32, window_left: cutlass.Int32,
                 window_right: cutlass.Int32, num_splits: cutlass.Int32,
                 merged_out: cute.Tensor | None, merged_lse: cute.Tensor | None,
                 counters: cute.Tensor | None, stream: cuda.CUstream):
        """Launch on the arguments of ``kernels.abi.DecodeArgs`` (and the stream)."""
        t = DecodeArgs(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, out,
                       lse, softmax_scale, window_left, window_right, num_splits, merged_out,
                       merged_lse, counters)
        D, spec = self.head_dim, self.spec
        kv_layout = smem_tile_layout("xor", self.block_n, D, spec.kv_stages)
        q_layout = smem_tile_layout("xor", TILE_ROWS, D)
        # The warps' partial outputs reuse the K ring once the walk is done.
        assert cute.cosize(kv_layout) * self.dtype.width >= (
            DECODE_WARPS * TILE_ROWS * self.o_stride * 32), "the K ring must hold the warps' " \
            "outputs"
        fields = {
            "sQ": shared_tile(self.dtype, q_layout),
            "sK": shared_tile(self.dtype, kv_layout), "sV": shared_tile(self.dtype, kv_layout),
            "sLSE": cute.struct.MemRange[cutlass.Float32, DECODE_WARPS * TILE_ROWS],
            "arrival": cute.struct.MemRange[cutlass.Int32, 1]}
        if cutlass.const_expr(self.early):
            fields["lengths"] = cute.struct.MemRange[cutlass.Int32, THREADS]
        if cutlass.const_expr(self.cluster):
            # This CTA's rows (merged over its warps) for the peers; O goes in the V ring.
            fields["sRowLSE"] = cute.struct.MemRange[cutlass.Float32, TILE_ROWS]
        kv_tma = None
        if cutlass.const_expr(self.tma):
            fields["bars"] = cute.struct.MemRange[cutlass.Int64, spec.kv_stages]
            kv_tma = make_box_loads(k_cache, v_cache, spec.tma_rows, D)
        SharedStorage = shared_storage(fields)
        load_atom = cute.make_copy_atom(cpasync.CopyG2SOp(
            cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype, num_bits_per_copy=COPY_BITS)
        length_atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Int32,
                                          num_bits_per_copy=32)
        mma = cute.make_tiled_mma(warp.MmaF16BF16Op(self.dtype, cutlass.Float32, (16, 8, 16)),
                                  (1, 1, 1), permutation_mnk=(16, 16, 16))
        group = q.shape[2] // k_cache.shape[2]
        rows = q.shape[1] * group
        # A page's row from a key index: one multiply-shift instead of a division per row.
        pages = cute.FastDivmodDivisorV2(k_cache.shape[1]) if spec.paged else None
        self.kernel(t, q_layout, kv_layout, row_copy(load_atom, THREADS, D), length_atom, mma,
                    SharedStorage, group, pages, kv_tma).launch(
            grid=[cute.ceil_div(rows, TILE_ROWS), q.shape[0] * k_cache.shape[2], num_splits],
            block=[THREADS, 1, 1], cluster=[1, 1, self.cluster] if self.cluster else None,
            # Else ptxas held 168 registers and spilled with the staged rows padded (now ~207,
            # no spill); a second 128-thread CTA fits even at 255 where shared memory does.
            stream=stream, use_pdl=self.pdl, min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, t: DecodeArgs, q_layout, kv_layout, gmem_load: cute.TiledCopy,
               length_atom: cute.CopyAtom, mma: cute.TiledMma,
               SharedStorage: cutlass.Constexpr, group: cutlass.Int32,
               pages: cute.FastDivmodDivisorV2 | None, kv_tma: tuple | None):
        D, spec = self.head_dim, self.spec
        B_n, kpw = self.block_n, spec.keys_per_warp
        if cutlass.const_expr(self.pdl):
            # Launched before the stream's previous kernel ended: nothing it writes (the
            # cache, the lengths, the query) is read before it has.
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        m_block, bh, split = cute.arch.block_idx()
        heads_kv = t.k_cache.shape[2]
        batch, head_kv = bh // heads_kv, bh % heads_kv
        seqlen_q = t.q.shape[1]
        row0 = m_block * TILE_ROWS
        rows = seqlen_q * group

        # ---- shared memory and this thread's copies ---------------------------------------
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(q_layout)[None, None, 0]
        sK = storage.sK.get_tensor(kv_layout)
        sV = storage.sV.get_tensor(kv_layout)
        thr_load = gmem_load.get_slice(tidx)
        cache_row = batch
        if cutlass.const_expr(spec.batch_idx):
            cache_row = t.cache_batch_idx[batch]
        where = (batch, cache_row, head_kv, group, pages)
        if cutlass.const_expr(self.early):
            # The length by cp.async (each thread its own, in Q's group): from a plain load
            # ptxas put its first use among the copies below, which then waited for the DRAM.
            length = storage.lengths.get_tensor(cute.make_layout(THREADS))
            cute.copy(length_atom, cute.local_tile(t.cache_seqlens, (1,), (batch,)),
                      cute.local_tile(length, (1,), (tidx,)))
        self._gather_q(thr_load, gmem_load, sQ, t, row0, rows, where)
        if cutlass.const_expr(not self.tma):
            # Where this thread's rows of the next block to load sit in the cache
            # (``_locate``), found a block ahead so a page-table read never stalls the copies.
            rows_per_thread = cute.size(thr_load.partition_D(sK[None, None, 0]), mode=[1])
            located = (cute.make_rmem_tensor((rows_per_thread,), cutlass.Int32),
                       cute.make_rmem_tensor((rows_per_thread,), cutlass.Int32))
        if cutlass.const_expr(self.early):
            cute.arch.cp_async_commit_group()
            # Blocks split, split + num_splits, ... (to the capacity).
            self._first_blocks(located, thr_load, gmem_load, t, sK, sV,
                               (split, t.num_splits, None), t.k_cache.shape[1], where)
            cute.arch.cp_async_wait_group(spec.kv_stages - 1)
            seqlen_k = length[tidx]
        else:
            seqlen_k = t.cache_seqlens[batch]

        # ---- this split's K/V blocks: the keys some row of the tile sees, cut in splits ----
        key_lo, key_hi = 0, seqlen_k
        if cutlass.const_expr(spec.windowed):
            # Query position s sees keys s + Sk - Sq - left ..= s + Sk - Sq + right.
            first_q = row0 // group
            last_q = (cutlass.min(row0 + TILE_ROWS, rows) - 1) // group
            key_lo = cutlass.max(first_q + seqlen_k - seqlen_q - t.window_left, 0)
            key_hi = cutlass.min(last_q + seqlen_k - seqlen_q + t.window_right + 1, seqlen_k)
        n_lo = key_lo // B_n
        n_hi = cutlass.max(cute.ceil_div(cutlass.max(key_hi, 0), B_n), n_lo)
        # This split's blocks: first, first + step, ... (count).
        if cutlass.const_expr(self.early):
            first, step = split, t.num_splits
            count = cute.ceil_div(cutlass.max(n_hi - first, 0), step)
            for i in cutlass.range_constexpr(spec.kv_stages - 1):
                copied = first + i * step
                if copied * B_n < seqlen_k and (copied + 1) * B_n > seqlen_k:
                    # The last block, copied before the length: this thread's V rows past
                    # the end zeroed once landed (published by the loop's first barrier).
                    cute.arch.cp_async_wait_group(spec.kv_stages - 2 - i)
                    self._zero_rows_past(thr_load, sV[None, None, i], copied, seqlen_k)
        else:
            per_split = cute.ceil_div(n_hi - n_lo, t.num_splits)
            first, step = cutlass.min(n_lo + split * per_split, n_hi), 1
            count = cutlass.min(first + per_split, n_hi) - first
        boxes = None
        if cutlass.const_expr(self.tma):
            issuer = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            boxes = BoxLoads(kv_tma, tuple(buf.get_tensor(kv_layout.outer,
                                                          swizzle=tma_swizzle(D))
                                           for buf in (storage.sK, storage.sV)),
                             storage.bars.data_ptr(), spec.tma_rows, B_n, D,
                             self.dtype.width // 8, pages)
            decode_tma.init_barriers(boxes, spec.kv_stages, tidx)
            cute.arch.sync_threads()
            # The page of each box of the next block to issue (``decode_tma.locate``).
            located = (cute.make_rmem_tensor((B_n // spec.tma_rows,), cutlass.Int32)
                       if cutlass.const_expr(spec.paged) else None)
            for i in cutlass.range_constexpr(spec.kv_stages - 1):
                self._issue_boxes(boxes, located, t, issuer, first + i, i, first + count,
                                  (batch, head_kv, cache_row), seqlen_k, i == 0)
            cute.arch.cp_async_commit_group()
        else:
            if cutlass.const_expr(not self.early):
                self._first_blocks(located, thr_load, gmem_load, t, sK, sV,
                                   (first, step, count), seqlen_k, where)
            if spec.kv_stages - 1 < count:
                self._locate(located, thr_load, t, first + (spec.kv_stages - 1) * step,
                             seqlen_k, where)

        # ---- this warp's slice of every block: S = Q K^T, online softmax, O += P V ---------
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()
        thr_mma = mma.get_slice(lane)
        ldsm, ldsm_t = (cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=tr,
                                                                   num_matrices=4), self.dtype)
                        for tr in (False, True))
        mine = (kpw, D, spec.kv_stages)
        sK_w = cute.local_tile(sK, mine, (warp_idx, 0, 0))
        sVt_w = transposed(cute.local_tile(sV, mine, (warp_idx, 0, 0)), kpw, D, spec.kv_stages)

        def operand(frag, copy, src):
            thr = copy.get_slice(lane)
            return frag, (copy, thr.partition_S(src), thr.retile(frag))

        tQ, lQ = operand(thr_mma.make_fragment_A(thr_mma.partition_A(sQ)),
                         cute.make_tiled_copy_A(ldsm, mma), sQ)
        tK, lK = operand(thr_mma.make_fragment_B(thr_mma.partition_B(sK_w[None, None, 0])),
                         cute.make_tiled_copy_B(ldsm, mma), sK_w)
        tVt, lVt = operand(thr_mma.make_fragment_B(thr_mma.partition_B(sVt_w[None, None, 0])),
                           cute.make_tiled_copy_B(ldsm_t, mma), sVt_w)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_ROWS, D)),
                                      cutlass.Float32)
        acc_O.fill(0.0)
        tScS = acc_mn_view(thr_mma.partition_C(cute.make_identity_tensor((TILE_ROWS, kpw))))
        softmax = OnlineSoftmax.create(cute.size(tScS, mode=[0]), t.softmax_scale, True, True)

        for it in cutlass.range(count, unroll=1):
            n_block = first + it * step
            stage = it % spec.kv_stages
            if cutlass.const_expr(self.tma):
                # Q's copies (the first block only has any).
                cute.arch.cp_async_wait_group(0)
                cute.arch.sync_threads()
                # Every warp is past the block before: its stage takes the next one in.
                self._issue_boxes(boxes, located, t, warp_idx, n_block + spec.kv_stages - 1,
                                  (it + spec.kv_stages - 1) % spec.kv_stages, first + count,
                                  (batch, head_kv, cache_row), seqlen_k, False)
                decode_tma.wait(boxes, it, stage, spec.kv_stages)
                if (n_block + 1) * B_n > seqlen_k:
                    self._zero_rows_past(thr_load, sV[None, None, stage], n_block, seqlen_k)
                    cute.arch.sync_threads()
            else:
                cute.arch.cp_async_wait_group(spec.kv_stages - 2)
                cute.arch.sync_threads()
                # Every warp is past the block before: its stage takes the next one in.
                ahead = it + spec.kv_stages - 1
                if ahead < count:
                    self._load_block(located, thr_load, gmem_load, t, sK, sV,
                                     first + ahead * step,
                                     (it + spec.kv_stages - 1) % spec.kv_stages, seqlen_k,
                                     where)
                cute.arch.cp_async_commit_group()
                if ahead + 1 < count:
                    self._locate(located, thr_load, t, first + (ahead + 1) * step, seqlen_k,
                                 where)

            acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_ROWS, kpw)),
                                          cutlass.Float32)
            acc_S.fill(0.0)
            gemm(mma, acc_S, tQ, tK, lQ, (lK[0], lK[1][None, None, None, stage], lK[2]),
                 FRAGS, FRAGS, True)
            key0 = n_block * B_n + warp_idx * kpw
            self._mask(acc_S, tScS, key0, row0, group, seqlen_q, seqlen_k, t.window_left,
                       t.window_right)
            softmax.update(acc_S, acc_O)
            rP = cute.make_fragment_like(acc_S, self.dtype)
            rP.store(acc_S.load().to(self.dtype))
            gemm(mma, acc_O, acc_as_operand_a(rP), tVt, None,
                 (lVt[0], lVt[1][None, None, None, stage], lVt[2]), 0, FRAGS, True)

        # ---- the warps' outputs merged by their LSEs, then written -------------------------
        lse_w = cute.make_rmem_tensor((cute.size(tScS, mode=[0]),), cutlass.Float32)
        softmax.finalize(acc_O, lse_w)
        if cutlass.const_expr(self.pdl and spec.split):
            # The combine may launch (it waits for this grid's end before reading).
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        sO = cute.make_tensor(cute.recast_ptr(sK.iterator, dtype=cutlass.Float32),
                              cute.make_layout((TILE_ROWS, D, DECODE_WARPS),
                                               stride=(self.o_stride, 1,
                                                       TILE_ROWS * self.o_stride)))
        sLSE = storage.sLSE.get_tensor(cute.make_layout((TILE_ROWS, DECODE_WARPS),
                                                        stride=(1, TILE_ROWS)))
        store_fragment(acc_O, sO[None, None, warp_idx], mma, lane)
        if lane % 4 == 0:
            for r in cutlass.range_constexpr(cute.size(tScS, mode=[0])):
                sLSE[tScS[r, 0][0], warp_idx] = lse_w[r]
        cute.arch.sync_threads()
        if cutlass.const_expr(self.cluster):
            rows_sO = cute.make_tensor(cute.recast_ptr(sV.iterator, dtype=cutlass.Float32),
                                       cute.make_layout((TILE_ROWS, D), stride=(D, 1)))
            row_lse = storage.sRowLSE.get_tensor(cute.make_layout(TILE_ROWS))
            self._cluster_write(t, sO, sLSE, (rows_sO, row_lse), batch, split, head_kv, group,
                                row0, rows, tidx)
        else:
            self._write(t, sO, sLSE, batch, split, head_kv, group, row0, rows, tidx)
        if cutlass.const_expr(self.serial):
            arrival = storage.arrival.get_tensor(cute.make_layout(1))
            counter = bh * cute.arch.grid_dim()[0] + m_block
            if count_in(t.counters, counter, arrival, 0, tidx == 0, t.num_splits - 1,
                        NamedBarrier.CTA, THREADS):
                self._merge(t, batch, head_kv, group, row0, rows, tidx)
                if tidx == 0:
                    t.counters[counter] = 0

    @cute.jit
    def _locate(self, located: tuple, thr_load, t: DecodeArgs, n_block, seqlen_k,
                where: tuple):
        """(page, row) of this thread's rows of block ``n_block``: key ``p`` of a paged cache
        sits at row ``p % page_size`` of page ``block_table[batch, p // page_size]`` (the
        table is read only for keys of the sequence), of a contiguous one at row ``p`` of
        the sequence's cache row, which ``_load_block`` puts in the base (no page)."""
        batch, _, _, _, pages = where
        page, row = located
        coord = thr_load.partition_S(cute.make_identity_tensor((self.block_n, self.head_dim)))
        for m in cutlass.range_constexpr(cute.size(row)):
            p = n_block * self.block_n + coord[0, m, 0][0]
            row[m] = p
            if cutlass.const_expr(self.spec.paged):
                index, row[m] = divmod(p, pages)
                page[m] = 0
                if p < seqlen_k:
                    page[m] = t.block_table[batch, index]

    @cute.jit
    def _first_blocks(self, located: tuple, thr_load, gmem_load: cute.TiledCopy,
                      t: DecodeArgs, sK: cute.Tensor, sV: cute.Tensor, walk: tuple, seqlen_k,
                      where: tuple):
        """The ``walk``'s (first block, step, count or None) first ``kv_stages - 1`` blocks
        into the ring, a commit group each."""
        first, step, count = walk
        for i in cutlass.range_constexpr(self.spec.kv_stages - 1):
            if cutlass.const_expr(count is None) or i < count:
                self._locate(located, thr_load, t, first + i * step, seqlen_k, where)
                self._load_block(located, thr_load, gmem_load, t, sK, sV, first + i * step,
                                 i, seqlen_k, where)
            cute.arch.cp_async_commit_group()

    @cute.jit
    def _load_block(self, located: tuple, thr_load, gmem_load: cute.TiledCopy,
                    t: DecodeArgs, sK: cute.Tensor, sV: cute.Tensor, n_block, stage, seqlen_k,
                    where: tuple):
        """Start copying K/V block ``n_block`` (rows ``_locate``d) into ring stage
        ``stage``, zeros past the sequence."""
        _, cache_row, head_kv, _, _ = where
        page, row = located
        coord = thr_load.partition_S(cute.make_identity_tensor((self.block_n, self.head_dim)))
        # A contiguous cache's row of the sequence is the same for every key: in the base.
        first = 0 if cutlass.const_expr(self.spec.paged) else cache_row
        for m in cutlass.range_constexpr(cute.size(row)):
            # One key offset for both tensors where their strides agree (the common case:
            # two caches of one shape): half the per-row address arithmetic.
            at = (page[m] if cutlass.const_expr(self.spec.paged) else 0, row[m], 0, 0)
            offset = cute.crd2idx(at, t.k_cache.layout)
            for cache, smem in ((t.k_cache, sK), (t.v_cache, sV)):
                if cutlass.const_expr(self.spec.v_strides):
                    offset = cute.crd2idx(at, cache.layout)
                base = cache[first, 0, head_kv, None]
                dst = thr_load.partition_D(smem[None, None, stage])
                if n_block * self.block_n + coord[0, m, 0][0] < seqlen_k:
                    self._copy_row(gmem_load, cute.make_tensor(base.iterator + offset,
                                                               base.layout), dst, coord, m)
                else:
                    dst[None, m, None].fill(0)

    @cute.jit
    def _issue_boxes(self, boxes: BoxLoads, located, t: DecodeArgs, warp_idx, n_block, stage,
                     n_last, where: tuple, seqlen_k, first: cutlass.Constexpr):
        """Warp 0 issues block ``n_block`` (if in the walk) into ``stage`` and, paged, looks
        up the next block's pages (a contiguous cache's boxes need no lookup); ``located``
        holds ``n_block``'s pages already, but for the walk's ``first`` block."""
        batch, head_kv, cache_row = where
        if warp_idx == 0:
            if n_block < n_last:
                if cutlass.const_expr(self.spec.paged and first):
                    decode_tma.locate(boxes, located, t.block_table, batch, n_block, seqlen_k)
                decode_tma.issue(boxes, located, n_block, stage, head_kv, cache_row, seqlen_k)
                if cutlass.const_expr(self.spec.paged):
                    if n_block + 1 < n_last:
                        decode_tma.locate(boxes, located, t.block_table, batch, n_block + 1,
                                        seqlen_k)

    @cute.jit
    def _zero_rows_past(self, thr_load, smem: cute.Tensor, n_block, seqlen_k):
        """Zeros in this thread's rows of block ``n_block``'s tile ``smem`` past the sequence
        (what a box or an early copy brought is masked in S, but 0 x NaN in P V is NaN)."""
        coord = thr_load.partition_S(cute.make_identity_tensor((self.block_n, self.head_dim)))
        dst = thr_load.partition_D(smem)
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            if n_block * self.block_n + coord[0, m, 0][0] >= seqlen_k:
                dst[None, m, None].fill(0)

    @cute.jit
    def _gather_q(self, thr_load, gmem_load: cute.TiledCopy, sQ: cute.Tensor,
                  t: DecodeArgs, row0, rows, where: tuple):
        """The tile's packed query rows into ``sQ`` (zeros past the last): packed row ``p``
        is position ``p // group`` of head ``head_kv * group + p % group``."""
        batch, _, head_kv, group, _ = where
        coord = thr_load.partition_S(cute.make_identity_tensor((TILE_ROWS, self.head_dim)))
        dst = thr_load.partition_D(sQ)
        for m in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            p = row0 + coord[0, m, 0][0]
            if p < rows:
                self._copy_row(gmem_load, t.q[batch, p // group, head_kv * group + p % group,
                                              None], dst, coord, m)
            else:
                dst[None, m, None].fill(0)

    @cute.jit
    def _copy_row(self, gmem_load: cute.TiledCopy, row: cute.Tensor, dst: cute.Tensor,
                  coord: cute.Tensor, m: cutlass.Constexpr):
        """This thread's 16-byte chunks of one global row (``row``, D elements) into its
        row ``m`` of ``dst`` by ``cp.async``."""
        for k in cutlass.range_constexpr(cute.size(dst, mode=[2])):
            ptr = cute.make_ptr(self.dtype, (row.iterator + coord[0, m, k][1]).toint(),
                                cute.AddressSpace.gmem, assumed_align=16)
            cute.copy(gmem_load, cute.make_tensor(ptr, dst[None, m, k].layout),
                      dst[None, m, k])

    @cute.jit
    def _mask(self, acc_S: cute.Tensor, tScS: cute.Tensor, key0, row0, group, seqlen_q,
              seqlen_k, window_left, window_right):
        """-inf where a key is past the sequence or (``windowed``) outside the row's band."""
        s_mn = acc_mn_view(acc_S)
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                key = key0 + tScS[r, c][1]
                if key >= seqlen_k:
                    s_mn[r, c] = -cutlass.Float32.inf
                if cutlass.const_expr(self.spec.windowed):
                    diagonal = (row0 + tScS[r, c][0]) // group + seqlen_k - seqlen_q
                    if key < diagonal - window_left:
                        s_mn[r, c] = -cutlass.Float32.inf
                    if key > diagonal + window_right:
                        s_mn[r, c] = -cutlass.Float32.inf

    @cute.jit
    def _merge(self, t: DecodeArgs, batch, head_kv, group, row0, rows, tidx):
        """The tile's rows merged over every split's partial (O, LSE), as the combine kernel
        merges them, into ``merged_out`` and ``merged_lse``. The threads deal out the tile's
        (row, 4 columns) items (rows past the sequence's left out); each merges its item's
        splits in one pass (``decode_combine.merge_splits``), ``MERGE_SPLITS`` splits' loads
        in flight together."""
        D, batch_size = self.head_dim, t.q.shape[0]
        per_row = D // VEC
        items = (cutlass.min(rows - row0, TILE_ROWS)) * per_row
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        for index in cutlass.range(tidx, items, THREADS, unroll=1):
            row, c = row0 + index // per_row, index % per_row * VEC
            pos, head = row // group, head_kv * group + row % group
            top, total = merge_splits(t.out, t.lse, (batch, batch_size, pos, head), c, 0,
                                      t.num_splits, 1, MERGE_SPLITS, acc)
            safe_top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
            inverse = cutlass.Float32(0.0) if total == 0.0 else cute.arch.rcp_approx(total)
            dst = cute.local_tile(t.merged_out[batch, pos, head, None], (VEC,), (c // VEC,))
            dst.store((acc.load() * inverse).to(t.merged_out.element_type))
            if c == 0:
                t.merged_lse[batch, head, pos] = safe_top + cute.math.log(total, fastmath=True)

    @cute.jit
    def _warps_merged(self, sO: cute.Tensor, sLSE: cute.Tensor, r, c,
                      acc: cute.Tensor) -> cutlass.Float32:
        """Row ``r``'s columns ``c ..`` (``VEC``) merged over the warps' (O, LSE) into
        ``acc``; returns the row's LSE."""
        return self._merge_by_lse(
            [sLSE[r, w] for w in range(DECODE_WARPS)],
            [[sO[r, c + j, w] for j in range(VEC)] for w in range(DECODE_WARPS)], acc)

    @cute.jit
    def _merge_by_lse(self, lses: list, vectors: list, acc: cute.Tensor) -> cutlass.Float32:
        """``acc`` = the ``vectors`` (``VEC`` values each) weighted by exp(their LSE - the
        largest), normalised; returns the merged LSE (-inf where every LSE is: no key)."""
        top = lses[0]
        for s in cutlass.range_constexpr(1, len(lses)):
            top = cute.arch.fmax(top, lses[s])
        safe_top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
        total = cutlass.Float32(0.0)
        acc.fill(0.0)
        for s in cutlass.range_constexpr(len(lses)):
            weight = cute.math.exp(lses[s] - safe_top, fastmath=True)
            total = total + weight
            for j in cutlass.range_constexpr(VEC):
                acc[j] = acc[j] + weight * vectors[s][j]
        inverse = cutlass.Float32(0.0) if total == 0.0 else cute.arch.rcp_approx(total)
        acc.store(acc.load() * inverse)
        return safe_top + cute.math.log(total, fastmath=True)

    @cute.jit
    def _write(self, t: DecodeArgs, sO: cute.Tensor, sLSE: cute.Tensor, batch, split,
               head_kv, group, row0, rows, tidx):
        """Merge the warps' (O, LSE) of each row and write the tile's rows (a split's partial
        rows at batch index ``split * B + batch``)."""
        D = self.head_dim
        out_batch = batch
        if cutlass.const_expr(self.spec.split):
            out_batch = split * t.q.shape[0] + batch
        items = [(index // (D // VEC), index % (D // VEC) * VEC)
                 for index in (i * THREADS + tidx
                               for i in range(TILE_ROWS * D // VEC // THREADS))]
        accs = [cute.make_rmem_tensor((VEC,), cutlass.Float32) for _ in items]
        # Every item merged before any is stored (a padding row's too): no branch between
        # them, so all their loads are in flight at once.
        lses = [self._warps_merged(sO, sLSE, r, c, acc)
                for (r, c), acc in zip(items, accs, strict=True)]
        for (r, c), acc, lse in zip(items, accs, lses, strict=True):
            if row0 + r < rows:
                self._store(t, acc, lse, out_batch, row0 + r, c, head_kv, group)

    @cute.jit
    def _store(self, t: DecodeArgs, acc: cute.Tensor, lse, out_batch, row, c, head_kv, group):
        """Packed row ``row``'s columns ``c ..`` (``acc``) into ``out`` and, from its first
        vector, its LSE into ``lse`` (batch index ``out_batch``)."""
        head = head_kv * group + row % group
        dst = cute.local_tile(t.out[out_batch, row // group, head, None], (VEC,), (c // VEC,))
        dst.store(acc.load().to(t.out.element_type))
        if c == 0:
            t.lse[out_batch, head, row // group] = lse

    @cute.jit
    def _cluster_write(self, t: DecodeArgs, sO: cute.Tensor, sLSE: cute.Tensor,
                       staged: tuple, batch, split, head_kv, group, row0, rows, tidx):
        """The cluster merge (module docstring): this CTA's rows merged over its warps into
        ``staged`` (O ``[TILE_ROWS, D]`` and LSE, fp32), the cluster barrier, then this
        thread's items of the tile (cluster CTA ``split``'s share) merged over every peer's
        staged rows by their LSEs and written; a last barrier keeps ``staged`` until the
        peers have read it."""
        D, splits = self.head_dim, self.cluster
        rows_o, rows_lse = staged
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        for i in cutlass.range_constexpr(TILE_ROWS * D // VEC // THREADS):
            index = i * THREADS + tidx
            r, c = index // (D // VEC), index % (D // VEC) * VEC
            lse = self._warps_merged(sO, sLSE, r, c, acc)
            cute.local_tile(rows_o[r, None], (VEC,), (c // VEC,)).store(acc.load())
            if c == 0:
                rows_lse[r] = lse
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        items = TILE_ROWS * D // VEC
        o_base, lse_base = rows_o.iterator.toint(), rows_lse.iterator.toint()
        for j in cutlass.range_constexpr(-(-items // (splits * THREADS))):
            index = (j * splits + split) * THREADS + tidx
            r, c = index // (D // VEC), index % (D // VEC) * VEC
            if index < items:
                if row0 + r < rows:
                    # Every peer's LSE and vector loaded before the first is used.
                    lse = self._merge_by_lse(
                        [load_peer_f32(lse_base + r * 4, s) for s in range(splits)],
                        [load_peer_v4(o_base + (r * D + c) * 4, s) for s in range(splits)],
                        acc)
                    self._store(t, acc, lse, batch, row0 + r, c, head_kv, group)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
