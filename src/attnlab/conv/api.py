"""``attnlab.conv.conv2d``: input rules, a call signature's plan, and the lab's steps.

A convolution is the GEMM ``[N P Q, R S C] x [R S C, K]``: row ``(n, p, q)`` of the left
matrix is output pixel ``(p, q)``'s filter window in channels-last order (filter row, filter
column, channel), zeros outside the padded image, so the filters need only a permute. The
steps differ in how that matrix reaches the MMAs: **im2col** writes it out (9x the image at
3 x 3) and runs ``attnlab.gemm.matmul``; **implicit GEMM** (``kernels/conv/implicit.py``)
never writes it, gathering its tiles from the image (the TMA unit's im2col mode on sm_90a, or
coordinate tables and ``cp.async`` on ``mma.sync``); the **direct** FFMA convolution
(``kernels/conv/direct.py``) is the lab's baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlab import device, kernel_cache
from attnlab.counters import tile_counters
from attnlab.gemm import matmul
from attnlab.gemm.api import refuse_autograd, split_partials
from attnlab.gemm.dispatch import Plan, plan
from attnlab.gemm_config import GemmConfig, MmaGemmConfig
from attnlab.kernels.conv.abi import DirectConvSpec, ImplicitConvSpec, output_size
from attnlab.kernels.gemm.abi import GEMM_ALIGN_BYTES, binary_config
from attnlab.memo import remember

_DTYPES = (torch.float16, torch.bfloat16)
#: Channels (of the input and of the output) must be a multiple of this: the GEMM's rows
#: are read and written in 16-byte units.
CHANNEL_MULTIPLE = 8


def _pair(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


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
    for name, t in (("w", w), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}: one device")
    if min(stride) < 1 or min(padding) < 0:
        raise ValueError(f"stride must be >= 1 and padding >= 0, got {stride} and {padding}")
    (r, s), (h, width) = w.shape[2:], x.shape[2:]
    if output_size(h, r, stride[0], padding[0]) < 1 or output_size(width, s, stride[1],
                                                                      padding[1]) < 1:
        raise ValueError(f"a {r} x {s} filter with stride {stride} and padding {padding} "
                         f"leaves no output of a {h} x {width} input")


#: The lab's steps ``conv2d`` can run (``algorithm``); ``"auto"``: implicit GEMM where it
#: can run, else im2col + GEMM.
ALGORITHMS = ("auto", "implicit", "im2col", "direct")
#: The implicit GEMM's K step: input channels must be a multiple of it.
IMPLICIT_BLOCK_K = 64
#: The implicit GEMM's tiles, largest first: the GEMM's and 160 columns wide, which cut the
#: SD-UNet's 320 and 640 output channels into whole tiles (measured: 1.2-1.5x the 128 x 128
#: and 128 x 256 tiles at 4 x 320 x 64^2 and 4 x 640 x 32^2, docs/conv.md). Not 128 x 256:
#: with the bias its epilogue spills (4 values; ``attnlab audit --family conv``).
CONV_TILES = ((128, 160), (128, 128), (64, 160), (64, 128), (64, 64))
#: A K step of the implicit GEMM against the GEMM's (ncu: 0.37 us a 64 x 64 step at 1 x 640 x
#: 16^2 against 0.16 for the GEMM, docs/conv.md): the dispatch model's steps scaled by it.
CONV_STEP_SCALE = 2.3
#: Split counts the conv dispatch weighs, the slices meeting in a cluster: against the
#: serial split (two slices, the earlier default) cluster splits measured 1.02-1.12x cuDNN
#: end to end where the serial ones read 0.73-0.96x, at every C >= 320 level whose tiles
#: leave SMs idle (H100, twenty-seventh session, ``scripts/conv_candidates.py``,
#: docs/conv.md); a serial split stays available through a config.
CONV_SPLITS = (1, 2, 4, 8)
#: A conv cluster split's fixed and per-CTA device microseconds (``dispatch.device_us``):
#: within 2 us of the model's steps at the C >= 320 levels (H100, 64-row tiles, two slices),
#: where the GEMM's skinny shapes, bound by memory more than by their K steps, pay more.
CONV_CLUSTER_US = (2.0, 0.0)
#: The im2col TMA descriptor's corner offsets (padding, and padding less the filter's reach)
#: must lie in [-16, 15] (the 5-D descriptor's range; the 4-D one we use allows more).
IMPLICIT_CORNER = 16


def implicit_refusal(x: torch.Tensor, w: torch.Tensor, stride: tuple[int, int],
                     padding: tuple[int, int], config: GemmConfig | MmaGemmConfig | None = None
                     ) -> str | None:
    """Why the implicit GEMM cannot run this convolution (None: it can): the TMA kernel, or
    with an ``MmaGemmConfig`` the ``mma.sync`` kernel of the lab's coordinate tables (whole
    tiles only). ``x`` and ``w`` have passed ``check_conv_inputs``."""
    if x.device.type != "cuda":
        return f"the implicit GEMM runs on a CUDA device, x is on {x.device}"
    if x.data_ptr() % GEMM_ALIGN_BYTES:
        return f"x's data must start on a {GEMM_ALIGN_BYTES}-byte boundary"
    if isinstance(config, MmaGemmConfig):
        n, c, h, width = x.shape
        pixels = (n * output_size(h, w.shape[2], stride[0], padding[0])
                  * output_size(width, w.shape[3], stride[1], padding[1]))
        for what, size, tile in (("input channels", c, config.block_k),
                                 ("output pixels (N P Q)", pixels, config.block_m),
                                 ("output channels", w.shape[0], config.block_n)):
            if size % tile:
                return (f"the mma.sync implicit GEMM takes whole tiles: {what} ({size}) must "
                        f"be a multiple of {tile}")
        return None
    arch = device.info(x.device).arch
    if arch != "sm_90a":
        return f"the implicit GEMM runs on sm_90 (H100/H200), this GPU is {arch}"
    if x.shape[1] % IMPLICIT_BLOCK_K:
        return (f"the implicit GEMM needs input channels a multiple of {IMPLICIT_BLOCK_K}, "
                f"got {x.shape[1]}")
    for pad, size in zip(padding, w.shape[2:], strict=True):
        if pad >= IMPLICIT_CORNER or size - 1 - pad > IMPLICIT_CORNER:
            return (f"the TMA unit's im2col window takes paddings below {IMPLICIT_CORNER} and "
                    f"filters reaching at most {IMPLICIT_CORNER} past them; got padding "
                    f"{padding} with a {tuple(w.shape[2:])} filter")
    return None


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 1, *,
           algorithm: str = "auto", config: GemmConfig | MmaGemmConfig | None = None
           ) -> torch.Tensor:
    """2-D convolution of a channels-last ``x [N, C, H, W]`` with ``w [K, C, R, S]`` (as
    ``torch.nn.functional.conv2d``, no dilation or groups), fp32 accumulation.

    ``algorithm``: ``"implicit"`` (implicit GEMM: the sm_90a HGEMM with A's tiles gathered from
    the image by the TMA unit and the bias added in its epilogue, ``kernels/conv/implicit.py``),
    ``"im2col"`` (the expanded matrix times the filters on ``attnlab.gemm``), ``"direct"`` (the
    lab's FFMA baseline, ``kernels/conv/direct.py``), or ``"auto"`` (implicit where
    ``implicit_refusal`` allows, else im2col). Filters already channels-last
    (``w.to(memory_format=torch.channels_last)``) are used in place; others are permuted once
    per call. ``config``: the implicit GEMM's tile, ring and split count (a ``GemmConfig``;
    slices meet in a cluster with ``split_mode="cluster"``, else in the one-kernel serial
    form), or an ``MmaGemmConfig`` for the ``mma.sync``
    kernel with the lab's coordinate tables (sm80+, whole tiles, the bias added after);
    default: ``attnlab.gemm.dispatch``'s choice for the ``N P Q x K x R S C`` GEMM. A call
    signature (shapes, strides, dtypes, device, options) is validated and planned once;
    later calls only launch.

    Returns:
        ``[N, K, P, Q]`` in x's dtype, channels-last.

    Raises:
        TypeError, ValueError: as ``check_conv_inputs`` says, or ``"implicit"`` asked for
            where ``implicit_refusal`` says it cannot run; RuntimeError: an input that
            requires grad (no backward pass).
    """
    refuse_autograd(x, w, bias)
    try:
        key = (algorithm, config, stride, padding, x.shape, x.stride(), x.dtype, x.device,
               w.shape, w.stride(), w.dtype,
               None if bias is None else (bias.shape, bias.dtype, bias.device))
        call = _calls.get(key)
    except (AttributeError, TypeError):
        key, call = None, None
    if call is None:
        call = _plan(x, w, bias, stride, padding, algorithm, config)
        if key is not None:
            remember(_calls, key, call)
    return call(x, w, bias)


_calls: dict[tuple, Callable] = {}


def plan_label(x: torch.Tensor, w: torch.Tensor, stride: int | tuple[int, int] = 1,
               padding: int | tuple[int, int] = 1, *, algorithm: str = "auto",
               config: GemmConfig | MmaGemmConfig | None = None) -> str:
    """How ``conv2d`` runs this call: ``"implicit 128x160x64 s1"`` (the tile and split
    count, and how the slices meet: ``"implicit 64x160x64 s2 cluster"``), ``"implicit mma
    128x64x32"``, ``"im2col"`` or ``"direct"`` (validates, as a call
    would; builds nothing more than the call's first run does)."""
    return _plan(x, w, None, stride, padding, algorithm, config).label


def _plan(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
          stride: int | tuple[int, int], padding: int | tuple[int, int], algorithm: str,
          config: GemmConfig | MmaGemmConfig | None) -> Callable:
    """Validate a call signature and return what runs it: ``call(x, w, bias)``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if config is not None and not isinstance(config, GemmConfig | MmaGemmConfig):
        raise TypeError(f"config must be an attnlab.gemm.GemmConfig or MmaGemmConfig, got "
                        f"{type(config).__name__}")
    stride_hw, padding_hw = _pair(stride, "stride"), _pair(padding, "padding")
    check_conv_inputs(x, w, bias, stride_hw, padding_hw)
    if algorithm in ("auto", "implicit"):
        refusal = implicit_refusal(x, w, stride_hw, padding_hw, config)
        if refusal is None:
            return _ImplicitConv(x, w, bias is not None, stride_hw, padding_hw, config)
        if algorithm == "implicit":
            raise ValueError(refusal)
        algorithm = "im2col"
    n, _, h, width = x.shape
    k, c, r, s = w.shape
    out_shape = (n, output_size(h, r, stride_hw[0], padding_hw[0]),
                 output_size(width, s, stride_hw[1], padding_hw[1]), k)
    if algorithm == "direct":
        direct = kernel_cache.get(DirectConvSpec(device.info(x.device).arch,
                                                 str(x.dtype).removeprefix("torch."))).fn

        def run_direct(x, w, bias):
            out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
            direct(x.permute(0, 2, 3, 1), _filters(w), out, *stride_hw, *padding_hw)
            return _with_bias(out, bias)

        run_direct.label = "direct"
        return run_direct

    def run_im2col(x, w, bias):
        cols = im2col(x.permute(0, 2, 3, 1), (r, s), stride_hw, padding_hw)
        out = matmul(cols, _filters(w).view(k, r * s * c).t()).view(out_shape)
        return _with_bias(out, bias)

    run_im2col.label = "im2col"
    return run_im2col


def _filters(w: torch.Tensor) -> torch.Tensor:
    """The filters as ``[K, R, S, C]`` rows (filter row, filter column, channel: the NHWC
    window's order), contiguous."""
    return w.permute(0, 2, 3, 1).contiguous()


def _with_bias(out_nhwc: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        out_nhwc += bias.to(out_nhwc.dtype)
    return out_nhwc.permute(0, 3, 1, 2)


def _conv_plan(m: int, n: int, k: int, multiprocessors: int, config: GemmConfig | None,
               dtype: str) -> Plan:
    """The implicit GEMM's plan: the GEMM dispatch over the conv's tiles and split counts
    (slices meeting in a cluster), its K steps ``CONV_STEP_SCALE`` times a GEMM's."""
    return plan(m, n, k, multiprocessors, config, in_dtype=dtype, out_dtype=dtype,
                tiles=CONV_TILES, step_scale=CONV_STEP_SCALE, split_counts=CONV_SPLITS,
                split_modes=("cluster",), cluster_us=CONV_CLUSTER_US)


class _ImplicitConv:
    """One call signature's implicit-GEMM convolution: its plan (the GEMM dispatch's tile and
    split count, the slices meeting in a cluster or serially; an ``MmaGemmConfig``: one CTA
    a tile) and kernel, built once."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor, has_bias: bool,
                 stride: tuple[int, int], padding: tuple[int, int],
                 config: GemmConfig | MmaGemmConfig | None = None):
        info = device.info(x.device)
        n, c, h, width = x.shape
        k, _, r, s = w.shape
        self.out_shape = (n, output_size(h, r, stride[0], padding[0]),
                          output_size(width, s, stride[1], padding[1]), k)
        self.pixels = n * self.out_shape[1] * self.out_shape[2]
        self.dtype = x.dtype
        dtype = str(x.dtype).removeprefix("torch.")
        # The mma.sync kernel has no bias epilogue: its calls add the bias after.
        self.bias_after = isinstance(config, MmaGemmConfig)
        if self.bias_after:
            self.split, self.splits, self.num_ctas = "none", 1, 1
            spec = ImplicitConvSpec(config, info.arch, dtype, r, s, *stride, *padding)
            self.label = f"implicit mma {config.block_m}x{config.block_n}x{config.block_k}"
        else:
            p = _conv_plan(self.pixels, k, r * s * c, info.multiprocessors, config, dtype)
            # A split meets in a cluster or serially (a config's other modes run serially).
            self.split = p.split if p.split in ("none", "cluster") else "serial"
            self.splits, self.num_ctas = p.splits, p.num_ctas
            self.counters = (math.ceil(self.pixels / p.config.block_m)
                             * math.ceil(k / p.config.block_n) * p.config.num_consumers)
            spec = ImplicitConvSpec(binary_config(p.config), info.arch, dtype, r, s, *stride,
                                    *padding, self.split, has_bias)
            cfg = p.config
            meet = "" if self.split == "none" else f" {self.split}"
            self.label = (f"implicit {cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
                          f"s{p.splits}{meet}")
        self.kernel = kernel_cache.get(spec).fn
        self._scratch: dict[int, torch.Tensor] = {}
        # The call signature fixes w's strides: channels-last filters are the GEMM's B as
        # they lie (one strided view a call, where permuting and reshaping took four).
        self.filters_in_place = w.permute(0, 2, 3, 1).is_contiguous()
        self.filter_values = r * s * c
        n, p, q, k = self.out_shape
        self.nchw_shape = (n, k, p, q)

    def __call__(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
        if x.data_ptr() % GEMM_ALIGN_BYTES:
            raise ValueError(f"x's data must start on a {GEMM_ALIGN_BYTES}-byte boundary (a "
                             f"view at an odd offset is not); clone it")
        k, rsc = w.shape[0], self.filter_values
        filters_t = (w.as_strided((rsc, k), (1, rsc)) if self.filters_in_place
                     else _filters(w).view(k, rsc).t())
        workspace = counters = None
        if self.split == "serial":
            workspace = split_partials(self._scratch, x.device, (self.splits, self.pixels, k))
            counters = tile_counters(x.device, self.counters)
        if self.bias_after:
            out = torch.empty(self.out_shape, dtype=self.dtype, device=x.device)
            c, fused = out.view(self.pixels, k), None
        else:
            # The result itself, channels-last; the kernel writes it as the [N P Q, K] matrix.
            out = torch.empty(self.nchw_shape, dtype=self.dtype, device=x.device,
                              memory_format=torch.channels_last)
            c = out.as_strided((self.pixels, k), (k, 1))
            fused = bias if bias is None or bias.dtype == self.dtype else bias.to(self.dtype)
        self.kernel(x.permute(0, 2, 3, 1), filters_t, c, workspace, counters, None, None, None,
                    fused, None, self.splits, self.num_ctas)
        return _with_bias(out, bias) if self.bias_after else out
