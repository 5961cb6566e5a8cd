"""The lab's HGEMM progression as named configs (``attnlab ladder --family gemm``), and its
2:4 sparse one (``--family sparse``).

Each HGEMM step changes one knob of the ``mma.sync`` kernel (``kernels/gemm/sm80.py``) from the
step before it (``GEMM_BASES``), in the lab's order; the last step is the sm_90a ``wgmma``
kernel that ``attnlab.gemm.matmul`` runs. ``ladder_matmul`` launches any step. The sparse
steps (``SPARSE_STEPS``) put each sparse kernel beside the dense kernel it is built on, the
``mma.sync`` one and the ``wgmma`` one: the lab's Observation N (the sparse MMA at the dense
one's cost per instruction for twice the K) tested on each; ``sparse_step`` runs one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlab import device, kernel_cache
from attnlab.gemm.sparse import (
    SPARSE_CONFIG,
    SPARSE_WGMMA_CONFIG,
    WIDE_SPARSE_TILE,
    sparse_matmul,
)
from attnlab.gemm_config import GemmConfig, MmaGemmConfig
from attnlab.kernels.gemm.abi import GemmSpec

_G1 = MmaGemmConfig(warps_m=4, warps_n=2, smem=False, ldmatrix=False, async_copy=False,
                    stages=1, swizzle="none")
_G2 = _G1.replace(smem=True)
_G3 = _G2.replace(ldmatrix=True)
_G4 = _G3.replace(async_copy=True, stages=2)
_G5 = _G4.replace(warps_n=4)
_G6 = _G5.replace(block_n=256)
_G7 = _G6.replace(swizzle="pad8")

#: name -> (config, what the step changes), in the lab's order.
GEMM_STEPS: dict[str, tuple[MmaGemmConfig | GemmConfig, str]] = {
    "g01": (_G1, "fragments straight from global memory (8 warps, 128 x 128 x 32)"),
    "g02": (_G2, "tiles in shared memory (loads and stores through registers), 32-bit LDS"),
    "g03": (_G3, "ldmatrix fragments"),
    "g04": (_G4, "cp.async double buffering"),
    "g05": (_G5, "16 warps on 128 x 128"),
    "g06": (_G6, "128 x 256 tile"),
    "g07": (_G7, "+8 halves of padding per row"),
    "g07x": (_G6.replace(swizzle="xor"), "XOR swizzle instead of padding"),
    "g08": (_G7.replace(smem_epilogue=True), "C staged in shared memory, 16-byte stores"),
    "g09": (GemmConfig(split_k=1), "sm_90a: wgmma + TMA, warp-specialised, persistent"),
}
#: The step each step is measured against (its delta).
GEMM_BASES = {"g02": "g01", "g03": "g02", "g04": "g03", "g05": "g04", "g06": "g05",
              "g07": "g06", "g07x": "g06", "g08": "g07", "g09": "g08"}


def steps_for(arch: str) -> dict[str, tuple[MmaGemmConfig | GemmConfig, str]]:
    """The steps ``arch`` runs (the wgmma step only on sm_90a)."""
    return {name: step for name, step in GEMM_STEPS.items()
            if arch == "sm_90a" or isinstance(step[0], MmaGemmConfig)}


def ladder_matmul(a: torch.Tensor, b: torch.Tensor, config: MmaGemmConfig | GemmConfig
                  ) -> torch.Tensor:
    """``a @ b`` with a ladder step: the ``mma.sync`` kernel for whole tiles of K-major
    operands (``a`` row-major, ``b`` a transposed ``[N, K]`` weight), or ``matmul``.

    Raises:
        ValueError: shapes that are not whole tiles of the step, operands not K-major.
    """
    if isinstance(config, GemmConfig):
        from attnlab.gemm import matmul

        return matmul(a, b, config=config)
    (m, k), n = a.shape, b.shape[1]
    if m % config.block_m or n % config.block_n or k % config.block_k:
        raise ValueError(f"the ladder kernel takes whole tiles: {m} x {n} x {k} is not a "
                         f"multiple of {config.block_m} x {config.block_n} x {config.block_k}")
    if a.stride(1) != 1 or b.stride(0) != 1:
        raise ValueError("the ladder kernel takes K-major operands: a row-major, b = w.t()")
    dtype = str(a.dtype).removeprefix("torch.")
    spec = GemmSpec(config, device.info(a.device).arch, dtype, dtype, "k", "k")
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    kernel_cache.get(spec).fn(a, b, c, None, None, None, None, None, None, None, 1,
                              math.prod((m // config.block_m, n // config.block_n)))
    return c


#: The 2:4 sparse steps: name -> (config, A sparse, what the step changes); each runs on one
#: pruned A (dense steps multiply it as a dense matrix).
SPARSE_STEPS: dict[str, tuple[MmaGemmConfig | GemmConfig, bool, str]] = {
    "s01": (SPARSE_CONFIG, False, "mma.sync HGEMM, the sparse kernel's tile (128 x 256 x 64)"),
    "s02": (SPARSE_CONFIG, True, "mma.sp: A's kept halves, half the MMAs, per-row metadata"),
    "s03": (GemmConfig(split_k=1), False, "sm_90a dense: wgmma + TMA, warp-specialised"),
    "s04": (WIDE_SPARSE_TILE.replace(sparse_meta="global"), True,
            "wgmma.mma_async.sp (128 x 256 x 128), metadata words in load order"),
    "s05": (WIDE_SPARSE_TILE, True, "the same tile, metadata words by a TMA ring"),
    "s06": (SPARSE_WGMMA_CONFIG, True,
            "192 x 128 x 128: three ring stages, two slots of words by TMA"),
}
#: The step each sparse step is measured against (its delta).
SPARSE_BASES = {"s02": "s01", "s03": "s01", "s04": "s03", "s05": "s03", "s06": "s03"}


def sparse_step(name: str) -> Callable:
    """Step ``name`` of ``SPARSE_STEPS`` as a call on a sparse bench input set ``(a, sparse,
    semi, b)``: a pruned A, its ``Sparse24``, torch's form (unused) and B as ``w.t()``."""
    config, sparse, _ = SPARSE_STEPS[name]
    if sparse:
        return lambda a, s, semi, b: sparse_matmul(s, b, config=config)
    return lambda a, s, semi, b: ladder_matmul(a, b, config)


def sparse_steps_for(arch: str) -> dict[str, tuple[MmaGemmConfig | GemmConfig, bool, str]]:
    """The sparse steps ``arch`` runs (the wgmma ones only on sm_90a)."""
    return {name: step for name, step in SPARSE_STEPS.items()
            if arch == "sm_90a" or isinstance(step[0], MmaGemmConfig)}
