"""Input checks shared by the kernel API and the reference: one place that says what inputs may be.

Every rule raises with a message that names the offending argument, what it was, and what is
supported, so a caller never has to read kernel code to learn why a call was refused.

:func:`check_inputs` (dense BSHD) and :func:`check_varlen_inputs` (packed THD) read only what
the host knows without touching GPU memory: types, shapes, strides, dtypes, devices. They can
therefore run while ``torch.compile`` traces a call, where tensors have no memory. The two
checks that need more are separate:

* :func:`check_data_pointers` reads addresses (alignment, ``out`` not overlapping q/k/v); the
  custom op runs it on the real tensors at launch time.
* :func:`check_cu_seqlens_values` reads the contents of ``cu_seqlens``, a device-to-host copy
  that would stall the stream and break CUDA-graph capture; only the reference and callers who
  opt in run it. The kernel trusts the offsets it is given.
"""

from __future__ import annotations

import itertools
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

#: The window of full attention (flash_attn's convention: -1 means no bound on that side).
FULL_WINDOW: tuple[int, int] = (-1, -1)

_BSHD = "[batch, seqlen, heads, head_dim] (BSHD)"
_THD = "[total_tokens, heads, head_dim] (packed varlen)"

# Sizes and the scale may arrive symbolic while torch.compile traces a call.
_INT_TYPES = (numbers.Integral, torch.SymInt)
_REAL_TYPES = (numbers.Real, torch.SymFloat, torch.SymInt)


@dataclass(frozen=True)
class Problem:
    """The sizes of one attention call, read off validated inputs.

    For a varlen call (``varlen=True``), ``batch`` is the number of sequences and ``seqlen_q`` /
    ``seqlen_k`` are the caller's ``max_seqlen_q`` / ``max_seqlen_k``: bounds on every
    sequence's length, not the length of each.

    Attributes:
        num_heads: heads of q. ``num_heads_kv`` (heads of k and v) divides it; q head ``h``
            reads k/v head ``h // (num_heads // num_heads_kv)``.
        window: ``(left, right)``, FlashAttention-2's convention: query row ``i`` attends key
            ``j`` iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, -1 meaning unbounded
            on that side. ``causal=True`` has already been folded in (it sets ``right = 0``).
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int
    head_dim: int
    dtype: torch.dtype
    softmax_scale: float
    window: tuple[int, int] = FULL_WINDOW
    varlen: bool = False

    @property
    def causal(self) -> bool:
        """Plain causal attention, bottom-right aligned (FlashAttention-2's definition)."""
        return self.window == (-1, 0)

    @property
    def windowed(self) -> bool:
        """Causal or sliding-window: the masked kernel variant serves it."""
        return self.window != FULL_WINDOW

    @property
    def dtype_name(self) -> str:
        """``"float16"`` or ``"bfloat16"`` (the kernels' name of the dtype)."""
        return str(self.dtype).removeprefix("torch.")


def wants_grad(*tensors: object) -> bool:
    """Whether grad mode is on and one of ``tensors`` (None and non-tensors skipped) requires
    grad: what the inference-only calls refuse. A plain loop: it runs on every call of a
    host-bound path (a generator over the arguments cost 0.14 us more a call here)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return True
    return False


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: object = None,
    causal: object = False,
    window_size: object = FULL_WINDOW,
    out: torch.Tensor | None = None,
    require_cuda: bool = True,
    allowed_dtypes: Iterable[torch.dtype] = KERNEL_DTYPES,
    check_pointers: bool = True,
) -> Problem:
    """Validate dense attention inputs and return the problem they describe.

    q is ``[B, Sq, Hq, D]``, k and v are ``[B, Sk, Hkv, D]`` with ``Hq % Hkv == 0``. Types,
    ranks, dtypes, shapes, layouts, scale, window and ``out`` are checked before the device, so
    every error but the device one can be exercised with CPU tensors.

    Args:
        q, k, v: the query, key and value tensors.
        softmax_scale: multiplier of QK^T before the softmax; ``None`` means ``1/sqrt(D)``.
        causal: mask keys after the (bottom-right aligned) diagonal; sets the window's right
            side to 0, keeping its left side, as flash_attn does.
        window_size: ``(left, right)``, each -1 (unbounded) or a number of keys >= 0.
        out: a tensor to write the output into: q's shape, dtype and device, laid out by the
            same rules as q (any strides the kernel can copy), sharing no memory with q/k/v.
        require_cuda: reject tensors that are not on a CUDA device. Only the reference (which
            runs anywhere) and tests turn this off.
        allowed_dtypes: dtypes accepted for q/k/v. The reference widens this to fp32/fp64.
        check_pointers: also run :func:`check_data_pointers`. ``attention()`` turns this off
            because its custom op runs that check on the real tensors at launch.

    Raises:
        TypeError: a non-tensor, an unsupported dtype, mismatched dtypes, a softmax_scale,
            causal or window_size of the wrong type, or an ``out`` that is not a tensor or not
            of q's dtype.
        ValueError: a wrong rank, mismatched shapes, heads of q not a multiple of those of
            k/v, an unsupported head dim, a layout the kernel cannot copy with 128-bit accesses,
            a non-positive or non-finite softmax_scale, a window side below -1, an ``out`` of
            another shape, layout or device (or overlapping q/k/v), a tensor off CUDA (with
            ``require_cuda``), or tensors on different devices.
    """
    _check_qkv(q, k, v, rank=4, layout=_BSHD, allowed_dtypes=allowed_dtypes)
    _check_dense_lengths(q, k, v)
    _check_heads(q, k, v)
    scale, window = _check_common(
        {"q": q, "k": k, "v": v},
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        out=out,
        require_cuda=require_cuda,
        check_pointers=check_pointers,
    )
    return describe(q, k, scale, window)


def check_varlen_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: object = None,
    causal: object = False,
    window_size: object = FULL_WINDOW,
    out: torch.Tensor | None = None,
    require_cuda: bool = True,
    allowed_dtypes: Iterable[torch.dtype] = KERNEL_DTYPES,
    check_pointers: bool = True,
) -> Problem:
    """Validate packed variable-length inputs (flash_attn_varlen_func's) and describe them.

    q is ``[total_q, Hq, D]``, k and v ``[total_k, Hkv, D]``; sequence ``b`` is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of
    k and v. Only the offsets' type, dtype, shape, contiguity and device are checked here: their
    values live on the GPU (see :func:`check_cu_seqlens_values`).

    Args:
        cu_seqlens_q, cu_seqlens_k: int32, 1-D, contiguous, ``batch + 1`` offsets each, on q's
            device.
        max_seqlen_q, max_seqlen_k: ints >= 0, at least every sequence's length.
        The rest: as :func:`check_inputs`.

    Raises:
        TypeError, ValueError: as :func:`check_inputs`, and for bad offsets or max lengths.
    """
    _check_qkv(q, k, v, rank=3, layout=_THD, allowed_dtypes=allowed_dtypes)
    if k.shape[0] != v.shape[0]:
        raise ValueError(
            f"k and v must have the same total length (dim 0), got k {k.shape[0]} and v "
            f"{v.shape[0]} (shapes k {tuple(k.shape)}, v {tuple(v.shape)})"
        )
    _check_heads(q, k, v)
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_k)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, _INT_TYPES):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    scale, window = _check_common(
        {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k},
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        out=out,
        require_cuda=require_cuda,
        check_pointers=check_pointers,
        max_seqlens=(max_seqlen_q, max_seqlen_k),
    )
    return describe(q, k, scale, window, cu_seqlens_q, max_seqlen_q, max_seqlen_k)


def describe(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float,
    window: tuple[int, int],
    cu_seqlens_q: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> Problem:
    """The :class:`Problem` of inputs that already passed validation (nothing is checked).

    Dense when ``cu_seqlens_q`` is None, varlen otherwise. The custom op calls this to ask
    dispatch for a config without validating twice.
    """
    if cu_seqlens_q is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    else:
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    return Problem(
        batch=batch,
        seqlen_q=int(seqlen_q),
        seqlen_k=int(seqlen_k),
        num_heads=q.shape[-2],
        num_heads_kv=k.shape[-2],
        head_dim=q.shape[-1],
        dtype=q.dtype,
        softmax_scale=softmax_scale,
        window=window,
        varlen=cu_seqlens_q is not None,
    )


def check_data_pointers(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None
) -> None:
    """Reject tensors the kernel cannot copy with 128-bit accesses, or an ``out`` overlapping q/k/v.

    Reads data pointers, so it runs on real tensors only (not while torch.compile traces).
    Overlap is judged by address range, so ``out`` interleaved with q inside one buffer is
    refused too, even where no element is shared.

    Raises:
        ValueError: a tensor that does not start on a 16-byte boundary, or ``out`` overlapping
            q, k or v (the kernel would overwrite inputs it has yet to read).
    """
    tensors = {"q": q, "k": k, "v": v, "out": out}
    for name, t in tensors.items():
        if t is not None and t.data_ptr() % COPY_ALIGN_BYTES:
            raise ValueError(
                f"{name} must start on a {COPY_ALIGN_BYTES}-byte boundary for 128-bit copies, "
                f"got data_ptr {t.data_ptr():#x} (storage offset {t.storage_offset()}); call "
                f"{name}.contiguous() to get an aligned copy"
            )
    if out is None or out.numel() == 0:
        return
    out_start, out_end = _address_range(out)
    for name, t in (("q", q), ("k", k), ("v", v)):
        start, end = _address_range(t)
        if t.numel() and t.device == out.device and start < out_end and out_start < end:
            raise ValueError(
                f"out must not overlap the memory of {name}: the kernel would overwrite {name} "
                f"while reading it (out spans [{out_start:#x}, {out_end:#x}), {name} spans "
                f"[{start:#x}, {end:#x})); pass a separate tensor"
            )


def check_cu_seqlens_values(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    total_q: int,
    total_k: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    """Check the offsets' values: from 0, non-decreasing, ending at the total, within the max.

    Copies the offsets to the host: a synchronisation, not allowed during CUDA-graph capture
    and a graph break under torch.compile. Call it after :func:`check_varlen_inputs`.

    Raises:
        ValueError: naming the offsets and the first rule they break.
    """
    for name, cu, total, max_seqlen, max_name in (
        ("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k, "max_seqlen_k"),
    ):
        offsets = cu.tolist()
        lengths = [end - start for start, end in itertools.pairwise(offsets)]
        if offsets[0] != 0:
            raise ValueError(f"{name} must start at 0, got {offsets[0]} ({name} = {offsets})")
        if any(length < 0 for length in lengths):
            raise ValueError(f"{name} must be non-decreasing, got {offsets}")
        if offsets[-1] != total:
            raise ValueError(
                f"{name} must end at the packed length {total}, got {offsets[-1]} ({name} = "
                f"{offsets})"
            )
        if lengths and max(lengths) > max_seqlen:
            raise ValueError(
                f"{max_name} = {max_seqlen} is below the longest sequence in {name}, "
                f"{max(lengths)} ({name} = {offsets})"
            )


# --------------------------------------------------------------------------------------------
def _check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rank: int,
    layout: str,
    allowed_dtypes: Iterable[torch.dtype],
) -> None:
    allowed = tuple(allowed_dtypes)
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        # The hints say Tensor, but callers pass arrays and lists; say so plainly.
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in tensors.items():
        if t.dim() != rank:
            raise ValueError(
                f"{name} must be {rank}-D {layout}, got a {t.dim()}-D tensor of shape "
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


def _check_dense_lengths(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    # Sq may differ from Sk (cross-attention); the batch is shared.
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != q.shape[0]:
            raise ValueError(
                f"{name} has batch {t.shape[0]} but q has {q.shape[0]}: q, k and v must share "
                f"batch and head_dim (shapes q {tuple(q.shape)}, {name} {tuple(t.shape)})"
            )
    if k.shape[1] != v.shape[1]:
        raise ValueError(
            f"k and v must have the same sequence length, got k {k.shape[1]} and v "
            f"{v.shape[1]} (shapes k {tuple(k.shape)}, v {tuple(v.shape)})"
        )


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    # Heads and head_dim are the last two dims in both layouts (BSHD and packed THD).
    for name, t in (("k", k), ("v", v)):
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(
                f"{name} has head_dim {t.shape[-1]} but q has {q.shape[-1]}: q, k and v must "
                f"share batch and head_dim (shapes q {tuple(q.shape)}, {name} {tuple(t.shape)})"
            )
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if v.shape[-2] != heads_kv:
        raise ValueError(
            f"k and v must have the same number of heads, got k {heads_kv} and v "
            f"{v.shape[-2]} (shapes k {tuple(k.shape)}, v {tuple(v.shape)})"
        )
    # GQA/MQA: each k/v head serves a group of q heads, so the groups must be whole.
    whole_groups = heads_q % heads_kv == 0 if heads_kv else heads_q == 0
    if not whole_groups:
        raise ValueError(
            f"q has {heads_q} heads, not a multiple of the {heads_kv} heads of k and v: "
            f"grouped-query attention needs heads of q divisible by heads of k/v (shapes q "
            f"{tuple(q.shape)}, k {tuple(k.shape)})"
        )
    head_dim = q.shape[-1]
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim {head_dim} (last dim of q) is not supported; supported: "
            f"{SUPPORTED_HEAD_DIMS}"
        )


def _check_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> None:
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must have dtype torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(
                f"{name} must be 1-D with batch + 1 >= 1 offsets, got shape {tuple(cu.shape)}"
            )
        # The kernel reads offset b at base + b.
        if cu.stride(0) != 1:
            raise ValueError(
                f"{name} must be contiguous, got stride {cu.stride(0)}; call "
                f"{name}.contiguous()"
            )
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must hold one offset per sequence plus one, for the "
            f"same batch; got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]} offsets"
        )


def _check_common(
    tensors: dict[str, torch.Tensor],
    *,
    softmax_scale: object,
    causal: object,
    window_size: object,
    out: torch.Tensor | None,
    require_cuda: bool,
    check_pointers: bool,
    max_seqlens: tuple[int, int] | None = None,
) -> tuple[float, tuple[int, int]]:
    """The checks dense and varlen share once shapes are known; returns (scale, window).
    ``max_seqlens`` (q's, k's) bound a packed sequence's rows; None for dense batches."""
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    rows_q, rows_k = max_seqlens if max_seqlens is not None else (None, None)
    for name, rows in (("q", rows_q), ("k", rows_k), ("v", rows_k)):
        _check_strides(name, tensors[name], rows)
    scale = _resolve_scale(softmax_scale, q.shape[-1])
    window = _resolve_window(window_size, causal)
    if out is not None:
        _check_out(out, q, rows_q)
        tensors = {**tensors, "out": out}
    _check_devices(tensors, require_cuda)
    if check_pointers:
        check_data_pointers(q, k, v, out)
    return scale, window


def _check_strides(name: str, t: torch.Tensor, sequence_rows: int | None = None) -> None:
    # The kernel copies whole 16-byte vectors of a row, so a row's elements must be adjacent
    # and every row must start on a 16-byte boundary: the strides of all dims but the last are
    # whole multiples of 16 bytes (the base address is check_data_pointers' business).
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be contiguous in its last dim (head_dim), got strides "
            f"{t.stride()}; call {name}.contiguous()"
        )
    # Batch offsets are 64-bit; within one batch element (dense) or one packed sequence of
    # at most ``sequence_rows`` rows the kernels index with 32-bit integers.
    extent = _sequence_extent(t, sequence_rows)
    if extent >= 2**31:
        what = "one batch element" if sequence_rows is None else "one sequence"
        raise ValueError(
            f"{name}: {what} spans {extent} elements; attnlab kernels index within a sequence "
            f"with 32-bit integers (at most {2**31 - 1} elements): use fewer heads per call or "
            f"shorter sequences"
        )
    elem = t.element_size()
    bad = [s for s in t.stride()[:-1] if (s * elem) % COPY_ALIGN_BYTES]
    if bad:
        raise ValueError(
            f"{name} strides of dims 0..{t.dim() - 2} must be multiples of "
            f"{COPY_ALIGN_BYTES // elem} elements ({COPY_ALIGN_BYTES} bytes) for 128-bit "
            f"copies, got strides {t.stride()}; call {name}.contiguous()"
        )


def _sequence_extent(t: torch.Tensor, sequence_rows: int | None) -> int:
    """Elements spanned by one batch element of a dense ``t``, or by ``sequence_rows`` rows of
    a packed one."""
    if sequence_rows is None:
        return _extent(t[0]) if t.shape[0] else 0
    return (max(sequence_rows, 1) - 1) * t.stride(0) + _extent(t[0]) if t.shape[0] else 0


def _extent(t: torch.Tensor) -> int:
    """Elements from the first to the last one ``t`` addresses, inclusive."""
    return sum(st * (n - 1) for st, n in zip(t.stride(), t.shape, strict=True)) + 1


def _address_range(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + _extent(t) * t.element_size()


def _resolve_scale(softmax_scale: object, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    # bool is a numbers.Real, but softmax_scale=True is surely a mistake.
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, _REAL_TYPES):
        raise TypeError(
            f"softmax_scale must be a real number or None, got "
            f"{type(softmax_scale).__name__} {softmax_scale!r}"
        )
    # Positive: the kernel takes the row max of the unscaled scores (the fused softmax).
    # Written as one chained comparison, which NaN fails too, because torch.compile cannot
    # trace math.isfinite on a symbolic float.
    if not 0.0 < softmax_scale < math.inf:
        raise ValueError(f"softmax_scale must be finite and positive, got {softmax_scale!r}")
    return float(softmax_scale)


def _resolve_window(window_size: object, causal: object) -> tuple[int, int]:
    """``(left, right)`` with causal folded in: flash_attn's rule, causal sets right = 0."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or any(isinstance(side, bool) or not isinstance(side, _INT_TYPES) for side in window_size)
    ):
        raise TypeError(
            f"window_size must be a (left, right) tuple of two ints, got "
            f"{type(window_size).__name__} {window_size!r}"
        )
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size must be (left, right) with each side -1 (unbounded) or a number of "
            f"keys >= 0, got {tuple(window_size)}"
        )
    return int(left), 0 if causal else int(right)


def _check_out(out: torch.Tensor, q: torch.Tensor, sequence_rows: int | None) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if out.dtype != q.dtype:
        raise TypeError(f"out must have q's dtype {q.dtype}, got {out.dtype}")
    _check_strides("out", out, sequence_rows)


def _check_devices(tensors: dict[str, torch.Tensor], require_cuda: bool) -> None:
    if require_cuda:
        for name, t in tensors.items():
            if t.device.type != "cuda":
                raise ValueError(f"attnlab kernels run on CUDA tensors; {name} is on {t.device}")
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        names = list(devices)
        together = f"{', '.join(names[:-1])} and {names[-1]}"
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"{together} must be on one device, got {listed}")


# --------------------------------------------------------------------------------------------
#: Smallest page of a paged KV cache (one 16-row K/V slice of a decoding warp).
MIN_PAGE_SIZE = 16


def check_kvcache_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    *,
    cache_seqlens: object,
    cache_batch_idx: torch.Tensor | None,
    block_table: torch.Tensor | None,
    softmax_scale: object,
    causal: object,
    window_size: object,
    num_splits: object,
    out: torch.Tensor | None,
    check_pointers: bool = True,
) -> tuple[float, tuple[int, int]]:
    """Check ``attention_with_kvcache``'s arguments (no device memory is read); returns the
    softmax scale and the window as the kernel takes it (``encode_window``).
    ``check_pointers`` False skips the data pointers' alignment (fake tensors have none).

    Raises:
        TypeError, ValueError: what is malformed and what was expected.
    """
    from attnlab.kernels.abi import encode_window

    _check_qkv(q, k_cache, v_cache, rank=4, layout="[B, S, H, D] (the cache: [B_cache, "
               "S_cache, Hkv, D], or [num_pages, page_size, Hkv, D] with block_table)",
               allowed_dtypes=(torch.float16, torch.bfloat16))
    _check_heads(q, k_cache, v_cache)
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    batch = q.shape[0]
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if (k is None) != (v is None):
        raise ValueError("pass both k and v (the new tokens) or neither")
    if k is not None:
        _check_qkv(q, k, v, rank=4, layout="[B, S_new, Hkv, D]",
                   allowed_dtypes=(q.dtype,))
        for name, t in (("k", k), ("v", v)):
            expected = (batch, k.shape[1], *k_cache.shape[2:])
            if tuple(t.shape) != expected:
                raise ValueError(f"{name} must be [B, S_new, Hkv, D] = {expected} (q's batch, "
                                 f"the cache's heads and head_dim), got {tuple(t.shape)}")
        tensors.update(k=k, v=v)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("block_table", block_table)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim; call "
                             f"{name}.contiguous()")
        tensors[name] = t
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx selects rows of a contiguous cache; a paged cache "
                             "(block_table) names its pages instead: pass one of them")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table must be [B, max_pages] with B = {batch}, got "
                             f"{tuple(block_table.shape)}")
        if k_cache.shape[1] < MIN_PAGE_SIZE:
            raise ValueError(f"a paged cache's page_size (dim 1 of k_cache) must be at least "
                             f"{MIN_PAGE_SIZE}, got {k_cache.shape[1]}")
    elif cache_batch_idx is not None:
        if tuple(cache_batch_idx.shape) != (batch,):
            raise ValueError(f"cache_batch_idx must be [B] = ({batch},), got "
                             f"{tuple(cache_batch_idx.shape)}")
    elif k_cache.shape[0] < batch:
        raise ValueError(f"k_cache has {k_cache.shape[0]} rows for a batch of {batch}; pass "
                         "cache_batch_idx to choose them")
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (batch,):
            raise ValueError(f"cache_seqlens must be an int32 tensor of shape ({batch},), got "
                             f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}")
        if cache_seqlens.stride(0) != 1:
            raise ValueError("cache_seqlens must be contiguous")
        tensors["cache_seqlens"] = cache_seqlens
    elif cache_seqlens is not None and (isinstance(cache_seqlens, bool) or not isinstance(
            cache_seqlens, _INT_TYPES) or cache_seqlens < 0):
        raise TypeError(f"cache_seqlens must be an int32 tensor, an int >= 0 or None, got "
                        f"{cache_seqlens!r}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, _INT_TYPES) or not (
            0 <= num_splits <= 128):
        raise ValueError(f"num_splits must be an int from 0 (automatic) to 128, got "
                         f"{num_splits!r}")
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        if name in tensors:
            _check_strides(name, tensors[name])
    scale = _resolve_scale(softmax_scale, q.shape[-1])
    window = _resolve_window(window_size, causal)
    if out is not None:
        _check_out(out, q, None)
        tensors["out"] = out
    _check_devices(tensors, require_cuda=True)
    for name, t in tensors.items() if check_pointers else ():
        if t.dtype in (torch.float16, torch.bfloat16) and t.data_ptr() % COPY_ALIGN_BYTES:
            raise ValueError(f"{name} must start on a {COPY_ALIGN_BYTES}-byte boundary for "
                             f"128-bit copies; call {name}.contiguous()")
    return scale, encode_window(window)


def check_kvcache_values(cache_seqlens: torch.Tensor, k_cache: torch.Tensor,
                         block_table: torch.Tensor | None, new_tokens: int,
                         capacity: int) -> None:
    """The opt-in check of ``attention_with_kvcache(check_cache=True)``: every sequence's
    keys (with the new ones) fit its cache, and every page it reads exists (one host sync).

    Raises:
        ValueError: a length past the cache or a page index out of range, naming it.
    """
    lengths = cache_seqlens.tolist()
    for b, length in enumerate(lengths):
        if length < 0 or length + new_tokens > capacity:
            raise ValueError(f"cache_seqlens[{b}] = {length} with {new_tokens} new tokens does "
                             f"not fit the cache's {capacity} rows")
    if block_table is not None:
        page_size, pages = k_cache.shape[1], k_cache.shape[0]
        for b, length in enumerate(lengths):
            used = block_table[b, : -(-(length + new_tokens) // page_size)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= pages):
                raise ValueError(f"block_table[{b}] names pages outside [0, {pages}) among the "
                                 f"{used.numel()} its {length + new_tokens} keys use")
