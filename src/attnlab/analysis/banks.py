"""A static model of shared-memory bank conflicts (seed 001, seed 004 Observation W).

Shared memory has 32 banks of 4 bytes; a 4-byte word at byte address ``a`` lives in bank
``(a // 4) % 32``. A warp-wide access of ``w`` bytes per thread is served in phases of
``128 // w`` consecutive threads (16-byte accesses: 4 phases of 8 threads; 8-byte: 2 of 16;
4-byte: 1 of 32), ldmatrix in phases of 8 row addresses (one per 8x8 matrix). Within a phase,
threads reading the same word share it (broadcast), and a bank that must deliver ``n``
different words serialises them: the phase takes ``n`` wavefronts ("n-way conflict"). The
ideal is one wavefront per phase; the excess is what Nsight Compute's
``derived__memory_l1_wavefronts_shared_excessive`` counts (seed 001).

``from_config`` applies the model to every shared-memory access of the attnlab forward kernel,
so ``k01`` (row-major rows that are a multiple of 128 bytes: 8-way ldmatrix and 8-way 4-byte
fragment stores; 4-way with the 64- and 192-byte rows of head dims 32 and 96) and ``k02`` (XOR
swizzle: none) show kernel 2's reason in numbers.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnlab.config import FRAG_COLS, MMA_K, MMA_M, ConfigError, FlashConfig
from attnlab.gemm_config import MmaGemmConfig

BANKS = 32
BANK_BYTES = 4
#: Bytes a phase can move without conflicts: one 4-byte word from each bank.
PHASE_BYTES = BANKS * BANK_BYTES
#: A 16-byte chunk: one ldmatrix row address, one vector copy per thread, one bank group.
CHUNK_BYTES = 16
#: ldmatrix: one 8x8 matrix of 16-bit elements = 8 rows of 16 bytes, one phase per matrix.
MATRIX_ROWS = 8


#: CuTe's ``Swizzle<B, M, S>`` as the kernel uses it: M = S = 3 (16-byte chunks of 16-bit
#: elements; the bits XORed in start at element bit 6), B = log2 of the chunks per atom row.
SWIZZLE_BASE = 3


def xor_atom_cols(head_dim: int) -> int:
    """Columns of the kernel's swizzle atom: 64 halves (128 bytes, all 8 bank groups) when the
    head dim allows, else 32 (``kernels/common/layouts.py``, ``atom_cols``)."""
    return 64 if head_dim % 64 == 0 else 32


@dataclass(frozen=True)
class SmemLayout:
    """Where element ``(row, col)`` of a 2-D tile of 16-bit elements sits in shared memory.

    Row-major with a row stride of ``row_elems`` (``cols`` plus any padding), or, with
    ``swizzle_bits`` = B > 0, CuTe's ``Swizzle<B,3,3>`` over atoms of 8 rows x ``atom_cols``
    tiled down the rows first (``tile_to_shape`` order (0, 1)): bits [6, 6 + B) of the element
    offset are XORed into bits [3, 3 + B), the 16-byte chunk index. With 64-column atoms that
    is chunk XOR ``row % 8``.
    """

    rows: int
    cols: int
    elem_bytes: int = 2
    row_elems: int | None = None
    swizzle_bits: int = 0
    atom_cols: int = 64

    @property
    def stride(self) -> int:
        return self.cols if self.row_elems is None else self.row_elems

    def byte_offset(self, row: int, col: int) -> int:
        if not (0 <= row < self.rows and 0 <= col < self.cols):
            raise IndexError(f"({row}, {col}) outside a {self.rows}x{self.cols} tile")
        if not self.swizzle_bits:
            return (row * self.stride + col) * self.elem_bytes
        atom_col, col_in_atom = divmod(col, self.atom_cols)
        linear = (atom_col * self.rows + row) * self.atom_cols + col_in_atom
        mask = ((1 << self.swizzle_bits) - 1) << SWIZZLE_BASE
        return (linear ^ (linear >> SWIZZLE_BASE & mask)) * self.elem_bytes

    def describe(self) -> str:
        row_bytes = self.stride * self.elem_bytes
        if self.swizzle_bits:
            return (f"XOR swizzle (Swizzle<{self.swizzle_bits},3,3>, {self.atom_cols}-column "
                    f"atoms), {row_bytes}-byte rows")
        padding = (self.stride - self.cols) * self.elem_bytes
        return f"row-major, {row_bytes}-byte rows" + (f" ({padding} B padding)" if padding else "")


def layout_for(swizzle: str, rows: int, head_dim: int, elem_bytes: int = 2) -> SmemLayout:
    """The layout the kernel gives a ``rows x head_dim`` tile for a ``FlashConfig.swizzle``."""
    if swizzle == "xor":
        cols = xor_atom_cols(head_dim)
        chunks = cols * elem_bytes // CHUNK_BYTES
        return SmemLayout(rows, head_dim, elem_bytes, swizzle_bits=chunks.bit_length() - 1,
                          atom_cols=cols)
    pad = {"none": 0, "pad8": 8}[swizzle]
    return SmemLayout(rows, head_dim, elem_bytes, row_elems=head_dim + pad)


# ---------------------------------------------------------------------------------------------
# The bank model
# ---------------------------------------------------------------------------------------------
def phase_wavefronts(accesses: Iterable[tuple[int, int]]) -> int:
    """Wavefronts one phase needs: the most distinct words any bank must deliver.

    ``accesses`` are ``(byte_address, bytes)`` per thread of the phase.
    """
    words = {word for address, size in accesses
             for word in range(address // BANK_BYTES, -(-(address + size) // BANK_BYTES))}
    per_bank = Counter(word % BANKS for word in words)
    return max(per_bank.values(), default=0)


def warp_phases(addresses: Sequence[int], width: int) -> list[list[tuple[int, int]]]:
    """Split one warp instruction (one address per thread, ``width`` bytes each) into phases."""
    if width not in (4, 8, 16):
        raise ValueError(f"access width must be 4, 8 or 16 bytes, got {width}")
    per_phase = PHASE_BYTES // width
    return [[(a, width) for a in addresses[i:i + per_phase]]
            for i in range(0, len(addresses), per_phase)]


def instruction_ways(addresses: Sequence[int], width: int) -> list[int]:
    """Conflict ways (wavefronts) of each phase of one warp instruction."""
    return [phase_wavefronts(phase) for phase in warp_phases(addresses, width)]


# ---------------------------------------------------------------------------------------------
# Access patterns: the (row, col) each thread addresses in one warp instruction
# ---------------------------------------------------------------------------------------------
Coords = list[tuple[int, int]]


def ldmatrix_coords(row0: int, col0: int, num: int = 4) -> Coords:
    """Row addresses of ``ldmatrix.x{num}`` at a 16x16 (x4) tile origin, lane by lane.

    Lanes 8m..8m+7 give the rows of matrix m, matrices ordered (0,0), (8,0), (0,8), (8,8)
    (an A fragment; B fragments order them differently, which phases do not see). ``.trans``
    transposes in the register file and reads the same rows: same banks.
    """
    if num not in (1, 2, 4):
        raise ValueError(f"ldmatrix loads 1, 2 or 4 matrices, got {num}")
    origins = [(0, 0), (MATRIX_ROWS, 0), (0, MATRIX_ROWS), (MATRIX_ROWS, MATRIX_ROWS)][:num]
    return [(row0 + dr + r, col0 + dc) for dr, dc in origins for r in range(MATRIX_ROWS)]


def row_copy_coords(row0: int, col0: int, width: int, elem_bytes: int = 2,
                    threads_per_row: int = 8) -> Coords:
    """A warp copying rows: thread t covers ``width`` bytes at row t // threads_per_row.

    The kernel's gmem<->smem copies use 16 bytes and one thread per 16-byte chunk of a swizzle
    atom's width (8 threads per 64 columns, 4 per 32).
    """
    elems = width // elem_bytes
    return [(row0 + t // threads_per_row, col0 + elems * (t % threads_per_row))
            for t in range(32)]


def fragment_store_coords(row0: int, col0: int) -> Coords:
    """4-byte stores of an m16n8 accumulator half: lane l holds row l // 4, cols 2*(l % 4)."""
    return [(row0 + lane // 4, col0 + 2 * (lane % 4)) for lane in range(32)]


# ---------------------------------------------------------------------------------------------
# Statistics of one kind of access over a tile
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccessStats:
    """Bank behaviour of one kind of access, over the instructions one warp issues for it."""

    name: str
    width: int
    layout: str
    instructions: int
    wavefronts: int
    ideal_wavefronts: int
    max_ways: int
    #: Conflict ways per phase of the first instruction (all instructions of a kind agree in
    #: these layouts; ``max_ways`` covers them all).
    phase_ways: tuple[int, ...]

    @property
    def wavefronts_per_instruction(self) -> float:
        return self.wavefronts / self.instructions

    @property
    def ideal_per_instruction(self) -> float:
        return self.ideal_wavefronts / self.instructions

    @property
    def excess_wavefronts(self) -> int:
        return self.wavefronts - self.ideal_wavefronts

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self) | {
            "wavefronts_per_instruction": self.wavefronts_per_instruction,
            "ideal_per_instruction": self.ideal_per_instruction,
            "excess_wavefronts": self.excess_wavefronts}


def access_stats(name: str, layout: SmemLayout, instructions: Sequence[Coords],
                 width: int) -> AccessStats:
    """Wavefronts of a list of warp instructions (each a list of per-thread coordinates)."""
    if not instructions:
        raise ValueError(f"{name}: no instructions")
    ways = [instruction_ways([layout.byte_offset(r, c) for r, c in coords], width)
            for coords in instructions]
    return AccessStats(
        name=name, width=width, layout=layout.describe(), instructions=len(ways),
        wavefronts=sum(map(sum, ways)), ideal_wavefronts=sum(map(len, ways)),
        max_ways=max(map(max, ways)), phase_ways=tuple(ways[0]),
    )


def from_config(config: FlashConfig, head_dim: int, elem_bytes: int = 2) -> list[AccessStats]:
    """Every shared-memory access of the forward kernel, for the instructions of warp 0.

    Q, K and V arrive by 16-byte copies (cp.async or st.shared), Q and K leave by ldmatrix, V
    by ldmatrix.trans; O goes in as 4-byte fragment stores (into Q's space) and out again as
    16-byte reads for the global stores. The ``mma.sync`` kernel only: a ``wgmma`` config is
    refused (its tiles move by TMA and are read by the tensor cores through descriptors).
    """
    if config.wgmma:
        raise ConfigError("the bank model covers the mma.sync kernel's copies and ldmatrix; "
                          "a wgmma kernel's shared memory is written by TMA and read by wgmma")
    q = layout_for(config.swizzle, config.block_m, head_dim, elem_bytes)
    kv = layout_for(config.swizzle, config.block_n, head_dim, elem_bytes)
    store = "cp.async" if config.async_copy else "st.shared"
    # The kernel gives each swizzle atom's width of a row to a group of 16-byte copies.
    stretch = xor_atom_cols(head_dim)
    threads_per_row = stretch * elem_bytes // CHUNK_BYTES
    rows_per_pass = config.num_threads // threads_per_row

    def copies(rows: int) -> list[Coords]:
        return [row_copy_coords(r, c, CHUNK_BYTES, elem_bytes, threads_per_row)
                for r in range(0, rows, rows_per_pass) for c in range(0, head_dim, stretch)]

    def ldmatrix(slabs: range) -> list[Coords]:  # one x4 per 16 x 16 tile
        return [ldmatrix_coords(r, c) for r in slabs for c in range(0, head_dim, MMA_K)]

    # Warp 0's 16-row MMA slabs of Q/O: the warps take turns every 16 rows.
    q_slabs = range(0, config.block_m, MMA_M * config.num_warps)
    kv_slabs = range(0, config.block_n, MMA_K)
    fragments = [fragment_store_coords(r + half, c) for r in q_slabs
                 for half in (0, MATRIX_ROWS) for c in range(0, head_dim, FRAG_COLS)]
    return [
        access_stats(f"Q {store} (16 B)", q, copies(config.block_m), CHUNK_BYTES),
        access_stats(f"K {store} (16 B)", kv, copies(config.block_n), CHUNK_BYTES),
        access_stats(f"V {store} (16 B)", kv, copies(config.block_n), CHUNK_BYTES),
        access_stats("Q ldmatrix.x4", q, ldmatrix(q_slabs), CHUNK_BYTES),
        access_stats("K ldmatrix.x4", kv, ldmatrix(kv_slabs), CHUNK_BYTES),
        access_stats("V ldmatrix.x4.trans", kv, ldmatrix(kv_slabs), CHUNK_BYTES),
        access_stats("O fragment st.shared (4 B)", q, fragments, BANK_BYTES),
        access_stats("O ld.shared for global store (16 B)", q, copies(config.block_m),
                     CHUNK_BYTES),
    ]


def gemm_from_config(config: MmaGemmConfig, elem_bytes: int = 2) -> list[AccessStats]:
    """Every shared-memory access of the ``mma.sync`` HGEMM (``kernels/gemm/sm80.py``; the
    GEMM ladder's steps, the conv ladder's coordinate-table step), for warp 0: A's and B's
    16-byte copies into their ``block_k``-wide tiles, the fragments' reads (``ldmatrix.x4``,
    or 4-byte loads of value pairs without it), and with ``smem_epilogue`` C's 4-byte
    fragment stores and 16-byte reads back. The lab's Observation N in numbers: 64-byte rows
    put an ldmatrix phase's 8 rows on two bank groups (4-way), +8 halves of padding or the
    XOR swizzle spread them."""
    if not config.smem:
        raise ConfigError(f"{config.label()} loads its fragments from global memory: no "
                          f"shared-memory access to model")
    k = config.block_k
    a = layout_for(config.swizzle, config.block_m, k, elem_bytes)
    b = layout_for(config.swizzle, config.block_n, k, elem_bytes)
    threads_per_row = k * elem_bytes // CHUNK_BYTES
    store = "cp.async" if config.async_copy else "st.shared"

    def copies(rows: int, per_row: int) -> list[Coords]:
        """Warp 0's 16-byte row copies of a tile, ``per_row`` threads a row."""
        return [row_copy_coords(r, 0, CHUNK_BYTES, elem_bytes, per_row)
                for r in range(0, rows, config.num_threads // per_row)]

    # Warp 0's 16-row slabs of A and 16-column slabs of B (the warp grid's tiling).
    a_slabs = range(0, config.block_m, MMA_M * config.warps_m)
    b_slabs = range(0, config.block_n, MMA_K * config.warps_n)

    def fragments(slabs: range) -> list[Coords]:
        if config.ldmatrix:
            return [ldmatrix_coords(r, c) for r in slabs for c in range(0, k, MMA_K)]
        return [fragment_store_coords(r + dr, c + dc) for r in slabs for c in range(0, k, MMA_K)
                for dr in (0, MATRIX_ROWS) for dc in (0, MATRIX_ROWS)]

    read = ("ldmatrix.x4", CHUNK_BYTES) if config.ldmatrix else ("ld.shared (4 B)", BANK_BYTES)
    stats = [
        access_stats(f"A {store} (16 B)", a, copies(config.block_m, threads_per_row),
                     CHUNK_BYTES),
        access_stats(f"B {store} (16 B)", b, copies(config.block_n, threads_per_row),
                     CHUNK_BYTES),
        access_stats(f"A {read[0]}", a, fragments(a_slabs), read[1]),
        access_stats(f"B {read[0]}", b, fragments(b_slabs), read[1]),
    ]
    if config.smem_epilogue:
        c = layout_for(config.swizzle, config.block_m, config.block_n, elem_bytes)
        stats += [
            access_stats("C fragment st.shared (4 B)", c,
                         [fragment_store_coords(r + half, col) for r in a_slabs
                          for half in (0, MATRIX_ROWS)
                          for col in range(0, config.block_n, FRAG_COLS)], BANK_BYTES),
            access_stats("C ld.shared for global store (16 B)", c,
                         copies(config.block_m, config.block_n * elem_bytes // CHUNK_BYTES),
                         CHUNK_BYTES),
        ]
    return stats
