"""exp2 on the FMA pipe, for a share of the softmax's exponentials.

An SM's MUFU unit evaluates 16 ``ex2`` a clock against 128 FFMAs. At hd64 a 128 x 128 block
of S costs the tensor cores as many clocks (2 x 128 x 128 x 64 x 2 FLOP at 4,096 a clock)
as its 16,384 exponentials cost MUFU (1,024 each), so the two units must overlap perfectly
for the kernel to run at the MMA roof. Evaluating some exponentials with FMAs instead (FA4
does so on Blackwell) shortens MUFU's share at the cost of issue slots:

    2^x = 2^j * 2^f,  j = floor(x), f = x - j in [0, 1)

``j`` comes from one FADD rounding down against 1.5 * 2^23 + 127 (whose ulp is 1, so the
sum's low mantissa bits hold ``j + 127``, and those bits shifted into the exponent field are
the float ``2^j``), ``2^f`` from a degree-3 polynomial (3 FFMAs, Horner), and one FMUL joins
them. Nine instructions (a clamp, three FADDs, three FFMAs, a shift on the integer pipe, the
FMUL) replace one MUFU.EX2: worth it for a share of the elements only.

The polynomial is a relative-error minimax fit with ``p(0) = 1`` (fitted for attnlab): at
most 8.6e-5 relative error in fp32, below half an ulp of bf16 (2e-3) and of fp16 (4.9e-4),
the types P is rounded to before P V. Inputs below -127 (masked scores are -inf) are clamped
there, where ``2^j``'s bits are those of 0.0; a NaN stays NaN (the clamp keeps it, and its
shifted bits are -inf, whose product with the NaN polynomial is NaN), as MUFU's would.
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

#: 2^f ~ 1 + f (c1 + f (c2 + f c3)) on [0, 1).
POLY = (1.0, 0.6951165199279785, 0.2276461124420166, 0.07706601917743683)
#: 1.5 * 2^23 + 127: adding it to x in [-127, 128) leaves floor(x) + 127 in the sum's low bits
#: (its bits 0x4B40007F are the immediate of the rounding FADD).
ROUND_MAGIC = float(2**23 + 2**22 + 127)


def _asm(ptx: str, *operands: cutlass.Float32) -> cutlass.Float32:
    constraints = ",".join(["=f"] + ["f"] * len(operands))
    return cutlass.Float32(llvm.inline_asm(T.f32(), [x.ir_value() for x in operands], ptx,
                                           constraints))


def exp2_fma(x: cutlass.Float32) -> cutlass.Float32:
    """``2^x`` for ``x < 128`` without MUFU (relative error below 1e-4; 0 below -127)."""
    # Immediates, not operands: an "f" operand costs a MOV of the constant per call.
    x = _asm("max.NaN.f32 $0, $1, 0fC2FE0000;", x)  # -127
    rounded = _asm("add.rm.ftz.f32 $0, $1, 0f4B40007F;", x)  # ROUND_MAGIC
    fraction = x - (rounded - cutlass.Float32(ROUND_MAGIC))
    value = cutlass.Float32(POLY[-1])
    for coefficient in reversed(POLY[:-1]):
        value = value * fraction + cutlass.Float32(coefficient)
    power = _asm("{\n\t.reg .b32 r;\n\tmov.b32 r, $1;\n\tshl.b32 r, r, 23;\n\t"
                 "mov.b32 $0, r;\n\t}", rounded)
    return value * power
