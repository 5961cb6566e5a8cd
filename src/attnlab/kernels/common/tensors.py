"""The global-memory tensors of a forward launch, in the one view both kernels index.

A launch passes q/k/v/out as dense ``[B, S, H, D]`` or packed ``[total, H, D]`` tensors
(``kernels.abi``); the kernels index ``(batch, row, head, d)`` either way, a packed tensor
being a batch of one whose sequences ``cu_seqlens`` locate.

Offsets are 64-bit where a tensor may pass 2**31 elements: the batch stride (typed 64-bit in
the ABI) and a packed sequence's first row (``sequence_rows``). Within one batch element or
sequence the tile arithmetic stays 32-bit, which validation guarantees is enough.
"""

import cutlass
import cutlass.cute as cute

from attnlab.kernels.abi import STRIDE_DIVISIBILITY

_ELEMENT_TYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def element_type(dtype: str) -> type[cutlass.Numeric]:
    """The CuTe element type of a dtype name (``"float16"``, ``"bfloat16"``)."""
    return _ELEMENT_TYPES[dtype]


def _with_batch_mode(t: cute.Tensor) -> cute.Tensor:
    """A packed tensor as a batch of one (batch stride 0)."""
    return cute.make_tensor(t.iterator, cute.make_layout((1, *t.shape), stride=(0, *t.stride)))


def problem_tensors(q: cute.Tensor, k: cute.Tensor, v: cute.Tensor, out: cute.Tensor,
                    lse: cute.Tensor | None, varlen: bool) -> tuple:
    """``(mQ, mK, mV, mO, mLSE)``: Q/K/V/O as (batch, rows, heads, head_dim), the LSE as
    (batch, head, row) or None when the launch writes none."""
    tensors = (q, k, v, out, lse)
    if varlen:
        tensors = tuple(t if t is None else _with_batch_mode(t) for t in tensors)
    return tensors


@cute.jit
def sequence_rows(tensor: cute.Tensor, batch, start, head) -> cute.Tensor:
    """The (rows, head_dim) view of one sequence and head, starting at row ``start`` of its
    batch element: 0 (a Python int) for dense batches, a ``cu_seqlens`` entry for packed ones,
    whose row offset is taken in 64 bits (a packed tensor may pass 2**31 elements)."""
    rows = tensor[batch, None, head, None]
    if cutlass.const_expr(isinstance(start, int)):
        return cute.domain_offset((start, 0), rows)
    # A whole number of rows: as aligned as the row stride (validated multiple of 8).
    offset = cute.assume(cutlass.Int64(start) * cutlass.Int64(rows.stride[0]),
                         divby=STRIDE_DIVISIBILITY)
    return cute.make_tensor(rows.iterator + offset, rows.layout)
