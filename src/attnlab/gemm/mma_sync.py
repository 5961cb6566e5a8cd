"""Calls of the ``mma.sync`` kernel's library forms (``kernels/gemm/sm80.py``: 2:4 sparse A,
online INT8): operands padded to whole tiles in the K-major layout the kernel copies in
16-byte chunks, one CTA per output tile, the result sliced back."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnlab import device, kernel_cache
from attnlab.config import SMEM_CAPACITY
from attnlab.kernels.gemm.abi import GemmSpec


def check_b(b: object, name: str, dtype: torch.dtype, device: torch.device, k: int) -> None:
    """``b`` as the right operand of ``name`` (``dtype``, ``device``, ``k`` columns): a CUDA
    matrix of the same dtype and device with ``k`` rows.

    Raises:
        TypeError: not a 2-D tensor, or another dtype.
        ValueError: other rows, devices, or not on a GPU.
    """
    if not isinstance(b, torch.Tensor) or b.dim() != 2:
        raise TypeError("b must be a 2-D torch.Tensor")
    if b.dtype != dtype:
        raise TypeError(f"{name} and b must share one dtype, got {dtype} and {b.dtype}")
    if b.shape[0] != k:
        raise ValueError(f"{name} @ b needs b to have {name}'s {k} columns as rows, got "
                         f"{tuple(b.shape)}")
    if b.device != device or device.type != "cuda":
        raise ValueError(f"{name} and b must be on one CUDA device, got {device} and "
                         f"{b.device}")


def arch_of(t: torch.Tensor, what: str) -> str:
    """The arch of ``t``'s GPU, which must run ``mma.sync`` kernels (sm80 and newer).

    Raises:
        NotImplementedError: an older GPU.
    """
    info = device.info(t.device)
    if info.arch not in SMEM_CAPACITY:
        raise NotImplementedError(f"{what} runs on sm80 and newer GPUs; {info.name} is "
                                  f"{info.arch}")
    return info.arch


def k_major(t: torch.Tensor, rows: int, cols: int, value: int = 0, align: int = 16
            ) -> torch.Tensor:
    """``t`` (``[r, c]``, K along ``c``) padded with ``value`` to ``[rows, cols]`` with rows
    that are contiguous and start on ``align``-byte boundaries (16: the kernel's ``cp.async``
    chunks); ``t`` itself when it already is."""
    width = t.element_size()
    if (t.shape == (rows, cols) and t.stride(1) == 1 and t.stride(0) * width % align == 0
            and t.data_ptr() % align == 0):
        return t
    return F.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]), value=value).contiguous()


def run_tiles(spec: GemmSpec, a: torch.Tensor, b_t: torch.Tensor, meta: torch.Tensor | None,
              m: int, n: int) -> torch.Tensor:
    """C ``[m, n]`` of ``spec``'s kernel on ``a`` and ``b_t`` (``[N', K']``, B as a transposed
    weight), both already whole tiles of ``spec.config``."""
    cfg = spec.config
    c = torch.empty((a.shape[0], b_t.shape[0]), dtype=getattr(torch, spec.out_dtype),
                    device=a.device)
    kernel_cache.get(spec).fn(a, b_t.t(), c, None, None, None, None, None, None, meta, 1,
                              math.prod(c.shape) // (cfg.block_m * cfg.block_n))
    return c[:m, :n] if c.shape != (m, n) else c


def tiles(length: int, tile: int) -> int:
    """``length`` rounded up to whole ``tile``s."""
    return -(-length // tile) * tile
