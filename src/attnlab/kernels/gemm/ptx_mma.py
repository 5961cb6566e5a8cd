"""Tensor-core instructions CuTe DSL 4.8.1 has no atom for, as inline PTX on the fragments of
the dense m16n8k16 tiled MMA (``kernels/gemm/sm80.py``) or on the shared-memory descriptors of
the dense warpgroup MMA (``kernels/gemm/sm90.py``), the rounding and packing the online INT8
quantization needs, and the byte sums of INT8's zero-point term.

Both MMAs take operands whose thread layout is the dense 16-bit one: ``mma.sp`` m16n8k32's
compressed A is the dense A fragment of the kept halves and its B two dense k16 B fragments;
``mma`` m16n8k32 s8's A and B are the dense 16-bit fragments of the int8 tiles read as 16-bit
pairs. C and D are the m16n8 accumulator (c0, c1: row g, columns 2t and 2t + 1; c2, c3: row
g + 8), the order CuTe's accumulator fragments hold them in.
"""

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T


def _mma(ptx: str, out_type, outs: int, operands: list, constraints: str) -> list:
    result = llvm.inline_asm(llvm.StructType.get_literal([out_type()] * outs),
                             [x.ir_value() for x in operands], ptx, constraints)
    return [llvm.extractvalue(out_type(), result, [i]) for i in range(outs)]


def mma_sp_16832(a: list, b: list, c: list, e, ptx_dtype: str) -> list:
    """``d = A B + c`` for one 2:4 sparse m16n8k32 (``mma.sp``, sparsity selector 0): ``a`` the
    four 32-bit words of the kept halves' fragment, ``b`` B's four, ``c`` the four fp32
    accumulators, ``e`` the thread's metadata word; returns the four fp32 results."""
    d = _mma(f"mma.sp.sync.aligned.m16n8k32.row.col.f32.{ptx_dtype}.{ptx_dtype}.f32 "
             "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9,$10,$11}, {$12,$13,$14,$15}, $16, 0x0;",
             T.f32, 4, [*a, *b, *c, e], "=f,=f,=f,=f,r,r,r,r,r,r,r,r,0,1,2,3,r")
    return [cutlass.Float32(x) for x in d]


def wgmma_sp(acc: list, desc_a, desc_b, meta, n: int, ptx_dtype: str, b_mn_major: bool
             ) -> list:
    """``acc += A B`` for one 2:4 sparse m64 x ``n`` x k32 warpgroup MMA (``wgmma.mma_async.sp``,
    sparsity selector 0), issued and not waited for (the caller fences, commits and waits as
    for the dense ``wgmma``): ``acc`` the thread's ``n / 2`` fp32 accumulators in the dense
    wgmma's order, ``desc_a`` the shared-memory descriptor of the kept halves' 64 x 16 block
    (K-major), ``desc_b`` B's 32-deep block's, ``meta`` the thread's metadata word; returns
    the accumulators. Side-effecting, so that it stays between the fence and the commit."""
    regs = len(acc)
    d = ",".join(f"${i}" for i in range(regs))
    a, b, e, scale = (f"${2 * regs + i}" for i in range(4))
    ptx = ("{ .reg .pred p; setp.ne.b32 p, " + scale + ", 0;\n"
           f"wgmma.mma_async.sp.sync.aligned.m64n{n}k32.f32.{ptx_dtype}.{ptx_dtype} "
           f"{{{d}}}, {a}, {b}, {e}, 0, p, 1, 1, 0, {int(b_mn_major)}; }}")
    constraints = ",".join(["=f"] * regs + [str(i) for i in range(regs)]
                           + ["l", "l", "r", "r"])
    operands = [cutlass.Float32(x).ir_value() for x in acc] + [
        cutlass.Int64(desc_a).ir_value(), cutlass.Int64(desc_b).ir_value(),
        cutlass.Int32(meta).ir_value(), cutlass.Int32(1).ir_value()]
    result = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * regs), operands, ptx,
                             constraints, has_side_effects=True)
    return [cutlass.Float32(llvm.extractvalue(T.f32(), result, [i])) for i in range(regs)]


def retire_words(words: cute.Tensor, zero, loaded: cute.Tensor | None = None) -> None:
    """After the wait for the MMAs that read ``words`` (``wgmma.mma_async.sp``'s metadata
    registers): replace them by ``loaded`` (or keep them), as ``loaded | (words & zero)``.

    The sparse ``wgmma`` reads its metadata register after it issues, and ptxas does not count
    that register as in flight: to ptxas a word is dead once its MMA has issued, so a load
    issued under the MMA may take its register (measured: wrong sums past the first K tile).
    Reading each word here, against a runtime zero ptxas cannot fold (``zero``: ``%ctaid.z``
    of a one-dimensional grid), keeps it live, so in its register, until after the wait;
    ``analysis.sass.sparse_metadata_hazards`` checks the binary."""
    for i in range(cute.size(words)):
        new = words[i] if loaded is None else loaded[i]
        words[i] = cutlass.Int32(llvm.inline_asm(
            T.i32(), [cutlass.Int32(x).ir_value() for x in (new, words[i], zero)],
            "{ .reg .b32 t; and.b32 t, $2, $3; or.b32 $0, $1, t; }", "=r,r,r,r",
            has_side_effects=True))


def mma_s8_16832(a: list, b: list, c: list) -> list:
    """``d = A B + c`` for one int8 m16n8k32 (``mma``, s8 x s8, int32 accumulation): ``a`` A's
    four 32-bit words (16 int8), ``b`` B's two, ``c`` the four int32 accumulators."""
    d = _mma("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
             "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
             T.i32, 4, [*a, *b, *c], "=r,=r,=r,=r,r,r,r,r,r,r,0,1,2,3")
    return [cutlass.Int32(x) for x in d]


def quantize_s8x4(x: list, inverse) -> cutlass.Int32:
    """Four fp32 values times ``inverse``, rounded to the nearest integer (ties to even) and
    packed as four int8 (``x[0]`` in the low byte); the products must lie within +-127.

    No conversion instruction (F2I issues at a quarter of the FMA rate): ``fma(x, inverse,
    1.5 * 2**23)`` rounds to the integer grid of the floats in [2**23, 2**24), so the low byte
    of the result's bits is the rounded value's two's complement, and three byte permutes
    gather the four low bytes."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Float32(v).ir_value() for v in (*x, inverse)],
        "{ .reg .f32 t0, t1, t2, t3; .reg .b32 p0, p1;\n"
        "fma.rn.f32 t0, $1, $5, 0f4B400000; fma.rn.f32 t1, $2, $5, 0f4B400000;\n"
        "fma.rn.f32 t2, $3, $5, 0f4B400000; fma.rn.f32 t3, $4, $5, 0f4B400000;\n"
        "prmt.b32 p0, t0, t1, 0x0040; prmt.b32 p1, t2, t3, 0x0040;\n"
        "prmt.b32 $0, p0, p1, 0x5410; }", "=r,f,f,f,f,f"))


def add_s8x4(word, total) -> cutlass.Int32:
    """``total`` plus the four signed bytes of ``word`` (``dp4a`` against 0x01010101: one
    instruction where unpacking takes eight)."""
    return cutlass.Int32(llvm.inline_asm(
        T.i32(), [cutlass.Int32(word).ir_value(), cutlass.Int32(total).ir_value()],
        "dp4a.s32.s32 $0, $1, 0x01010101, $2;", "=r,r,r"))
