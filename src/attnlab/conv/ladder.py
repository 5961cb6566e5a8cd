"""The lab's convolution progression as named steps (``attnlab ladder --family conv``).

Each step is one way ``attnlab.conv.conv2d`` can run, in the lab's order: the direct FFMA
convolution, im2col + GEMM, implicit GEMM with precomputed coordinate tables on ``mma.sync``
(the lab's Insight 9: cp.async gathers, double buffered), then its Hopper form (the TMA unit's
im2col mode feeding ``wgmma``) on the GEMM dispatch's small tile, the lab's v2 recipe (a
larger tile with more warps, here two consumer warpgroups) and the 160-column tile that cuts
320 and 640 output channels into whole tiles. ``CONV_BASES`` names the step each is measured
against.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.conv.api import conv2d
from attnlab.gemm_config import GemmConfig, MmaGemmConfig

#: name -> (``conv2d`` options, what the step changes), in the lab's order.
CONV_STEPS: dict[str, tuple[dict[str, Any], str]] = {
    "c01": ({"algorithm": "direct"},
            "direct FFMA, one output a thread (x re-read R x S times per output channel)"),
    "c02": ({"algorithm": "im2col"}, "im2col + GEMM (the 9x matrix written and read back)"),
    "c03": ({"algorithm": "implicit",
             "config": MmaGemmConfig(block_n=64, warps_n=2, swizzle="xor")},
            "implicit GEMM, coordinate tables: mma.sync, cp.async gathers, 128 x 64 x 32"),
    "c04": ({"algorithm": "implicit", "config": GemmConfig(block_m=64, block_n=128)},
            "Hopper: A by the TMA im2col mode, wgmma, 64 x 128 tile"),
    "c05": ({"algorithm": "implicit", "config": GemmConfig(block_m=128, block_n=128)},
            "v2: 128 x 128 tile, two consumer warpgroups"),
    "c06": ({"algorithm": "implicit", "config": GemmConfig(block_m=128, block_n=160)},
            "128 x 160 tile: 320 / 640 channels in whole tiles"),
}
#: The step each step is measured against (its delta).
CONV_BASES = {"c02": "c01", "c03": "c02", "c04": "c03", "c05": "c04", "c06": "c05"}


def step_conv(name: str):
    """``conv(x, w, bias, stride, padding)`` running step ``name``."""
    options = CONV_STEPS[name][0]

    def conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: int,
             padding: int) -> torch.Tensor:
        return conv2d(x, w, bias, stride=stride, padding=padding, **options)

    return conv
