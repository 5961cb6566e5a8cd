"""The global-memory tensors of a forward launch, built from raw pointers, sizes and strides."""

import cutlass
import cutlass.cute as cute


def problem_tensors(q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer,
                    o_ptr: cute.Pointer, lse_ptr: cute.Pointer, q_shape: tuple, k_shape: tuple,
                    strides: tuple, lse_strides: tuple, head_dim: int,
                    static_strides: tuple | None = None) -> tuple:
    """``(mQ, mK, mV, mO, mLSE)``: Q/K/V/O as (batch, rows, heads, head_dim), LSE as
    (batch, head, row).

    ``strides`` are the (batch, row, head) strides of Q, K, V, O, multiples of 8 elements (what
    validation guarantees, stated so 16-byte copies vectorise); the head dim is contiguous.
    ``static_strides`` ((row, head) of each, or None) are compiled in instead of the given
    row and head strides (kernel 16).
    """

    def bshd(ptr, shape, st, which):
        row, head = cute.assume(st[1], divby=8), cute.assume(st[2], divby=8)
        if cutlass.const_expr(static_strides is not None):
            row, head = static_strides[which]
        return cute.make_tensor(ptr, cute.make_layout(
            (shape[0], shape[1], shape[2], head_dim),
            stride=(cute.assume(st[0], divby=8), row, head, 1)))

    mQ = bshd(q_ptr, q_shape, strides[0], 0)
    mK = bshd(k_ptr, k_shape, strides[1], 1)
    mV = bshd(v_ptr, k_shape, strides[2], 2)
    mO = bshd(o_ptr, q_shape, strides[3], 3)
    mLSE = cute.make_tensor(lse_ptr, cute.make_layout(
        (q_shape[0], q_shape[2], q_shape[1]), stride=(lse_strides[0], lse_strides[1], 1)))
    return mQ, mK, mV, mO, mLSE
