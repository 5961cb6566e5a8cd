"""What every forward kernel class shares: its spec, and the launch's ``__call__`` prologue.

A kernel class subclasses :class:`ForwardKernel`, takes a ``kernels.abi.ForwardSpec`` and
implements ``launch``: the host-side layouts, copy atoms and MMAs of its architecture, and the
launch itself. ``__call__`` is the one place that spells out the launch ABI
(``kernels.abi.ForwardArgs``) and turns the launch's tensors into the (batch, row, head, d)
views both kernels index (``tensors.problem_tensors``).
"""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import ForwardArgs
from attnlab.kernels.common.tensors import element_type, problem_tensors
from attnlab.kernels.common.tile_scheduler import DSL_OPS, TileScheduler, heads_per_section


class AttentionKernel:
    """What a forward or backward kernel class reads off its spec: the config (checked for
    the head dim), head dim, element type and variant flags."""

    def __init__(self, spec):
        spec.config.check_problem(spec.head_dim, arch=None)
        self.cfg = spec.config
        self.head_dim = spec.head_dim
        self.dtype = element_type(spec.dtype)
        self.windowed = spec.windowed
        self.varlen = spec.varlen


class ForwardKernel(AttentionKernel):
    """Compile-time description of one forward kernel (a ``ForwardSpec``)."""

    def __init__(self, spec):
        super().__init__(spec)
        self.splits_tail = spec.splits_tail

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
        tile_counter: cute.Tensor | None,
        scratch: cute.Tensor | None,
        stream: cuda.CUstream,
    ):
        """Launch on the arguments of ``kernels.abi.ForwardArgs`` (and the stream)."""
        num_seqs = cu_seqlens_q.shape[0] - 1 if self.varlen else q.shape[0]
        # The same arguments, the tensors as the kernels index them.
        views = ForwardArgs(*problem_tensors((q, k, v, out, lse), self.varlen), cu_seqlens_q,
                            cu_seqlens_k, softmax_scale, window_left, window_right,
                            max_seqlen_q, num_ctas, tile_counter, scratch)
        self.launch(views, num_seqs, stream)

    def launch(self, t: ForwardArgs, num_seqs: cutlass.Int32, stream: cuda.CUstream):
        """Build the kernel's layouts and launch it (traced inside ``__call__``). ``t`` holds
        (batch, row, head, d) views of q/k/v/out and a (batch, head, row) view of the LSE;
        ``num_seqs`` is the batch, or the packed sequences of ``cu_seqlens``."""
        raise NotImplementedError

    def tile_scheduler(self, num_m_blocks, num_seqs, num_heads, heads_per_kv, kv_rows,
                       persistent: bool) -> TileScheduler:
        """The launch's tile scheduler, as the kernel builds it (a masked ``lpt`` launch sizes
        its L2 sections from ``kv_rows``, the K/V tensor's rows: a sequence's, or all packed
        ones; a ``split_tail`` launch counts its tiles' K/V blocks from them)."""
        section = None
        if cutlass.const_expr(self.windowed and self.cfg.lpt):
            if cutlass.const_expr(self.varlen):
                kv_rows = cutlass.max(kv_rows // num_seqs, 1)
            section = heads_per_section(kv_rows, 2 * self.head_dim * self.dtype.width // 8,
                                        heads_per_kv, self.cfg.l2_section_mb << 20, DSL_OPS)
        split_blocks = None
        if cutlass.const_expr(self.splits_tail):
            split_blocks = cute.ceil_div(kv_rows, self.cfg.block_n)
        return TileScheduler(num_m_blocks, num_seqs, num_heads, persistent, self.windowed,
                             self.cfg.lpt, section, cluster=self.cfg.cluster_m,
                             split_blocks=split_blocks)


def shared_tile(dtype: type[cutlass.Numeric], layout) -> type:
    """A shared-storage field for one tile (or ring of tiles) of ``layout``: 1024-byte aligned,
    as the 128-byte swizzle and the TMA unit require."""
    return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]


def shared_storage(fields: dict[str, type]) -> type:
    """A shared-storage struct from ``{name: field type}``, in that order. (Built in plain
    Python: the DSL would turn a branch inside a class body into a dynamic one.)"""
    return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))
