"""The user-facing entry points: validate, then run the forward custom op (attnlab.ops).

Validation here reads only host-side metadata, so torch.compile(fullgraph=True) traces these
functions through to the op; config dispatch, the empty-input fast paths, the data-pointer
checks and the kernel launch happen inside the op, on real tensors.
"""

from __future__ import annotations

import torch

from attnlab import ops
from attnlab.config import FlashConfig
from attnlab.validation import (
    UNBOUNDED,
    Problem,
    check_cu_seqlens_values,
    check_inputs,
    check_varlen_inputs,
)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = UNBOUNDED,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config: FlashConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(scale * Q K^T + mask) V`` on the GPU (FlashAttention-2 forward).

    Args:
        q: ``[B, Sq, Hq, D]`` CUDA tensor, float16 or bfloat16.
        k, v: ``[B, Sk, Hkv, D]``, same dtype and device as ``q``. ``Sk`` may differ from
            ``Sq``. ``Hkv`` must divide ``Hq`` (GQA; ``Hkv == 1`` is MQA): q head ``h`` reads
            k/v head ``h // (Hq // Hkv)``, in place, without copies. ``D`` must be one of
            ``attnlab.config.SUPPORTED_HEAD_DIMS``. Each tensor must be contiguous in its last
            dim, start on a 16-byte boundary and have strides of dims 0..2 that are multiples
            of 8 elements; ``.contiguous()`` satisfies all three.
        softmax_scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``. Any finite positive
            real number.
        causal: mask the keys after each row's diagonal, aligned to the bottom-right corner
            when ``Sq != Sk`` (FlashAttention-2's convention: row ``i`` sees keys
            ``j <= i + Sk - Sq``; with ``Sq > Sk`` the first ``Sq - Sk`` rows see none). Sets
            ``window_size``'s right side to 0 and keeps its left side, as flash_attn does.
        window_size: ``(left, right)`` sliding window: row ``i`` sees keys
            ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded.
        return_lse: also return the natural-log log-sum-exp of each row of scaled scores.
        out: write the result into this tensor (q's shape, dtype and device; any layout that
            q could have; not overlapping q, k or v) and return it. Works under torch.compile
            (through a mutating custom op) and CUDA graphs.
        config: the kernel configuration; ``None`` picks the default for the GPU and problem
            at launch time.

    Returns:
        ``out`` (a new contiguous ``[B, Sq, Hq, D]`` tensor in q's dtype unless one was given),
        or ``(out, lse)`` with ``lse`` a new float32 ``[B, Hq, Sq]`` tensor. A row that sees no
        key (``Sk == 0``, or masked out entirely) gets ``out`` 0 and ``lse`` -inf, as in
        :func:`attnlab.reference.attention`. With ``B``, ``Sq``, ``Hq`` or ``Sk`` zero no
        kernel runs.

    Raises:
        TypeError: ``config`` is neither None nor a FlashConfig; a non-tensor input; an
            unsupported or mismatched dtype; a softmax_scale, causal or window_size of the wrong
            type. The config type is checked first: a wrong-typed config is a mistake whatever
            the tensors.
        ValueError: bad rank, shapes, heads, head dim, layout, softmax_scale, window or out;
            tensors not on CUDA or not on one device (see
            :func:`attnlab.validation.check_inputs`).
        attnlab.ConfigError: (a ValueError) the config cannot serve this head dim on this GPU,
            e.g. its tiles overflow shared memory.
    """
    _check_config_type(config)
    problem = check_inputs(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        out=out,
        check_pointers=False,
    )
    out, lse = _run(q, k, v, out, problem, config)
    if return_lse:
        return out, lse
    return out


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = UNBOUNDED,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config: FlashConfig | None = None,
    check_cu_seqlens: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention` over a batch of sequences of different lengths, packed without padding.

    The arguments of flash_attn's ``flash_attn_varlen_func``: sequence ``b`` is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of
    k and v. Causal alignment and windows apply within each sequence, with its own lengths;
    sequences may be empty.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]``. Rules as :func:`attention`, with
            strides of dims 0..1 multiples of 8 elements.
        cu_seqlens_q, cu_seqlens_k: int32, 1-D, contiguous CUDA tensors of ``B + 1`` offsets:
            starting at 0, non-decreasing, ending at ``total_q`` / ``total_k``.
        max_seqlen_q, max_seqlen_k: ints, at least the longest sequence of q / of k and v.
        check_cu_seqlens: verify the offsets' values and the max lengths first. That copies
            the offsets to the host, a synchronisation that CUDA-graph capture forbids and
            torch.compile cannot trace, so it is off by default: the kernel trusts the offsets,
            and wrong ones give wrong results or out-of-bounds reads.
        The rest: as :func:`attention`.

    Returns:
        ``out`` (``[total_q, Hq, D]``), or ``(out, lse)`` with ``lse`` a float32
        ``[Hq, total_q]`` tensor (flash_attn_varlen_func's layout).

    Raises:
        TypeError, ValueError, attnlab.ConfigError: as :func:`attention`, and for bad offsets
            or max lengths (see :func:`attnlab.validation.check_varlen_inputs`).
    """
    _check_config_type(config)
    problem = check_varlen_inputs(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        out=out,
        check_pointers=False,
    )
    if check_cu_seqlens:
        check_cu_seqlens_values(
            cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
        )
    out, lse = _run(q, k, v, out, problem, config, cu_seqlens_q, cu_seqlens_k)
    if return_lse:
        return out, lse
    return out


def _check_config_type(config: object) -> None:
    if config is not None and not isinstance(config, FlashConfig):
        raise TypeError(
            f"config must be an attnlab.FlashConfig or None, got {type(config).__name__} "
            f"{config!r}"
        )


def _run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None,
    problem: Problem,
    config: FlashConfig | None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Under torch.compile, call the functional op (or the mutating one when the caller gave
    ``out``); eagerly, run the same body without the dispatcher."""
    max_seqlens = (problem.seqlen_q, problem.seqlen_k) if problem.varlen else (None, None)
    if not torch.compiler.is_compiling():
        out = ops.new_out(q) if out is None else out
        lse = ops.new_lse(q, varlen=problem.varlen)
        ops.forward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *max_seqlens,
                    problem.softmax_scale, problem.window, config)
        return out, lse
    args = (
        cu_seqlens_q,
        cu_seqlens_k,
        *max_seqlens,
        problem.softmax_scale,
        *problem.window,
        *ops.encode_config(config),
    )
    if out is None:
        return ops.attention_fwd(q, k, v, *args)
    return out, ops.attention_fwd_out(q, k, v, out, *args)
