"""``attnlab bench --family conv``: ``attnlab.conv.conv2d`` against cuDNN (``F.conv2d`` on
channels-last tensors) at the lab's SD-UNet shapes, timed as the GEMM bench times (same
rounds, same rotating inputs, end to end and device only)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab.bench.gemm import L2_SPAN, MAX_SETS

#: (channels, height = width) of the SD-UNet's 3 x 3 convolutions the issue names.
SD_UNET = ((320, 64), (640, 32), (640, 16), (512, 16), (256, 32), (128, 64), (64, 64))


@dataclass(frozen=True)
class ConvPoint:
    n: int
    c: int
    hw: int
    k: int
    r: int = 3
    stride: int = 1
    padding: int = 1
    dtype: str = "bfloat16"

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.padding - self.r) // self.stride + 1

    @property
    def flops(self) -> float:
        return 2.0 * self.n * self.out_hw ** 2 * self.k * self.c * self.r * self.r

    def label(self) -> str:
        stride = f" s{self.stride}" if self.stride != 1 else ""
        return f"N{self.n} {self.c}->{self.k} {self.hw}^2 {self.r}x{self.r}{stride}"


def sd_unet_points(batches: tuple[int, ...] = (1, 4), dtype: str = "bfloat16"
                   ) -> list[ConvPoint]:
    return [ConvPoint(n, c, hw, c, dtype=dtype) for n in batches for c, hw in SD_UNET]


def conv_sets(point: ConvPoint, l2_bytes: int, seed: int = 0) -> list[tuple]:
    """``(x, w, bias, stride, padding)`` sets, channels-last, spanning ``L2_SPAN`` x L2."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, point.dtype)
    size = 2 * (point.n * point.c * point.hw ** 2 + point.k * point.c * point.r ** 2)
    count = max(1, min(MAX_SETS, math.ceil(L2_SPAN * l2_bytes / size)))
    sets = []
    for _ in range(count):
        x = torch.randn(point.n, point.c, point.hw, point.hw, device="cuda", dtype=dt,
                        generator=gen).to(memory_format=torch.channels_last)
        w = (torch.randn(point.k, point.c, point.r, point.r, device="cuda", dtype=dt,
                         generator=gen) / math.sqrt(point.c * point.r ** 2)
             ).to(memory_format=torch.channels_last)
        bias = torch.randn(point.k, device="cuda", dtype=dt, generator=gen)
        sets.append((x, w, bias, point.stride, point.padding))
    return sets


def conv_impls() -> dict[str, Callable]:
    """``cudnn`` (``F.conv2d``), ``attnlab`` (``attnlab.conv.conv2d``'s default: implicit GEMM
    where it runs), and the lab's earlier steps: ``im2col`` (+ GEMM) and ``direct`` (FFMA)."""
    from attnlab.conv import conv2d

    def step(algorithm: str) -> Callable:
        return lambda x, w, b, s, p: conv2d(x, w, b, stride=s, padding=p, algorithm=algorithm)

    return {"cudnn": lambda x, w, b, s, p: torch.nn.functional.conv2d(x, w, b, s, p),
            "attnlab": step("auto"), "im2col": step("im2col"), "direct": step("direct")}


#: (channels, height = width) of the ResBlocks timed (the SD-UNet's levels).
RESBLOCKS = ((320, 64), (640, 32), (640, 16))


@dataclass(frozen=True)
class ResBlockPoint:
    n: int
    c: int
    hw: int
    dtype: str = "bfloat16"

    @property
    def flops(self) -> float:
        """The two 3 x 3 convolutions' (the norms and the add are bandwidth, not FLOPs)."""
        return 2 * 2.0 * self.n * self.hw ** 2 * self.c * self.c * 9

    def label(self) -> str:
        return f"ResBlock N{self.n} C{self.c} {self.hw}^2"


def resblock_sets(point: ResBlockPoint, l2_bytes: int, seed: int = 0) -> list[tuple]:
    """``(x, norm1, conv1, norm2, conv2)`` sets as ``attnlab.conv.resblock`` takes them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, point.dtype)
    c = point.c

    def norm():
        return (1 + 0.1 * torch.randn(c, device="cuda", generator=gen),
                0.1 * torch.randn(c, device="cuda", generator=gen))

    def conv():
        w = torch.randn(c, c, 3, 3, device="cuda", generator=gen) / math.sqrt(9 * c)
        return (w.to(dt).to(memory_format=torch.channels_last),
                (0.1 * torch.randn(c, device="cuda", generator=gen)).to(dt))

    size = 2 * point.n * c * point.hw ** 2
    count = max(1, min(MAX_SETS, math.ceil(L2_SPAN * l2_bytes / size)))
    return [(torch.randn(point.n, c, point.hw, point.hw, device="cuda", dtype=dt,
                         generator=gen).to(memory_format=torch.channels_last),
             norm(), conv(), norm(), conv()) for _ in range(count)]


def torch_resblock(x, norm1, conv1, norm2, conv2, groups: int = 32):
    """The ResBlock in torch ops (the eager peer, and what ``torch.compile`` compiles)."""
    f = torch.nn.functional
    h = f.conv2d(f.silu(f.group_norm(x, groups, norm1[0].to(x.dtype), norm1[1].to(x.dtype))),
                 *conv1, padding=1)
    h = f.conv2d(f.silu(f.group_norm(h, groups, norm2[0].to(x.dtype), norm2[1].to(x.dtype))),
                 *conv2, padding=1)
    return x + h


def resblock_impls() -> dict[str, Callable]:
    """``eager`` (torch ops), ``compiled`` (``torch.compile`` of them) and ``attnlab``."""
    from attnlab.conv import resblock

    return {"eager": torch_resblock, "compiled": torch.compile(torch_resblock),
            "attnlab": resblock}
