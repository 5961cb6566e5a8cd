"""The lab's convolution family (issue 23): NHWC conv2d as the lab's steps.

``conv2d(x, w, bias, stride, padding)`` takes channels-last tensors: by default the implicit
GEMM on sm_90 (the Hopper GEMM with A gathered by the TMA unit's im2col mode), else im2col +
GEMM; the direct FFMA baseline and the ``mma.sync`` implicit GEMM with coordinate tables by
``algorithm`` / ``config``; ``plan_label`` says which runs a call. ``group_norm_silu`` is
GroupNorm + SiLU in two stages over the whole GPU, and ``resblock`` chains them as the
SD-UNet's ResBlock (``docs/conv.md``).
"""

from attnlab.conv.api import conv2d, im2col, plan_label
from attnlab.conv.norm import group_norm_silu, resblock

__all__ = ["conv2d", "group_norm_silu", "im2col", "plan_label", "resblock"]
