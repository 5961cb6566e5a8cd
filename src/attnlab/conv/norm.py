"""``group_norm_silu`` (one fused kernel) and ``resblock``, the SD-UNet chain the lab timed:
GroupNorm + SiLU -> conv 3 x 3 -> GroupNorm + SiLU -> conv 3 x 3 -> residual add."""

from __future__ import annotations

import math

import torch

from attnlab import device, kernel_cache
from attnlab.conv.api import conv2d
from attnlab.gemm.api import refuse_autograd
from attnlab.kernels.conv.abi import GROUPNORM_THREADS, MAX_GROUP_WIDTH, GroupNormSiluSpec

_DTYPES = (torch.float16, torch.bfloat16)


def check_norm_inputs(x: object, groups: int, weight: object, bias: object) -> None:
    """Every input rule of ``group_norm_silu``, with the reason."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("x must be a 4-D tensor [N, C, H, W]")
    if x.dtype not in _DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; supported: float16, bfloat16")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("x must be channels-last (x.to(memory_format=torch.channels_last))")
    channels = x.shape[1]
    if not isinstance(groups, int) or groups < 1 or channels % groups:
        raise ValueError(f"groups must divide the {channels} channels, got {groups!r}")
    if channels // groups > MAX_GROUP_WIDTH:
        raise ValueError(f"groups of at most {MAX_GROUP_WIDTH} channels are supported, got "
                         f"{channels} channels in {groups} groups")
    for name, v in (("weight", weight), ("bias", bias)):
        if not isinstance(v, torch.Tensor) or v.shape != (channels,):
            raise ValueError(f"{name} must be a tensor of shape ({channels},)")


def group_norm_silu(x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor,
                    eps: float = 1e-5) -> torch.Tensor:
    """``silu(group_norm(x, groups, weight, bias, eps))`` of a channels-last image in one
    kernel (``kernels/conv/groupnorm.py``); the result is channels-last, in x's dtype.

    Raises:
        TypeError, ValueError: as ``check_norm_inputs`` says; RuntimeError: an input that
            requires grad (no backward pass).
    """
    refuse_autograd(x, weight, bias)
    check_norm_inputs(x, groups, weight, bias)
    n, channels, h, w = x.shape
    info = device.info(x.device)
    dtype = str(x.dtype).removeprefix("torch.")
    stats, apply = (kernel_cache.get(GroupNormSiluSpec(info.arch, dtype, channels // groups,
                                                       stage)).fn
                    for stage in ("stats", "apply"))
    chunk_pixels = group_chunk_pixels(n * groups, h * w, info.multiprocessors)
    partials = torch.empty((n * groups, math.ceil(h * w / chunk_pixels), 2),
                           dtype=torch.float32, device=x.device)
    y = torch.empty_like(x, memory_format=torch.channels_last)
    args = (image_rows(x), image_rows(y), weight.float().contiguous(),
            bias.float().contiguous(), partials, chunk_pixels, float(eps))
    stats(*args)
    apply(*args)
    return y


def group_chunk_pixels(image_groups: int, pixels: int, multiprocessors: int) -> int:
    """Pixels per chunk of a group: enough chunks for about four CTAs per SM, none with
    fewer pixels than a CTA has threads."""
    chunks = max(1, min(math.ceil(4 * multiprocessors / image_groups),
                        math.ceil(pixels / GROUPNORM_THREADS)))
    return math.ceil(pixels / chunks)


def image_rows(t: torch.Tensor) -> torch.Tensor:
    """A channels-last ``[N, C, H, W]`` image as the kernels' ``[N, H W, C]`` (a view)."""
    n, c, h, w = t.shape
    return t.permute(0, 2, 3, 1).reshape(n, h * w, c)


def resblock(x: torch.Tensor, norm1: tuple[torch.Tensor, torch.Tensor],
             conv1: tuple[torch.Tensor, torch.Tensor | None],
             norm2: tuple[torch.Tensor, torch.Tensor],
             conv2: tuple[torch.Tensor, torch.Tensor | None], groups: int = 32,
             eps: float = 1e-5) -> torch.Tensor:
    """``x + conv2(silu(gn2(conv1(silu(gn1(x))))))`` (3 x 3 convolutions, padding 1): the
    SD-UNet ResBlock without its time embedding. ``norm*`` are (weight, bias), ``conv*``
    (filters ``[C, C, 3, 3]``, bias or None)."""
    h = conv2d(group_norm_silu(x, groups, *norm1, eps), *conv1, stride=1, padding=1)
    h = conv2d(group_norm_silu(h, groups, *norm2, eps), *conv2, stride=1, padding=1)
    return x + h
