"""Shared-memory tile layouts, register-fragment views, and the 16-byte row copies between
global and shared memory.

The three shared-memory layouts are the seeds' kernel-1/kernel-2 story in CuTe terms:

* ``none``: plain row-major rows of ``head_dim`` halves. Rows are 128 or 256 bytes, so the eight
  row addresses of one ``ldmatrix`` phase all start in the same 16-byte bank group: 8-way conflicts.
* ``xor``: the 16-byte chunk index is XORed with ``row % 8`` inside each 8-row x 64-column atom
  (``Swizzle<3,3,3>``), so the eight rows of a phase land in eight different bank groups. Head
  dims that are not a multiple of 64 (32, 96) use 32-column atoms (``Swizzle<2,3,3>``).
* ``pad8``: each row is padded by 8 halves (16 bytes), which shifts consecutive rows by one bank
  group: also conflict-free, at the price of 16 bytes of shared memory per row.
"""

from __future__ import annotations

import cutlass.cute as cute


def atom_cols(head_dim: int) -> int:
    """Columns of one swizzle atom: 64 halves (128 bytes, all 8 bank groups) when the head dim
    allows, else 32."""
    return 64 if head_dim % 64 == 0 else 32


def _xor_bits(head_dim: int) -> int:
    """log2 of the 16-byte chunks per swizzle-atom row: 8 chunks (64 columns) or 4 (32)."""
    return 3 if atom_cols(head_dim) == 64 else 2


def smem_tile_layout(swizzle: str, rows: int, head_dim: int, stages: int = 1):
    """Layout of ``stages`` tiles of ``rows x head_dim`` 16-bit elements in shared memory,
    as ``(rows, head_dim, stages)``."""
    if swizzle == "xor":
        cols = atom_cols(head_dim)
        atom = cute.make_composed_layout(
            cute.make_swizzle(_xor_bits(head_dim), 3, 3),
            0,
            cute.make_layout((8, cols), stride=(cols, 1)),
        )
        return cute.tile_to_shape(atom, (rows, head_dim, stages), (0, 1, 2))
    row_elems = head_dim + (8 if swizzle == "pad8" else 0)
    return cute.make_layout((rows, head_dim, stages),
                            stride=(row_elems, 1, rows * row_elems))


def transposed(tile: cute.Tensor, rows: int, cols: int, stages: int | None = None
               ) -> cute.Tensor:
    """The (cols, rows[, stages]) view of a (rows, cols[, stages]) shared-memory tile."""
    if stages is None:
        return cute.composition(tile, cute.make_layout((cols, rows), stride=(rows, 1)))
    return cute.composition(tile, cute.make_layout((cols, rows, stages),
                                                   stride=(rows, 1, rows * cols)))


def tma_swizzle(head_dim: int):
    """The ``xor`` layout's swizzle on byte addresses, the form the TMA unit (``SWIZZLE_128B``
    or ``_64B``) and a swizzled shared-memory pointer take.

    ``smem_tile_layout`` swizzles element offsets: chunk bits 3.. of the offset XOR row bits
    6... For 2-byte elements the same bits of the byte address sit one higher, so
    ``Swizzle<b, 3, 3>`` on elements is ``Swizzle<b, 4, 3>`` on bytes: one physical layout.
    """
    return cute.make_swizzle(_xor_bits(head_dim), 4, 3)


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an MMA accumulator as ``(rows, cols)`` of this thread.

    ``mma.sync`` m16n8: ``((2, 2), MMA_M, MMA_N)``, value mode ``(c, r)`` = column pair ``c`` of
    row half ``r``. ``wgmma`` m64nN: ``((2, 2, N / 8), MMA_M, MMA_N)``, the same pair and half
    and then the n8 tile. Regrouping ``(r, MMA_M)`` as rows and the rest as columns lets the
    softmax walk one row at a time; either way a row's columns sit in the 4 lanes of a quad.
    """
    flat = cute.make_layout(acc.layout.shape)
    value_shape, value_stride = flat.shape[0], flat.stride[0]
    cols = ((value_shape[0], *value_shape[2:], flat.shape[2]),
            (value_stride[0], *value_stride[2:], flat.stride[2]))
    mn = cute.make_layout(
        ((value_shape[1], flat.shape[1]), cols[0]),
        stride=((value_stride[1], flat.stride[1]), cols[1]),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Reuse the S accumulator's registers as the A operand of the P @ V MMA.

    An m16n8k16 A fragment spans 16 columns, i.e. two n8 accumulator tiles:
    ``(4, MMA_M, MMA_N)`` becomes ``((4, 2), MMA_M, MMA_N / 2)``. No data moves (the seeds'
    observation that P never needs a register copy).
    """
    divided = cute.logical_divide(acc.layout, (None, None, 2))
    view = cute.make_layout(
        ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1]),
        stride=((divided.stride[0], divided.stride[2][0]), divided.stride[1],
                divided.stride[2][1]),
    )
    return cute.make_tensor(acc.iterator, view)


def acc_as_wgmma_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Reuse a ``wgmma`` accumulator's registers (converted to 16 bits) as the register A
    operand of the next ``wgmma``.

    A k16 slice of the A operand holds, per thread, a column pair of two row halves in two
    n8 tiles: ``((2, 2, N / 8), MMA_M, MMA_N)`` becomes ``((2, 2, 2), MMA_M, N / 16 * MMA_N)``
    (the n8 tiles split as (tile in the k16 slice, slice)). As with ``mma.sync``, no value
    moves between registers or lanes.
    """
    shape, stride = acc.layout.shape, acc.layout.stride
    (c, r, tiles), (dc, dr, dt) = shape[0], stride[0]
    view = cute.make_layout(
        ((c, r, 2), shape[1], (tiles // 2, shape[2])),
        stride=((dc, dr, dt), stride[1], (2 * dt, stride[2])),
    )
    return cute.make_tensor(acc.iterator, view)


#: Bits moved by one thread per gmem<->smem copy instruction (16 bytes = 8 halves).
COPY_BITS = 128


def row_copy(atom: cute.CopyAtom, num_threads: int, head_dim: int) -> cute.TiledCopy:
    """``num_threads`` threads copying (rows, ``head_dim``) tiles ``COPY_BITS`` at a time:
    one swizzle atom's width per group of threads, so a group covers whole 16-byte chunks of
    the rows it copies."""
    elems_per_copy = COPY_BITS // atom.value_type.width
    threads_per_row = atom_cols(head_dim) // elems_per_copy
    thr_layout = cute.make_layout((num_threads // threads_per_row, threads_per_row),
                                  stride=(threads_per_row, 1))
    return cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, elems_per_copy)))
