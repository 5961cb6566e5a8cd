"""The lab's convolution family (issue 23): NHWC conv2d as the lab's steps.

``conv2d(x, w, bias, stride, padding)`` takes channels-last tensors. Built so far: the lab's
second step, im2col + GEMM (the expanded input matrix times the flattened filters on
``attnlab.gemm.matmul``), ``group_norm_silu`` as one kernel, and ``resblock`` chaining them;
the direct FFMA baseline and implicit GEMM are to come (``docs/conv.md``).
"""

from attnlab.conv.api import conv2d, im2col
from attnlab.conv.norm import group_norm_silu, resblock

__all__ = ["conv2d", "group_norm_silu", "im2col", "resblock"]
