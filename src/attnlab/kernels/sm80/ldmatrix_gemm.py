"""The ``mma.sync`` kernel's GEMMs: its schedule of ``ldmatrix`` loads against the MMAs.

The seeds' kernels 4, 5 and 15 are all about this schedule: shared->register sub-tiles of a
few fragments interleaved with the MMAs (``*_frags_per_load``), the next sub-tile loaded
before the current one's MMAs (``double_buffer_smem_to_rf``), and O += P V in column chunks
of the head dim (``d_head_tile``). With ``interleave_softmax`` the softmax's exponentiation
of each slice of P is scheduled here too, right before that slice's MMAs.
"""

import cutlass
import cutlass.cute as cute

from attnlab.config import FRAG_COLS, MMA_K
from attnlab.kernels.common.softmax import OnlineSoftmax


def gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
         load_a, load_b, a_frags: int, b_frags: int, ahead: bool, b_chunks: int = 1,
         p_slices=None) -> None:
    """``acc += A @ B`` over the k-blocks (MMA_K = 16 columns) of the reduction dimension.

    ``load_a``/``load_b`` are ``(tiled_copy, smem_view, reg_view)`` for an operand that has
    to come from shared memory, or None when it already sits in registers. ``*_frags`` is
    the sub-tile size in 8-column fragments (0: the whole tile before the first MMA).
    With double buffering (``ahead``, kernel 5) the ldmatrix of the next sub-tile is issued
    before the MMAs of the current one, so shared-memory latency hides behind tensor-core
    work.

    ``b_chunks`` > 1 (kernel 15, A in registers) splits each B sub-tile into that many
    column chunks, loaded one after the other: a B sub-tile in registers is one chunk
    wide. The MMAs still walk k-block by k-block (all chunks of one k-block, then the
    next), so each k-block keeps every accumulator independent of the others.

    ``p_slices`` = (softmax, S accumulator, P fragment) makes A = P one k-block at a
    time, right before that k-block's MMAs (``interleave_softmax``).
    """
    if b_chunks > 1 and load_a is not None:
        raise ValueError("column chunks of B need A in registers (it is not reloaded)")
    num_k = cute.size(tCrA, mode=[2])
    plan = []
    for spec, frags in ((load_a, a_frags), (load_b, b_frags)):
        if spec is not None:
            step = num_k if frags == 0 else frags * FRAG_COLS // MMA_K
            # Sub-tiles in the order the MMAs first use them: (first k-block, chunk).
            chunks = b_chunks if spec is load_b else 1
            units = [(k, c) for k in range(0, num_k, step) for c in range(chunks)]
            plan.append((spec, step, chunks, units))
    if ahead:
        for spec, step, chunks, units in plan:
            load_ksteps(spec, units[0], step, chunks)
    for k in range(num_k):
        for c in range(b_chunks):
            for spec, step, chunks, units in plan:
                if k % step == 0 and c < chunks:
                    nxt = units.index((k, c)) + (1 if ahead else 0)
                    if nxt < len(units):
                        load_ksteps(spec, units[nxt], step, chunks)
            if cutlass.const_expr(p_slices is not None and c == 0):
                p_slice(*p_slices, k)
            if cutlass.const_expr(b_chunks == 1):
                cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
            else:
                # N split as (atoms of a chunk, chunks): one MMA call per chunk.
                atoms = cute.size(tCrB, mode=[1]) // b_chunks
                acc_c = cute.logical_divide(acc, (None, None, atoms))[None, None, (None, c)]
                tCrB_c = cute.logical_divide(tCrB, (None, atoms))[None, (None, c), k]
                cute.gemm(tiled_mma, acc_c, tCrA[None, None, k], tCrB_c, acc_c)


def p_slice(softmax: OnlineSoftmax, acc_S: cute.Tensor, rP: cute.Tensor, k: int) -> None:
    """P for k-block ``k`` of O += P V (``interleave_softmax``): exp2 of its S columns
    (two n8 tiles, two columns each per thread), converted to the input dtype."""
    tiles = MMA_K // FRAG_COLS
    softmax.exponentiate(acc_S, 2 * tiles * k, 2 * tiles)
    for n in range(tiles * k, tiles * (k + 1)):
        rP[None, None, n].store(acc_S[None, None, n].load().to(rP.element_type))


def load_ksteps(spec, unit: tuple[int, int], count: int, chunks: int) -> None:
    """ldmatrix ``count`` k-blocks from ``unit`` = (first k-block, column chunk of
    ``chunks``); a copy's column index runs along the operand's N columns in order."""
    tiled_copy, src, dst = spec
    first, chunk = unit
    per_chunk = cute.size(src, mode=[1]) // chunks
    for k in range(first, first + count):
        if chunks == 1:
            cute.copy(tiled_copy, src[None, None, k], dst[None, None, k])
        else:
            for j in range(chunk * per_chunk, (chunk + 1) * per_chunk):
                cute.copy(tiled_copy, src[None, j, k], dst[None, j, k])
