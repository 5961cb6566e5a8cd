"""``attnlab.gemm.online``: the online FP16 -> INT8 GEMM (the lab's Insights 21-22).

``online_int8_matmul(a, b)`` takes fp16/bf16 operands and quantizes them inside the kernel, per
K tile of 64: each row of A's tile and each column of B's gets the scale ``max |x| / 127`` of
its own 64 values, its values are rounded to int8 (to nearest, ties to even), the tile is
multiplied with s8 MMAs (exact int32 sums), and the sums times the two scales go into an fp32
accumulator (``kernels/gemm/online_int8.py``). No int8 copy of the operands is ever stored.

``online_int8_reference`` is the same arithmetic in torch (fp64 sums): the kernel must match
it up to fp32 accumulation, and its distance to the exact product is the method's error
(``docs/gemm.md``: the per-tile rounding of both operands, 0.84 % relative Frobenius error
for Gaussian operands at K = 64 to 16k, 1.9 % with a column of outliers 50x in every 97).
"""

from __future__ import annotations

import torch

from attnlab.gemm.api import refuse_autograd
from attnlab.gemm.mma_sync import arch_of, check_b, k_major, run_tiles, tiles
from attnlab.gemm_config import MmaGemmConfig
from attnlab.kernels.gemm.abi import SPARSE_BLOCK_K, GemmSpec

#: The kernel's default tile: 128 x 128 x 64 on 8 warps of 64 x 32 (the int32 sums of a tile
#: sit beside the fp32 accumulator, so a warp's tile is half the HGEMM's).
ONLINE_CONFIG = MmaGemmConfig(block_m=128, block_n=128, block_k=SPARSE_BLOCK_K, warps_m=2,
                              warps_n=4, swizzle="xor")
_DTYPES = (torch.float16, torch.bfloat16)


def online_int8_reference(a: torch.Tensor, b: torch.Tensor, block_k: int = SPARSE_BLOCK_K
                          ) -> torch.Tensor:
    """The online INT8 product in torch, fp64: per K tile of ``block_k``, A's rows and B's
    columns quantized against their own largest magnitude, int sums, scaled and added."""
    (m, k), n = a.shape, b.shape[1]
    pad = -k % block_k
    a_tiles = torch.nn.functional.pad(a.double(), (0, pad)).reshape(m, -1, block_k)
    b_tiles = torch.nn.functional.pad(b.double().t(), (0, pad)).reshape(n, -1, block_k)

    def quantize(x):
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(x / torch.where(scale > 0, scale, 1)), scale

    qa, sa = quantize(a_tiles)
    qb, sb = quantize(b_tiles)
    sums = torch.einsum("mtk,ntk->tmn", qa, qb)
    return (sums * sa.permute(1, 0, 2) * sb.permute(1, 2, 0)).sum(dim=0)


def online_int8_matmul(a: torch.Tensor, b: torch.Tensor, *,
                       config: MmaGemmConfig | None = None) -> torch.Tensor:
    """``a @ b`` with both operands quantized to int8 per K tile inside the kernel (module
    docstring), in ``a``'s dtype.

    Args:
        a: ``[M, K]``, fp16 or bf16, on an sm80+ GPU.
        b: ``[K, N]``, ``a``'s dtype and device (any strides; B is read as a transposed
            ``[N, K]`` weight, copied so where it is not one of whole tiles).
        config: the ``mma.sync`` tile (``block_k`` 64, tiles in shared memory by ``cp.async``
            and ``ldmatrix``); default ``ONLINE_CONFIG``.

    Returns:
        ``[M, N]``, contiguous.

    Raises:
        RuntimeError: an input requires grad (no backward pass).
        TypeError: not tensors, dtypes other than fp16/bf16 or that differ.
        ValueError: shapes that do not multiply, tensors on other devices or not on a GPU.
        ConfigError: a config the kernel cannot build.
    """
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise TypeError("a must be a 2-D torch.Tensor")
    if a.dtype not in _DTYPES:
        raise TypeError(f"a is {a.dtype}; the online INT8 GEMM takes fp16 or bf16")
    refuse_autograd(a, b)
    check_b(b, "a", a.dtype, a.device, a.shape[1])
    (m, k), n = a.shape, b.shape[1]
    config = ONLINE_CONFIG if config is None else config
    dtype = str(a.dtype).removeprefix("torch.")
    spec = GemmSpec(config, arch_of(a, "online_int8_matmul"), dtype, dtype, "k", "k",
                    online_int8=True)
    k_tiles = tiles(k, config.block_k)
    return run_tiles(spec, k_major(a, tiles(m, config.block_m), k_tiles),
                     k_major(b.t(), tiles(n, config.block_n), k_tiles), None, m, n)
