"""The split-KV merge: a split decoding's partial outputs combined by their LSEs.

Split ``i`` of a row wrote ``O_i`` (normalised over its keys) and ``lse_i``; the row's output
is ``sum_i exp(lse_i - lse) O_i`` with ``lse = log sum_i exp(lse_i)``, computed against the
largest ``lse_i`` so no exponent overflows. A split that saw no key wrote ``lse_i = -inf``
and weighs 0; a row no split saw gets O = 0 and LSE = -inf, as the undivided kernel writes.
Each thread takes 4 consecutive elements of a row (16-byte loads of each partial).

A CTA merges one row: its threads find the largest LSE together (a split each, then a CTA
max), then ``groups = THREADS / (head_dim / 4)`` thread groups each sum a share of the splits
and the groups' sums meet in shared memory. A thread walking every split of its columns
instead (4 rows per CTA at hd128, the first version) waited out a chain of dependent loads as
long as the split count: with 128 splits over the 8 rows of one MQA sequence, 2 CTAs and 32
rounds of memory latency; the CTA per row measured faster at every point (docs/decode.md).
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
        self.per_row = spec.head_dim // VEC
        #: Thread groups sharing a row's splits; the threads past ``groups * per_row`` idle
        #: (hd96: 120 of 128 work).
        self.groups = THREADS // self.per_row
        self.working = self.groups * self.per_row
        #: Launched early behind the split decoding (``decode.py``'s PDL, sm_90).
        self.pdl = spec.arch == "sm_90a"

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
        self.kernel(t, SharedStorage).launch(grid=[rows, 1, 1], block=[THREADS, 1, 1],
                                             stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, t: CombineArgs, SharedStorage: cutlass.Constexpr):
        if cutlass.const_expr(self.pdl):
            # The partials are the previous kernel's: wait for its end (and its writes).
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        index, _, _ = cute.arch.block_idx()
        batch_size, seqlen_q, heads = t.out.shape[0], t.out.shape[1], t.out.shape[2]
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
        safe_top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
        # This thread's group sums splits first, first + groups, ...: unrolled, as the
        # splits' loads are independent. An idle thread's share starts past the last split.
        first = tidx // self.per_row if tidx < self.working else t.num_splits
        col = tidx % self.per_row * VEC
        total = cutlass.Float32(0.0)
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        acc.fill(0.0)
        for i in cutlass.range(first, t.num_splits, self.groups, unroll=SPLITS_UNROLL):
            split_row = i * batch_size + batch
            weight = cute.math.exp(t.partial_lse[split_row, head, pos] - safe_top,
                                   fastmath=True)
            total = total + weight
            part = cute.local_tile(t.partial_out[split_row, pos, head, None], (VEC,),
                                   (col // VEC,)).load()
            acc.store(acc.load() + part * weight)
        totals = storage.total.get_tensor(cute.make_layout(self.groups))
        sums = storage.acc.get_tensor(cute.make_layout((VEC, THREADS)))
        for j in cutlass.range_constexpr(VEC):
            sums[j, tidx] = acc[j]
        if col == 0 and tidx < self.working:
            totals[tidx // self.per_row] = total
        cute.arch.sync_threads()
        if tidx < self.per_row:
            for g in cutlass.range_constexpr(1, self.groups):
                total = total + totals[g]
                for j in cutlass.range_constexpr(VEC):
                    acc[j] = acc[j] + sums[j, g * self.per_row + tidx]
            inverse = cutlass.Float32(0.0) if total == 0.0 else 1.0 / total
            dst = cute.local_tile(t.out[batch, pos, head, None], (VEC,), (col // VEC,))
            dst.store((acc.load() * inverse).to(self.dtype))
            if col == 0:
                t.lse[batch, head, pos] = safe_top + cute.math.log(total, fastmath=True)
