"""The route of the 2:4 structured-sparse HGEMM (``docs/gemm.md``): CuTe DSL 4.8.1's sparse warp
atom does not build, ``mma.sp.sync`` by inline PTX compiles on both targets."""

from __future__ import annotations

import pytest

cutlass = pytest.importorskip("cutlass")
import cutlass.cute as cute  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import warp  # noqa: E402
from cutlass.cutlass_dsl import T  # noqa: E402

from attnlab.analysis.sass import disassemble  # noqa: E402
from attnlab.jit import compile_vector_kernel, dumped_binary  # noqa: E402


def mma_sp_16832(a, b, e):
    """One ``mma.sp`` m16n8k32 (f16 in, f32 accumulated from zero) by inline PTX: a thread's
    four A words (the kept halves of its 2:4 groups), four B words and its metadata word."""
    zero = cutlass.Float32(0.0)
    result = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4),
        [x.ir_value() for x in (*a, *b, zero, zero, zero, zero, e)],
        "mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9,$10,$11}, {$12,$13,$14,$15}, $16, 0x0;",
        "=f,=f,=f,=f,r,r,r,r,r,r,r,r,f,f,f,f,r")
    return [cutlass.Float32(llvm.extractvalue(T.f32(), result, [i])) for i in range(4)]


@cute.kernel
def one_sparse_mma(a: cute.Tensor, b: cute.Tensor, e: cute.Tensor, c: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    d = mma_sp_16832([a[tid * 4], a[tid * 4 + 1], a[tid * 4 + 2], a[tid * 4 + 3]],
                     [b[tid * 4], b[tid * 4 + 1], b[tid * 4 + 2], b[tid * 4 + 3]], e[tid])
    c[tid * 4] = d[0]
    c[tid * 4 + 1] = d[1]
    c[tid * 4 + 2] = d[2]
    c[tid * 4 + 3] = d[3]


@cute.jit
def launch_one_warp(a: cute.Tensor, b: cute.Tensor, e: cute.Tensor, c: cute.Tensor, stream):
    one_sparse_mma(a, b, e, c).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_sparse_mma_by_inline_ptx_is_one_hmma_sp(arch, tmp_path):
    """One warp's ``mma.sp`` is one ``HMMA.SP.16832.F32``: the tensor-core instruction the 2:4
    kernel is built on, its metadata in a register of its own (the SASS's fifth operand)."""
    compile_vector_kernel(launch_one_warp, (cutlass.Int32,) * 3 + (cutlass.Float32,),
                          arch=arch, dump_dir=tmp_path)
    sass = disassemble(dumped_binary(tmp_path)[0])
    mmas = [line for line in sass.splitlines() if "MMA" in line]
    assert len(mmas) == 1 and "HMMA.SP.16832.F32" in mmas[0], mmas


@pytest.mark.xfail(raises=AttributeError, strict=True,
                   reason="CuTe DSL 4.8.1: cute_nvgpu has no MmaAtomSM80SparseType")
def test_dsl_sparse_warp_atom_builds():
    """Fails while the DSL's ``MmaF16BF16SparseOp`` cannot build its atom; a release that
    fixes it turns this into an unexpected pass, the sign to move the sparse kernel onto it."""
    op = warp.MmaF16BF16SparseOp(cutlass.Float16, cutlass.Float32, (16, 8, 32),
                                 warp.SparseMetadataFormat.TID)

    @cute.jit
    def build():
        cute.make_tiled_mma(op, (1, 1, 1))

    build()
