"""Warpgroup MMA building blocks shared by the Hopper kernels (forward and backward)."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup
from cutlass.cute.nvgpu.tcgen05.helpers import smem_descriptor_to_int


def wgmma_gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor,
               tCrB: cute.Tensor, zero_init: bool, wait: bool = True) -> None:
    """``acc (+)= A @ B`` as one batch (commit group) of wgmma k-steps; with ``wait``, waited
    for before returning (the caller then reads ``acc`` or frees B's stage), else the caller
    waits with ``warpgroup.wait_group``."""
    # A fresh atom per call: its accumulate flag is runtime state, and setting it on the
    # tiled MMA inside a loop would leave that state defined in the loop's region.
    atom = cute.make_mma_atom(tiled_mma.op)
    warpgroup.fence()
    for k in range(cute.size(tCrA, mode=[2])):
        atom.set(warpgroup.Field.ACCUMULATE, not zero_init or k != 0)
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
    warpgroup.commit_group()
    if wait:
        warpgroup.wait_group(0)


def uniform_stage(state) -> cutlass.Int32:
    """A ring state's stage index, marked warp-uniform: the shared-memory descriptors of the
    stage's wgmma operands are then built in uniform registers (the loop-carried index alone
    does not tell ptxas so)."""
    return cute.arch.make_warp_uniform(state.index)


def wait_full(pipe, state, try_first: bool) -> None:
    """Wait until ring stage ``state`` of ``pipe`` holds its data; ``try_first``: one
    non-blocking try, and the waiting loop only where that fails
    (``FlashConfig.try_wait_first``)."""
    pipe.consumer_wait(state, pipe.consumer_try_wait(state) if try_first else None)


def smem_descriptor(fragment: cute.Tensor) -> cutlass.Int64:
    """The 64-bit shared-memory matrix descriptor at the start of a wgmma operand fragment (a
    slice of ``make_fragment_A`` / ``make_fragment_B`` of a shared-memory stage): what an
    instruction the DSL has no atom for (inline PTX) takes as its A or B operand."""
    return smem_descriptor_to_int(fragment.iterator)
