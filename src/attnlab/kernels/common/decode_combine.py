"""The split-KV merge: a split decoding's partial outputs combined by their LSEs.

Split ``i`` of a row wrote ``O_i`` (normalised over its keys) and ``lse_i``; the row's output
is ``sum_i exp(lse_i - lse) O_i`` with ``lse = log sum_i exp(lse_i)``, computed against the
largest ``lse_i`` so no exponent overflows. A split that saw no key wrote ``lse_i = -inf``
and weighs 0; a row no split saw gets O = 0 and LSE = -inf, as the undivided kernel writes.
Each thread takes 4 consecutive elements of a row (16-byte loads of each partial).

Two ways to spread the work (``CombineSpec.cta_per_row``):

* **a thread per row segment** (4 rows per CTA at hd128): each thread walks every split of
  its columns, twice (the largest LSE, then the weighted sum). Its chain of dependent loads is
  as long as the split count: with 128 splits over the 8 rows of one MQA sequence, 2 CTAs
  wait out 32 rounds of memory latency.
* **a CTA per row**: the CTA's threads find the largest LSE together (one split each, a CTA
  max), then ``groups = THREADS / (head_dim / 4)`` thread groups each sum a share of the
  splits and the groups' sums meet in shared memory: a chain ``groups`` times shorter.
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import CombineArgs, CombineSpec
from attnlab.kernels.common.base import shared_storage
from attnlab.kernels.common.tensors import element_type

THREADS = 128
WARPS = THREADS // 32
VEC = 4
SPLITS_UNROLL = 8


class DecodeCombine:
    """Compile-time description of the combine kernel of a ``CombineSpec``."""

    def __init__(self, spec: CombineSpec):
        self.dtype = element_type(spec.dtype)
        self.head_dim = spec.head_dim
        self.cta_per_row = spec.cta_per_row
        self.per_row = spec.head_dim // VEC
        #: Thread groups sharing one row's splits (a CTA per row), else rows per CTA; the
        #: threads past ``groups * per_row`` idle (hd96: 120 of 128 work).
        self.groups = THREADS // self.per_row
        self.working = self.groups * self.per_row

    @cute.jit
    def __call__(self, partial_out: cute.Tensor, partial_lse: cute.Tensor, out: cute.Tensor,
                 lse: cute.Tensor, num_splits: cutlass.Int32, stream: cuda.CUstream):
        """Launch on the arguments of ``kernels.abi.CombineArgs`` (and the stream)."""
        t = CombineArgs(partial_out, partial_lse, out, lse, num_splits)
        rows = out.shape[0] * out.shape[1] * out.shape[2]
        SharedStorage = shared_storage({
            "top": cute.struct.MemRange[cutlass.Float32, WARPS],
            "total": cute.struct.MemRange[cutlass.Float32, self.groups],
            "acc": cute.struct.MemRange[cutlass.Float32, THREADS * VEC]})
        grid = rows if self.cta_per_row else cute.ceil_div(rows, self.groups)
        self.kernel(t, SharedStorage).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1],
                                             stream=stream)

    @cute.kernel
    def kernel(self, t: CombineArgs, SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        batch_size, seqlen_q, heads = t.out.shape[0], t.out.shape[1], t.out.shape[2]
        col = tidx % self.per_row * VEC
        if cutlass.const_expr(self.cta_per_row):
            self._cta_row(t, SharedStorage, bidx, tidx, col, batch_size, seqlen_q, heads)
        else:
            index = bidx * self.groups + tidx // self.per_row
            batch = index // (heads * seqlen_q)
            if tidx < self.working and batch < batch_size:
                top = -cutlass.Float32.inf
                # Unrolled: the splits' loads are independent, and with many splits over few
                # rows a rolled loop waits out one memory latency per split.
                for i in cutlass.range(t.num_splits, unroll=SPLITS_UNROLL):
                    top = cute.arch.fmax(top, t.partial_lse[i * batch_size + batch,
                                                            index % heads,
                                                            (index // heads) % seqlen_q])
                self._finish(t, top, 0, 1, index, col, batch_size, seqlen_q, heads, None,
                             tidx)

    @cute.jit
    def _cta_row(self, t: CombineArgs, SharedStorage: cutlass.Constexpr, index, tidx, col,
                 batch_size, seqlen_q, heads):
        """Row ``index`` by the whole CTA: the largest LSE over the threads, each group's share
        of the splits, the groups' sums merged in shared memory."""
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        tops = storage.top.get_tensor(cute.make_layout(WARPS))
        batch = index // (heads * seqlen_q)
        head, pos = index % heads, (index // heads) % seqlen_q
        top = -cutlass.Float32.inf
        for i in cutlass.range(tidx, t.num_splits, THREADS, unroll=1):
            top = cute.arch.fmax(top, t.partial_lse[i * batch_size + batch, head, pos])
        top = cute.arch.warp_reduction_max(top)
        if tidx % 32 == 0:
            tops[tidx // 32] = top
        cute.arch.sync_threads()
        for w in cutlass.range_constexpr(WARPS):
            top = cute.arch.fmax(top, tops[w])
        # An idle thread's share of the splits starts past the last.
        first = tidx // self.per_row if tidx < self.working else t.num_splits
        self._finish(t, top, first, self.groups, index, col, batch_size, seqlen_q, heads,
                     storage, tidx)

    @cute.jit
    def _finish(self, t: CombineArgs, top, first, groups: cutlass.Constexpr, index, col,
                batch_size, seqlen_q, heads, storage, tidx):
        """The weighted sum of splits ``first, first + groups, ...`` at columns ``col..+4``;
        with several groups their sums meet in ``storage`` and group 0 writes the row."""
        batch = index // (heads * seqlen_q)
        head, pos = index % heads, (index // heads) % seqlen_q
        safe_top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
        total = cutlass.Float32(0.0)
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        acc.fill(0.0)
        for i in cutlass.range(first, t.num_splits, groups, unroll=SPLITS_UNROLL):
            split_row = i * batch_size + batch
            weight = cute.math.exp(t.partial_lse[split_row, head, pos] - safe_top,
                                   fastmath=True)
            total = total + weight
            part = cute.local_tile(t.partial_out[split_row, pos, head, None], (VEC,),
                                   (col // VEC,)).load()
            acc.store(acc.load() + part * weight)
        write = True
        if cutlass.const_expr(groups > 1):
            totals = storage.total.get_tensor(cute.make_layout(groups))
            sums = storage.acc.get_tensor(cute.make_layout((VEC, THREADS)))
            for j in cutlass.range_constexpr(VEC):
                sums[j, tidx] = acc[j]
            if col == 0 and tidx < self.working:
                totals[tidx // self.per_row] = total
            cute.arch.sync_threads()
            write = tidx < self.per_row
            if write:
                for g in cutlass.range_constexpr(1, groups):
                    total = total + totals[g]
                    for j in cutlass.range_constexpr(VEC):
                        acc[j] = acc[j] + sums[j, g * self.per_row + tidx]
        if write:
            inverse = cutlass.Float32(0.0) if total == 0.0 else 1.0 / total
            dst = cute.local_tile(t.out[batch, pos, head, None], (VEC,), (col // VEC,))
            dst.store((acc.load() * inverse).to(self.dtype))
            if col == 0:
                t.lse[batch, head, pos] = safe_top + cute.math.log(total, fastmath=True)
