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

    def sync(self, number_of_threads: int) -> None:
        """Wait until ``number_of_threads`` threads (a multiple of 32) have arrived here."""
        cute.arch.barrier(barrier_id=int(self), number_of_threads=number_of_threads)
