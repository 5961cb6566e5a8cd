"""Bulk (TMA-engine) copies that the CuTe DSL has no atom for."""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm


def bulk_reduce_add_f32(smem: cute.Pointer, gmem: cute.Pointer, num_bytes: int) -> None:
    """``gmem[0:n] += smem[0:n]`` (fp32) by the TMA engine, in this thread's bulk group: one
    instruction for a contiguous range (16-byte aligned, a multiple of 16 bytes), the adds done
    in L2, where per-element ``red`` instructions would each take an LSU slot and an L2
    transaction."""
    llvm.inline_asm(
        None, [gmem.llvm_ptr, smem.toint().ir_value(), cutlass.Int32(num_bytes).ir_value()],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT)
