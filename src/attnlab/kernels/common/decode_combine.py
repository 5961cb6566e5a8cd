"""The split-KV merge: a split decoding's partial outputs combined by their LSEs.

Split ``i`` of a row wrote ``O_i`` (normalised over its keys) and ``lse_i``; the row's output
is ``sum_i exp(lse_i - lse) O_i`` with ``lse = log sum_i exp(lse_i)``, computed against the
largest ``lse_i`` so no exponent overflows. A split that saw no key wrote ``lse_i = -inf``
and weighs 0; a row no split saw gets O = 0 and LSE = -inf, as the undivided kernel writes.
Each thread takes 4 consecutive elements of one row (16-byte loads of each partial).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import CombineArgs, CombineSpec
from attnlab.kernels.common.tensors import element_type

THREADS = 128
VEC = 4
SPLITS_UNROLL = 8


class DecodeCombine:
    """Compile-time description of the combine kernel of a ``CombineSpec``."""

    def __init__(self, spec: CombineSpec):
        self.dtype = element_type(spec.dtype)
        self.head_dim = spec.head_dim

    @cute.jit
    def __call__(self, partial_out: cute.Tensor, partial_lse: cute.Tensor, out: cute.Tensor,
                 lse: cute.Tensor, num_splits: cutlass.Int32, stream: cuda.CUstream):
        """Launch on the arguments of ``kernels.abi.CombineArgs`` (and the stream)."""
        t = CombineArgs(partial_out, partial_lse, out, lse, num_splits)
        rows = out.shape[0] * out.shape[1] * out.shape[2]
        per_cta = THREADS // (self.head_dim // VEC)
        self.kernel(t).launch(grid=[cute.ceil_div(rows, per_cta), 1, 1],
                              block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, t: CombineArgs):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        per_row = self.head_dim // VEC
        per_cta = THREADS // per_row
        batch_size, seqlen_q, heads = t.out.shape[0], t.out.shape[1], t.out.shape[2]
        index = bidx * per_cta + tidx // per_row
        col = tidx % per_row * VEC
        head = index % heads
        pos = (index // heads) % seqlen_q
        batch = index // (heads * seqlen_q)
        if tidx < per_cta * per_row and batch < batch_size:
            top = -cutlass.Float32.inf
            # Unrolled: the splits' loads are independent, and with many splits over few rows
            # a rolled loop waits out one memory latency per split.
            for i in cutlass.range(t.num_splits, unroll=SPLITS_UNROLL):
                top = cute.arch.fmax(top, t.partial_lse[i * batch_size + batch, head, pos])
            safe_top = cutlass.Float32(0.0) if top == -cutlass.Float32.inf else top
            total = cutlass.Float32(0.0)
            acc = cute.make_rmem_tensor((VEC,), cutlass.Float32)
            acc.fill(0.0)
            for i in cutlass.range(t.num_splits, unroll=SPLITS_UNROLL):
                split_row = i * batch_size + batch
                weight = cute.math.exp(t.partial_lse[split_row, head, pos] - safe_top,
                                       fastmath=True)
                total = total + weight
                part = cute.local_tile(t.partial_out[split_row, pos, head, None], (VEC,),
                                       (col // VEC,)).load()
                acc.store(acc.load() + part * weight)
            inverse = cutlass.Float32(0.0) if total == 0.0 else 1.0 / total
            dst = cute.local_tile(t.out[batch, pos, head, None], (VEC,), (col // VEC,))
            dst.store((acc.load() * inverse).to(self.dtype))
            if col == 0:
                t.lse[batch, head, pos] = safe_top + cute.math.log(total, fastmath=True)
