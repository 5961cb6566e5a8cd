"""Named hardware barriers (``bar.sync id, count``), one name per use.

Barrier 0 is what ``__syncthreads`` (``cute.arch.sync_threads``) uses; a named barrier with its
own id synchronises a subset of the CTA's threads (e.g. only the consumer warpgroups) without
waiting for the others.
"""

from enum import IntEnum

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
