"""The split-KV merge: a split decoding's partial outputs combined by their LSEs.

Split ``i`` of a row wrote ``O_i`` (normalised over its keys) and ``lse_i``; the row's output
is ``sum_i exp(lse_i - lse) O_i`` with ``lse = log sum_i exp(lse_i)``, computed against the
largest ``lse_i`` so no exponent overflows. A split that saw no key wrote ``lse_i = -inf``
and weighs 0; a row no split saw gets O = 0 and LSE = -inf, as the undivided kernel writes.
Each thread takes 4 consecutive elements of a row (16-byte loads of each partial).

A CTA merges one row: ``groups = THREADS / (head_dim / 4)`` thread groups each merge a share
of the splits in one pass (``merge_splits``: a batch of splits loaded, then summed against
the largest LSE so far), and the groups' sums meet in shared memory, rescaled to the largest
group maximum. With up to ``SPLITS_BATCH`` splits a thread (64 splits at hd128) the merge
waits out one round of memory latency: every LSE and vector of the batch is loaded before
the maximum. The first version found the largest LSE first (a round of LSE loads and a CTA
barrier), then summed in a loop that checked its bound after every split: one round a split;
before that a thread walked every split of its columns (docs/decode.md).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import CombineArgs, CombineSpec
from attnlab.kernels.common.base import shared_storage
from attnlab.kernels.common.tensors import element_type

THREADS = 256
VEC = 4
SPLITS_BATCH = 8


@cute.jit
def merge_splits(partial_out: cute.Tensor, partial_lse: cute.Tensor, where: tuple, col,
                 first, stop, step, batch: cutlass.Constexpr, acc: cute.Tensor) -> tuple:
    """Merge splits ``first, first + step, ... < stop`` of one row's ``VEC`` columns from
    ``col`` (``where``: the row's batch, the batch size, its position and head; split ``s``'s
    partial is batch row ``s * batch_size + batch``) in one pass: ``acc`` gets ``sum_s
    exp(lse_s - top) O_s``; returns ``(top, total)``, the largest LSE and ``sum_s exp(lse_s -
    top)`` (-inf and 0 where no split saw a key).

    The splits come ``batch`` at a time, every load of a batch issued before any sum: a split
    past ``stop`` reads the batch's first split again and weighs 0, so the loads need no
    branch, and a split's addresses are the first split's plus a multiple of one split's
    stride (a loop that checked its bound after each split, or indexed each split afresh,
    waited out a memory latency a split: ptxas put the sums between the loads)."""
    b, batch_size, pos, head = where
    lse_at = cute.crd2idx((b, head, pos), partial_lse.layout)
    lse_step = cute.crd2idx((batch_size, 0, 0), partial_lse.layout)
    out_at = cute.crd2idx((b, pos, head, col), partial_out.layout)
    out_step = cute.crd2idx((batch_size, 0, 0, 0), partial_out.layout)
    top = -cutlass.Float32.inf
    total = cutlass.Float32(0.0)
    acc.fill(0.0)
    for s0 in cutlass.range(first, stop, step * batch, unroll=1):
        loaded = []
        for u in cutlass.range_constexpr(batch):
            ahead = u * step if s0 + u * step < stop else 0
            lse = cute.make_tensor(partial_lse.iterator + (lse_at + (s0 + ahead) * lse_step),
                                   cute.make_layout(1))
            vector = cute.make_ptr(partial_out.element_type,
                                   (partial_out.iterator + (out_at + (s0 + ahead) * out_step)
                                    ).toint(), cute.AddressSpace.gmem, assumed_align=16)
            part = cute.make_tensor(vector, cute.make_layout(VEC)).load()
            loaded.append((lse[0], part))
        lses = []
        new_top = top
        for u in cutlass.range_constexpr(batch):
            lse_s = -cutlass.Float32.inf if s0 + u * step >= stop else loaded[u][0]
            lses.append(lse_s)
            new_top = cute.arch.fmax(new_top, lse_s)
        safe = cutlass.Float32(0.0) if new_top == -cutlass.Float32.inf else new_top
        rescale = cute.math.exp(top - safe, fastmath=True)
        total = total * rescale
        acc.store(acc.load() * rescale)
        for u in cutlass.range_constexpr(batch):
            weight = cute.math.exp(lses[u] - safe, fastmath=True)
            total = total + weight
            acc.store(acc.load() + loaded[u][1] * weight)
        top = new_top
    return top, total


class DecodeCombine:
    """Compile-time description of the combine kernel of a ``CombineSpec``."""

    def __init__(self, spec: CombineSpec):
        self.dtype = element_type(spec.dtype)
        self.head_dim = spec.head_dim
        self.per_row = spec.head_dim // VEC
        #: Thread groups sharing a row's splits; the threads past ``groups * per_row`` idle
        #: (hd96: 240 of 256 work).
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
            "top": cute.struct.MemRange[cutlass.Float32, self.groups],
            "total": cute.struct.MemRange[cutlass.Float32, self.groups],
            "acc": cute.struct.MemRange[cutlass.Float32, THREADS * VEC]})
        # One CTA an SM: told nothing, ptxas held 46 registers and issued 6 of a batch's 8
        # vectors after the maximum, a second round of latency (a call has a CTA per row).
        self.kernel(t, SharedStorage).launch(grid=[rows, 1, 1], block=[THREADS, 1, 1],
                                             stream=stream, use_pdl=self.pdl,
                                             min_blocks_per_mp=1)

    @cute.kernel
    def kernel(self, t: CombineArgs, SharedStorage: cutlass.Constexpr):
        if cutlass.const_expr(self.pdl):
            # The partials are the previous kernel's: wait for its end (and its writes).
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        index, _, _ = cute.arch.block_idx()
        batch_size, seqlen_q, heads = t.out.shape[0], t.out.shape[1], t.out.shape[2]
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        batch = index // (heads * seqlen_q)
        head, pos = index % heads, (index // heads) % seqlen_q
        # This thread's group merges splits first, first + groups, ...; an idle thread's
        # share starts past the last split.
        first = tidx // self.per_row if tidx < self.working else t.num_splits
        col = tidx % self.per_row * VEC
        acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
        top, total = merge_splits(t.partial_out, t.partial_lse, (batch, batch_size, pos, head),
                                  col, first, t.num_splits, self.groups, SPLITS_BATCH, acc)
        tops = storage.top.get_tensor(cute.make_layout(self.groups))
        totals = storage.total.get_tensor(cute.make_layout(self.groups))
        sums = storage.acc.get_tensor(cute.make_layout((VEC, THREADS)))
        for j in cutlass.range_constexpr(VEC):
            sums[j, tidx] = acc[j]
        if col == 0 and tidx < self.working:
            tops[tidx // self.per_row] = top
            totals[tidx // self.per_row] = total
        cute.arch.sync_threads()
        if tidx < self.per_row:
            best = -cutlass.Float32.inf
            for g in cutlass.range_constexpr(self.groups):
                best = cute.arch.fmax(best, tops[g])
            safe = cutlass.Float32(0.0) if best == -cutlass.Float32.inf else best
            total = cutlass.Float32(0.0)
            acc.fill(0.0)
            for g in cutlass.range_constexpr(self.groups):
                weight = cute.math.exp(tops[g] - safe, fastmath=True)
                total = total + totals[g] * weight
                for j in cutlass.range_constexpr(VEC):
                    acc[j] = acc[j] + sums[j, g * self.per_row + tidx] * weight
            inverse = cutlass.Float32(0.0) if total == 0.0 else 1.0 / total
            dst = cute.local_tile(t.out[batch, pos, head, None], (VEC,), (col // VEC,))
            dst.store((acc.load() * inverse).to(self.dtype))
            if col == 0:
                t.lse[batch, head, pos] = safe + cute.math.log(total, fastmath=True)
