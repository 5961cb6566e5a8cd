"""What both GEMM kernel classes share: the spec and its element types, the launch's
``__call__`` prologue (the ABI of ``kernels.gemm.abi.GemmArgs``, spelled out once), and A's
K step (halved when A is 2:4 sparse)."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from attnlab.kernels.common.tensors import element_type
from attnlab.kernels.gemm.abi import GemmArgs, GemmSpec


class GemmKernel:
    """Compile-time description of one GEMM kernel (a ``GemmSpec``); a subclass implements
    ``launch``."""

    def __init__(self, spec: GemmSpec):
        self.spec = spec
        self.cfg = spec.config
        self.dtype = element_type(spec.dtype)
        self.out_dtype = element_type(spec.out_dtype)
        #: Columns of A's K tiles: its kept halves only when A is 2:4 sparse.
        self.a_block_k = self.cfg.block_k // 2 if spec.sparse else self.cfg.block_k

    @cute.jit
    def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor,
                 workspace: cute.Tensor | None, counters: cute.Tensor | None,
                 scale_a: cute.Tensor | None, scale_b: cute.Tensor | None,
                 zero_b: cute.Tensor | None, bias: cute.Tensor | None,
                 meta: cute.Tensor | None,
                 num_splits: cutlass.Int32, num_ctas: cutlass.Int32, stream: cuda.CUstream):
        """Launch on the arguments of ``GemmArgs`` (and the stream)."""
        self.launch(GemmArgs(a, b, c, workspace, counters, scale_a, scale_b, zero_b, bias,
                             meta, num_splits, num_ctas), stream)

    def launch(self, t: GemmArgs, stream: cuda.CUstream):
        """Build the kernel's layouts and launch it (traced inside ``__call__``)."""
        raise NotImplementedError

