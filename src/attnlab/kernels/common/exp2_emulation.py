"""2^x on the FMA pipe: an exponential that does not queue behind ``MUFU.EX2``.

At hd64 on Hopper a consumer warpgroup's softmax asks the special-function unit for one
``MUFU.EX2`` per score: 16 lanes a cycle per SM, so a 192 x 128 block's 24,576 exponentials
take as many cycles as its two GEMMs take the tensor cores (removing the exponentials made the
hd64 kernel 11-15 % faster, ``docs/ladder.md``, twenty-eighth session). FA4 moves a share of
them to the FMA pipe, whose 128 lanes a cycle are less busy; so does ``exp2`` here:

* split ``x = n + f`` with ``n`` the nearest integer and ``f`` in [-1/2, 1/2]: adding
  1.5 * 2^23 rounds ``x`` to an integer held in the sum's low mantissa bits (two ``FADD``\\ s
  recover ``n`` as a float and ``f``);
* ``2^f`` by a cubic (Horner, three ``FFMA``\\ s; coefficients fitted here for the least largest
  relative error on [-1/2, 1/2], 7.5e-5, far below a bf16 or fp16 P's rounding);
* ``2^n`` by adding ``n`` to the exponent field: the sum's bits shifted left by 23 are
  ``n << 23`` (the constant's own bits shift out), one integer add.

The input is clamped to -126 first, so every exponent stays in range (a score 126 binary
orders below its row's maximum gives ~1e-38 instead of its exact value, which a 16-bit P
rounds to nothing). Masked scores (-inf) would come out as that tiny value instead of 0, so
the softmax uses this only in blocks without a mask.
"""

import struct

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

#: 2^f ~ C0 + C1 f + C2 f^2 + C3 f^3 on [-1/2, 1/2] (fp32, largest relative error 7.5e-5).
COEFFICIENTS = (0.9999281167984009, 0.6932609677314758, 0.24261054396629333,
                0.05517132207751274)
#: 1.5 * 2^23: adding it rounds an fp32 of magnitude below 2^22 to an integer.
ROUNDING_CONSTANT = 12582912.0
CLAMP = -126.0


def _f32(value: float) -> str:
    """An fp32 immediate in PTX's hex form."""
    return "0f" + struct.pack(">f", value).hex().upper()


_C0, _C1, _C2, _C3 = (_f32(c) for c in COEFFICIENTS)
_PTX = (
    "{ .reg .f32 x, t, n, f, p; .reg .b32 tb, pb;\n"
    f"max.f32 x, $1, {_f32(CLAMP)};\n"
    # Explicit rounding: nothing may fuse or reassociate the split.
    f"add.rn.f32 t, x, {_f32(ROUNDING_CONSTANT)};\n"
    f"sub.rn.f32 n, t, {_f32(ROUNDING_CONSTANT)};\n"
    "sub.rn.f32 f, x, n;\n"
    f"fma.rn.f32 p, f, {_C3}, {_C2};\n"
    f"fma.rn.f32 p, p, f, {_C1};\n"
    f"fma.rn.f32 p, p, f, {_C0};\n"
    "mov.b32 tb, t;\n"
    "mov.b32 pb, p;\n"
    "shl.b32 tb, tb, 23;\n"
    "add.s32 pb, pb, tb;\n"
    "mov.b32 $0, pb; }"
)


def exp2_fma(x: cutlass.Float32) -> cutlass.Float32:
    """2^x for x <= 0 (as a softmax's exponents are) on the FMA and integer pipes."""
    return cutlass.Float32(llvm.inline_asm(T.f32(), [cutlass.Float32(x).ir_value()], _PTX,
                                           "=f,f"))
