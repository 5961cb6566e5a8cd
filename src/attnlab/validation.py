"""Input checks shared by the kernel API and the reference: one place that says what q/k/v may be.

Every rule raises with a message that names the offending argument, what it was, and what is
supported, so a caller never has to read kernel code to learn why a call was refused.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from attnlab.config import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

#: The dtypes the kernels take, as torch dtypes (config.py names them as strings).
KERNEL_DTYPES: tuple[torch.dtype, ...] = tuple(getattr(torch, name) for name in SUPPORTED_DTYPES)

#: A 128-bit vector copy moves 16 bytes; every tile row the kernel copies must start on one.
COPY_ALIGN_BYTES = 16

_LAYOUT = "[batch, seqlen, heads, head_dim] (BSHD)"


@dataclass(frozen=True)
class Problem:
    """The sizes of one attention call, read off validated q/k/v (BSHD layout)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    softmax_scale: float


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: object = None,
    require_cuda: bool = True,
    allowed_dtypes: Iterable[torch.dtype] = KERNEL_DTYPES,
) -> Problem:
    """Validate attention inputs and return the problem they describe.

    q is ``[B, Sq, H, D]``, k and v are ``[B, Sk, H, D]``. Type, rank, dtype, shape, layout and
    scale are checked before the device, so every error but the device one can be exercised with
    CPU tensors.

    Args:
        q, k, v: the query, key and value tensors.
        softmax_scale: multiplier of QK^T before the softmax; ``None`` means ``1/sqrt(D)``.
        require_cuda: reject tensors that are not on a CUDA device. Only the reference (which
            runs anywhere) and tests turn this off.
        allowed_dtypes: dtypes accepted for q/k/v. The reference widens this to fp32/fp64.

    Raises:
        TypeError: a non-tensor, an unsupported dtype, mismatched dtypes, or a softmax_scale
            that is not a real number.
        ValueError: a wrong rank, mismatched shapes, an unsupported head dim, a layout the
            kernel cannot copy with 128-bit accesses, a non-positive or non-finite softmax_scale, a
            tensor off CUDA (with ``require_cuda``), or tensors on different devices.
    """
    allowed = tuple(allowed_dtypes)
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        # The hints say Tensor, but callers pass arrays and lists; say so plainly.
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D {_LAYOUT}, got a {t.dim()}-D tensor of shape "
                f"{tuple(t.shape)}"
            )
    for name, t in tensors.items():
        if t.dtype not in allowed:
            raise TypeError(
                f"{name} has dtype {t.dtype}; supported: {', '.join(map(str, allowed))}"
            )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}"
        )
    _check_shapes(q, k, v)
    for name, t in tensors.items():
        _check_layout(name, t)
    scale = _resolve_scale(softmax_scale, q.shape[3])
    _check_devices(tensors, require_cuda)

    batch, seqlen_q, num_heads, head_dim = q.shape
    return Problem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[1],
        num_heads=num_heads,
        head_dim=head_dim,
        dtype=q.dtype,
        softmax_scale=scale,
    )


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    # Sq may differ from Sk (cross-attention); every other dim is shared.
    for dim, what in ((0, "batch"), (2, "heads"), (3, "head_dim")):
        for name, t in (("k", k), ("v", v)):
            if t.shape[dim] != q.shape[dim]:
                raise ValueError(
                    f"{name} has {what} {t.shape[dim]} but q has {q.shape[dim]}: q, k and v "
                    f"must share batch, heads and head_dim (shapes q {tuple(q.shape)}, "
                    f"{name} {tuple(t.shape)})"
                )
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same sequence length, got k {k.shape[1]} and v "
            f"{v.shape[1]} (shapes k {tuple(k.shape)}, v {tuple(v.shape)})"
        )
    head_dim = q.shape[3]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim {head_dim} (last dim of q) is not supported; supported: "
            f"{SUPPORTED_HEAD_DIMS}"
        )


def _check_layout(name: str, t: torch.Tensor) -> None:
    # The kernel copies whole 16-byte vectors of a row, so a row's elements must be adjacent
    # and every row (along B, S and H) must start on a 16-byte boundary.
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim (head_dim), got strides "
            f"{t.stride()}; call {name}.contiguous()"
        )
    elem = t.element_size()
    if t.data_ptr() % COPY_ALIGN_BYTES:
        raise ValueError(
            f"{name} must start on a {COPY_ALIGN_BYTES}-byte boundary for 128-bit copies, "
            f"got data_ptr {t.data_ptr():#x} (storage offset {t.storage_offset()}); call "
            f"{name}.contiguous() to get an aligned copy"
        )
    # The kernel indexes with 32-bit integers.
    extent = sum(st * (n - 1) for st, n in zip(t.stride(), t.shape, strict=True)) + 1
    if extent >= 2**31:
        raise ValueError(
            f"{name} spans {extent} elements; attnlab kernels index with 32-bit integers "
            f"(at most {2**31 - 1}): split the batch"
        )
    bad = [s for s in t.stride()[:3] if (s * elem) % COPY_ALIGN_BYTES]
    if bad:
        raise ValueError(
            f"{name} strides of dims 0..2 must be multiples of {COPY_ALIGN_BYTES // elem} "
            f"elements ({COPY_ALIGN_BYTES} bytes) for 128-bit copies, got strides "
            f"{t.stride()}; call {name}.contiguous()"
        )


def _resolve_scale(softmax_scale: object, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    # bool is a numbers.Real, but softmax_scale=True is surely a mistake.
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            f"softmax_scale must be a real number or None, got "
            f"{type(softmax_scale).__name__} {softmax_scale!r}"
        )
    scale = float(softmax_scale)
    # Positive: the kernel takes the row max of the unscaled scores (the fused softmax).
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale!r}")
    return scale


def _check_devices(tensors: dict[str, torch.Tensor], require_cuda: bool) -> None:
    if require_cuda:
        for name, t in tensors.items():
            if t.device.type != "cuda":
                raise ValueError(f"attnlab kernels run on CUDA tensors; {name} is on {t.device}")
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"q, k and v must be on one device, got {listed}")
