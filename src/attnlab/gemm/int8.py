"""``attnlab.gemm.int8_matmul``: INT8 GEMM with dequantization in the epilogue (IGEMM).

``a_q @ b_q`` of int8 matrices runs on the same sm_90a kernel as the HGEMM with ``wgmma`` s8
MMAs (int32 accumulation: exact), and its epilogue turns each int32 sum into the product of
the dequantized operands before the 16-bit store:

    out[i, j] = scale_a[i] * scale_b[j] * sum_k a_q[i, k] * (b_q[k, j] - zero_b[j])

which is ``(scale_a[i] a_q[i, :]) @ (scale_b[j] (b_q[:, j] - zero_b[j]))``: A quantized
symmetrically per row (token), B asymmetrically per output channel (the lab's per-channel
asymmetric weights). With zero points the kernel sums A's rows itself, from the tiles its
MMAs read (four ``dp4a`` per 16 bytes, while the MMAs run): no extra pass over A, no second
kernel. No split-K: the shapes INT8 serves fill the GPU.
"""

from __future__ import annotations

import torch

from attnlab import device, kernel_cache
from attnlab.gemm.api import GEMM_ARCHS, _check, operand_major, refuse_autograd, tuned
from attnlab.gemm.dispatch import plan
from attnlab.gemm_config import GemmConfig
from attnlab.kernels.gemm.abi import GEMM_ALIGN_BYTES, GemmSpec, binary_config
from attnlab.memo import remember

#: The K step of INT8 tiles: 128 one-byte elements, one 128-byte swizzled row.
INT8_BLOCK_K = 128
_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_calls: dict[tuple, _Int8Call] = {}


def int8_matmul(a_q: torch.Tensor, b_q: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor, *, zero_b: torch.Tensor | None = None,
                out_dtype: torch.dtype = torch.bfloat16,
                config: GemmConfig | None = None) -> torch.Tensor:
    """The dequantized product of int8 ``a_q [M, K]`` and ``b_q [K, N]`` (module docstring).

    Args:
        a_q: int8 ``[M, K]``, row-major (K contiguous), on an sm_90 GPU.
        b_q: int8 ``[K, N]`` with K contiguous: a transposed ``[N, K]`` weight (``w_q.t()``);
            the s8 ``wgmma`` reads both operands K-major.
        scale_a: fp32 ``[M]``, A's per-row scales; scale_b: fp32 ``[N]``, B's per-column ones.
        zero_b: fp32 ``[N]``, B's per-column zero points (None: symmetric).
        out_dtype: the output's dtype (fp16, bf16 or fp32).
        config: tile and schedule (``GemmConfig``; its split-K knobs are ignored).

    Raises:
        TypeError, ValueError: as ``attnlab.gemm.matmul``; scales of the wrong dtype, length
            or layout; an operand that is not K-major.
    """
    refuse_autograd(scale_a, scale_b, zero_b)
    try:
        key = (a_q.shape, a_q.stride(), a_q.dtype, a_q.device, b_q.shape, b_q.stride(),
               b_q.dtype, zero_b is None, out_dtype, config)
        call = _calls.get(key)
    except (AttributeError, TypeError):
        key, call = None, None
    if call is None:
        call = _Int8Call(a_q, b_q, zero_b is not None, out_dtype, config)
        if key is not None:
            remember(_calls, key, call)
    return call(a_q, b_q, scale_a, scale_b, zero_b)


def _check_vector(name: str, v: object, length: int, dev: torch.device) -> None:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(v).__name__}")
    if v.dtype != torch.float32 or v.dim() != 1 or v.shape[0] != length:
        raise ValueError(f"{name} must be a float32 vector of {length}, got {v.dtype} of shape "
                         f"{tuple(v.shape)}")
    if v.stride(0) != 1 or v.device != dev:
        raise ValueError(f"{name} must be contiguous and on {dev}, got stride {v.stride()} on "
                         f"{v.device}")


class _Int8Call:
    """One call signature's INT8 GEMM: its plan and kernel (built once)."""

    def __init__(self, a_q: torch.Tensor, b_q: torch.Tensor, zero_points: bool,
                 out_dtype: torch.dtype, config: GemmConfig | None):
        _check(a_q, b_q, torch.float32, config, in_dtypes=(torch.int8,))
        if out_dtype not in _OUT_DTYPES:
            raise TypeError(f"out_dtype must be torch.float16, torch.bfloat16 or "
                            f"torch.float32, got {out_dtype}")
        info = device.info(a_q.device)
        if info.arch not in GEMM_ARCHS:
            raise NotImplementedError(f"attnlab.gemm.int8_matmul runs on sm_90 (H100/H200); "
                                      f"{info.name} is {info.arch}")
        for name, t, labels in (("a_q", a_q, ("m", "k")), ("b_q", b_q, ("k", "n"))):
            major, view = operand_major(name, t, labels)
            if major != "k" or view is not t:
                raise ValueError(f"{name} must have K contiguous (the s8 wgmma reads both "
                                 f"operands K-major): pass A row-major and B as w_q.t() of a "
                                 f"contiguous [N, K] tensor; got strides {t.stride()}")
        (self.m, self.k), self.n = a_q.shape, b_q.shape[1]
        out_name = str(out_dtype).removeprefix("torch.")
        if self.n * out_dtype.itemsize % GEMM_ALIGN_BYTES:
            raise ValueError(f"the output's rows ({self.n} x {out_name}) must be a multiple of "
                             f"{GEMM_ALIGN_BYTES} bytes; pad N")
        self.out_dtype, self.zero_points = out_dtype, zero_points
        config = config or tuned(info, "int8", out_name, self.m, self.n, self.k)
        self.plan = plan(self.m, self.n, self.k, info.multiprocessors, config,
                         block_k=INT8_BLOCK_K, allow_split=False, in_dtype="int8",
                         out_dtype=out_name)
        spec = GemmSpec(binary_config(self.plan.config), info.arch, "int8", out_name, "k", "k",
                        "none", "scale_zero" if zero_points else "scale")
        self.gemm = kernel_cache.get(spec).fn

    def __call__(self, a_q, b_q, scale_a, scale_b, zero_b) -> torch.Tensor:
        for name, v, length in (("scale_a", scale_a, self.m), ("scale_b", scale_b, self.n)):
            _check_vector(name, v, length, a_q.device)
        if self.zero_points:
            _check_vector("zero_b", zero_b, self.n, a_q.device)
        if (a_q.data_ptr() | b_q.data_ptr()) % GEMM_ALIGN_BYTES:
            raise ValueError(f"a_q's and b_q's data must start on a {GEMM_ALIGN_BYTES}-byte "
                             f"boundary; clone the view")
        c = torch.empty((self.m, self.n), dtype=self.out_dtype, device=a_q.device)
        self.gemm(a_q, b_q, c, None, None, scale_a, scale_b, zero_b, None, None, 1,
                  self.plan.num_ctas)
        return c
