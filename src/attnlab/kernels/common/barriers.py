"""Named hardware barriers (``bar.sync id, count``), one name per use, and the count at a
global counter by which CTAs find the last of them.

Barrier 0 is what ``__syncthreads`` (``cute.arch.sync_threads``) uses; a named barrier with its
own id synchronises a subset of the CTA's threads (e.g. only the consumer warpgroups) without
waiting for the others.
"""

from enum import IntEnum

import cutlass
import cutlass.cute as cute


class NamedBarrier(IntEnum):
    """The barrier ids the kernels use."""

    #: ``__syncthreads``: every thread of the CTA.
    CTA = 0
    #: The consumer warpgroups of the sm90 kernel, before one of them stores the staged O.
    EPILOGUE = 1
    #: Ping-pong turns of the sm90 kernel's consumer warpgroups at the tensor cores: the turn
    #: of consumer warpgroup ``w`` is barrier ``SCHEDULER + w`` (so ids 2 and 3).
    SCHEDULER = 2
    #: The backward's MMA warpgroups with a producer warp (``BackwardConfig.producer_warp``):
    #: dS^T written, K/V landed, the epilogue's staging.
    BACKWARD_MMA = 4
    #: A consumer warpgroup of the sm90 GEMM around its epilogue tile: barrier
    #: ``GEMM_EPILOGUE + w`` for consumer warpgroup ``w`` (so ids 5 to 7).
    GEMM_EPILOGUE = 5

    def sync(self, number_of_threads: int, offset=0) -> None:
        """Wait until ``number_of_threads`` threads (a multiple of 32) have arrived at barrier
        ``self + offset`` (``offset`` may be a runtime value, e.g. a warpgroup index)."""
        cute.arch.barrier(barrier_id=int(self) + offset, number_of_threads=number_of_threads)

    def arrive(self, number_of_threads: int, offset=0) -> None:
        """Arrive at barrier ``self + offset`` without waiting (the threads that ``sync``
        there count these arrivals toward ``number_of_threads``)."""
        cute.arch.barrier_arrive(barrier_id=int(self) + offset,
                                 number_of_threads=number_of_threads)


@cute.jit
def count_in(counters: cute.Tensor, counter, arrivals: cute.Tensor, slot, leader, last_count,
             barrier: NamedBarrier, threads: cutlass.Constexpr, offset=0) -> cutlass.Boolean:
    """Count a group of ``threads`` threads (at ``barrier + offset``) in at
    ``counters[counter]`` once their global writes are done; True for the group whose count
    is ``last_count`` (the last, where the counter started at zero), which then sees every
    group's writes. A release fence by each thread and the group's barrier order the writes
    before ``leader``'s one atomic add; its old value reaches the group through shared
    ``arrivals[slot]``; the last group's acquire fence orders the others' writes before its
    reads. Serial split-K (``kernels/gemm/sm90.py``) and the decoding's serial merge
    (``kernels/common/decode.py``) find the slice or split that sums the rest with it."""
    cute.arch.fence_acq_rel_gpu()
    barrier.sync(threads, offset)
    if leader:
        arrivals[slot] = cute.arch.atomic_add(counters.iterator + counter, cutlass.Int32(1),
                                              sem="acq_rel", scope="gpu")
    barrier.sync(threads, offset)
    last = arrivals[slot] == last_count
    if last:
        cute.arch.fence_acq_rel_gpu()
    return last
