"""Values that ptxas must recompute in every iteration of a loop instead of keeping them.

A thread's shared-memory store addresses into a swizzled tile depend only on its thread
index, so ptxas computes them once before a loop and keeps them for the whole loop: in the
Hopper backward, nine such registers beside the five GEMMs' accumulators were spilled to
local memory in the prologue and reloaded in every query block, the reload right before its
use (docs/backward.md, step 14). Tying the index to the loop's counter through an operation
ptxas cannot fold makes everything computed from it loop-variant: ptxas recomputes the
addresses where they are used (a few integer instructions per block) and their registers
are free in between.
"""

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T


def per_iteration(value, counter) -> cutlass.Int32:
    """``value`` (an Int32), as a fresh value in each iteration of the loop whose counter is
    ``counter`` (a non-negative Int32): ``value + (counter >> 31)``, the shift done in
    inline PTX so that neither LLVM nor ptxas sees that it is zero."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Int32(x).ir_value() for x in (value, counter)],
        "{ .reg .b32 t; shr.s32 t, $2, 31; add.s32 $0, $1, t; }", "=r,r,r",
        has_side_effects=True))
