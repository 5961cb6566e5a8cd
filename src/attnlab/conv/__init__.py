"""The lab's convolution family (issue 23): NHWC conv2d as the lab's steps.

``conv2d(x, w, bias, stride, padding)`` takes channels-last tensors. Built so far: the lab's
second step, im2col + GEMM (the expanded input matrix times the flattened filters on
``attnlab.gemm.matmul``); the direct FFMA baseline, implicit GEMM, GroupNorm + SiLU and the
ResBlock chain are to come (``docs/conv.md``).
"""

from attnlab.conv.api import conv2d, im2col

__all__ = ["conv2d", "im2col"]
