"""``attnlab.conv.conv2d`` and its im2col step.

im2col writes, for every output pixel, the ``R x S x C`` input values its filter window covers
(zero outside the padded image) as one row of an ``(N P Q) x (R S C)`` matrix; the
convolution is then that matrix times the ``K x (R S C)`` filters, transposed: one GEMM. The
rows keep the channels-last order (filter row, filter column, channel), so the filters need
only a permute to match. The lab measured this against the direct convolution (which rereads
X nine times at 3 x 3) and against implicit GEMM (which never writes the matrix).
"""

from __future__ import annotations

import torch

from attnlab import device, kernel_cache
from attnlab.gemm import matmul
from attnlab.gemm.api import refuse_autograd
from attnlab.kernels.conv.abi import DirectConvSpec

_DTYPES = (torch.float16, torch.bfloat16)
#: Channels (of the input and of the output) must be a multiple of this: the GEMM's rows
#: are read and written in 16-byte units.
CHANNEL_MULTIPLE = 8


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def im2col(x_nhwc: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
           padding: tuple[int, int]) -> torch.Tensor:
    """The ``(N P Q) x (R S C)`` im2col matrix of an NHWC tensor (any device)."""
    (r, s), (sh, sw), (ph, pw) = kernel, stride, padding
    n, h, w, c = x_nhwc.shape
    padded = torch.nn.functional.pad(x_nhwc, (0, 0, pw, pw, ph, ph)).contiguous()
    p, q = output_size(h, r, sh, ph), output_size(w, s, sw, pw)
    sn, shh, sww, sc = padded.stride()
    windows = padded.as_strided((n, p, q, r, s, c), (sn, shh * sh, sww * sw, shh, sww, sc))
    return windows.reshape(n * p * q, r * s * c)


def check_conv_inputs(x: object, w: object, bias: object, stride: tuple[int, int],
                      padding: tuple[int, int]) -> None:
    """Every input rule of ``conv2d`` that needs no GPU, with the reason."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({'N, C, H, W' if name == 'x' else 'K, C, R, S'}"
                             f"), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16")
    if w.dtype != x.dtype:
        raise TypeError(f"x and w must share one dtype, got {x.dtype} and {w.dtype}")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("x must be channels-last (x.to(memory_format=torch.channels_last)): "
                         "the kernels read NHWC")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w has {w.shape[1]} input channels, x has {x.shape[1]}")
    for name, channels in (("input", x.shape[1]), ("output", w.shape[0])):
        if channels % CHANNEL_MULTIPLE:
            raise ValueError(f"{name} channels must be a multiple of {CHANNEL_MULTIPLE}, got "
                             f"{channels}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (w.shape[0],)):
        raise ValueError(f"bias must be a tensor of shape ({w.shape[0]},)")
    if min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"stride must be >= 1 and padding >= 0, got {stride} and {padding}")
    (r, s), (h, width) = w.shape[2:], x.shape[2:]
    if output_size(h, r, stride[0], padding[0]) < 1 or output_size(width, s, stride[1],
                                                                      padding[1]) < 1:
        raise ValueError(f"a {r} x {s} filter with stride {stride} and padding {padding} "
                         f"leaves no output of a {h} x {width} input")


#: The lab's steps ``conv2d`` can run (``algorithm``).
ALGORITHMS = ("im2col", "direct")


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 1, *,
           algorithm: str = "im2col") -> torch.Tensor:
    """2-D convolution of a channels-last ``x [N, C, H, W]`` with ``w [K, C, R, S]`` (as
    ``torch.nn.functional.conv2d``, no dilation or groups), fp32 accumulation.
    ``algorithm``: ``"im2col"`` (the matrix times the filters on ``attnlab.gemm``) or
    ``"direct"`` (the lab's FFMA baseline, ``kernels/conv/direct.py``).

    Returns:
        ``[N, K, P, Q]`` in x's dtype, channels-last.

    Raises:
        TypeError, ValueError: as ``check_conv_inputs`` says; RuntimeError: an input that
            requires grad (no backward pass).
    """
    refuse_autograd(x, w, bias)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    stride_hw, padding_hw = _pair(stride, "stride"), _pair(padding, "padding")
    check_conv_inputs(x, w, bias, stride_hw, padding_hw)
    n, _, h, width = x.shape
    k, c, r, s = w.shape
    p, q = output_size(h, r, stride_hw[0], padding_hw[0]), output_size(width, s, stride_hw[1],
                                                                       padding_hw[1])
    # Filters as K rows of (filter row, filter column, channel): the NHWC window's order.
    filters = w.permute(0, 2, 3, 1).contiguous()
    if algorithm == "direct":
        out = torch.empty((n, p, q, k), dtype=x.dtype, device=x.device)
        spec = DirectConvSpec(device.info(x.device).arch, str(x.dtype).removeprefix("torch."))
        kernel_cache.get(spec).fn(x.permute(0, 2, 3, 1), filters, out, *stride_hw,
                                  *padding_hw)
    else:
        cols = im2col(x.permute(0, 2, 3, 1), (r, s), stride_hw, padding_hw)
        out = matmul(cols, filters.view(k, r * s * c).t()).view(n, p, q, k)
    if bias is not None:
        out += bias.to(out.dtype)
    return out.permute(0, 3, 1, 2)
