"""The ground truth every kernel test compares against: attention in plain torch ops.

Nothing here is fast or clever on purpose; it is the definition the kernels must reproduce.
"""

from __future__ import annotations

import torch

from attnlab.config import FlashConfig
from attnlab.validation import (
    FULL_WINDOW,
    KERNEL_DTYPES,
    check_cu_seqlens_values,
    check_inputs,
    check_varlen_inputs,
)

#: Precisions the reference computes in: wide enough to judge fp16/bf16 kernels.
COMPUTE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)

# The reference also takes fp32/fp64 inputs, so a test can feed it exact data.
_INPUT_DTYPES = KERNEL_DTYPES + COMPUTE_DTYPES


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = FULL_WINDOW,
    return_lse: bool = False,
    config: FlashConfig | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(scale * Q K^T + mask) V`` computed in ``compute_dtype``.

    Takes the same arguments as :func:`attnlab.attention` (but ``out``) and validates them by
    the same rules (:func:`attnlab.validation.check_inputs`), except that tensors may live on
    any device and may also be float32 or float64.

    Args:
        q: ``[B, Sq, Hq, D]``.
        k, v: ``[B, Sk, Hkv, D]``; ``Hkv`` divides ``Hq`` and q head ``h`` reads k/v head
            ``h // (Hq // Hkv)``.
        softmax_scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``.
        causal: bottom-right aligned causal mask (row ``i`` sees keys ``j <= i + Sk - Sq``).
        window_size: ``(left, right)`` sliding window, -1 for unbounded; see
            :func:`window_mask`. ``causal`` sets ``right = 0``.
        return_lse: also return the log-sum-exp of each row of scores.
        config: accepted so calls can switch between the kernel and the reference unchanged;
            ignored.
        compute_dtype: ``torch.float32`` or ``torch.float64``.

    Returns:
        ``out`` of shape ``[B, Sq, Hq, D]``, or ``(out, lse)`` with ``lse`` of shape
        ``[B, Hq, Sq]``, where ``lse = log(sum_j exp(scale * s_j))`` over the keys the row
        attends (natural log). Both are in ``compute_dtype`` and are *not* cast back to the
        input dtype, so a comparison is not blurred by rounding the truth. A row that attends
        no key (``Sk == 0``, or masked out entirely) has ``out`` 0 and ``lse`` -inf.

    Raises:
        ValueError: ``compute_dtype`` is not float32/float64, or as ``check_inputs``.
        TypeError: as ``check_inputs``.
    """
    _check_compute_dtype(compute_dtype)
    problem = check_inputs(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        require_cuda=False,
        allowed_dtypes=_INPUT_DTYPES,
    )
    out, lse = _attention(q, k, v, problem.softmax_scale, problem.window, compute_dtype)
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
    window_size: tuple[int, int] = FULL_WINDOW,
    return_lse: bool = False,
    config: FlashConfig | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention` on each sequence of a packed batch, as :func:`attnlab.attention_varlen`.

    Validated like the kernel's inputs (:func:`attnlab.validation.check_varlen_inputs`) and,
    unlike the kernel, the offsets' values too (:func:`check_cu_seqlens_values`): the reference
    reads them anyway. Causal alignment and windows apply per sequence, with that sequence's
    own ``Sq`` and ``Sk``.

    Returns:
        ``out`` of shape ``[total_q, Hq, D]``, or ``(out, lse)`` with ``lse`` of shape
        ``[Hq, total_q]`` (flash_attn_varlen_func's layout), in ``compute_dtype``.
    """
    _check_compute_dtype(compute_dtype)
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
        require_cuda=False,
        allowed_dtypes=_INPUT_DTYPES,
    )
    check_cu_seqlens_values(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    out = torch.zeros(q.shape, dtype=compute_dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), -torch.inf, dtype=compute_dtype, device=q.device)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(problem.batch):
        rows = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b + 1])
        # One sequence is a dense batch of one.
        seq_out, seq_lse = _attention(
            q[rows].unsqueeze(0),
            k[keys].unsqueeze(0),
            v[keys].unsqueeze(0),
            problem.softmax_scale,
            problem.window,
            compute_dtype,
        )
        out[rows] = seq_out[0]
        lse[:, rows] = seq_lse[0]
    if return_lse:
        return out, lse
    return out


def window_mask(
    seqlen_q: int, seqlen_k: int, window: tuple[int, int], device: torch.device | str = "cpu"
) -> torch.Tensor | None:
    """The boolean ``[Sq, Sk]`` mask of keys each query row attends, or None for all of them.

    FlashAttention-2's convention, bottom-right aligned: row ``i`` attends key ``j`` iff
    ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a side of -1 being unbounded. Causal
    attention is ``(-1, 0)``.
    """
    left, right = window
    if (left, right) == FULL_WINDOW:
        return None
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    # The diagonal key of each row: with Sq != Sk the last query row lines up with the last key.
    diagonal = rows + (seqlen_k - seqlen_q)
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        allowed &= cols >= diagonal - left
    if right >= 0:
        allowed &= cols <= diagonal + right
    return allowed


# --------------------------------------------------------------------------------------------
def _check_compute_dtype(compute_dtype: torch.dtype) -> None:
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {', '.join(map(str, COMPUTE_DTYPES))}, "
            f"got {compute_dtype}"
        )


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    window: tuple[int, int],
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated BSHD inputs -> (out ``[B, Sq, Hq, D]``, lse ``[B, Hq, Sq]``)."""
    # GQA: give every q head its own copy of its k/v head (the kernel reads them in place).
    group = q.shape[2] // k.shape[2] if k.shape[2] else 1
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    # BSHD -> BHSD so that matmul batches over (B, H).
    qh, kh, vh = (t.to(compute_dtype).transpose(1, 2) for t in (q, k, v))
    scores = torch.matmul(qh, kh.transpose(-2, -1)) * softmax_scale
    allowed = window_mask(q.shape[1], k.shape[1], window, q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -torch.inf)
    # logsumexp of a row of -inf (no key attended, including Sk == 0) is -inf.
    lse = torch.logsumexp(scores, dim=-1)
    # exp(s - lse) is the softmax; where lse is -inf every exp(s) is 0 already, and shifting by
    # 0 instead keeps exp(-inf - -inf) = NaN out of those rows, whose output is then 0.
    weights = torch.exp(scores - lse.masked_fill(lse == -torch.inf, 0.0).unsqueeze(-1))
    # Empty sizes need no special case: [Sq, 0] @ [0, D] gives zeros; B, H or Sq == 0 give
    # empty tensors.
    out = torch.matmul(weights, vh).transpose(1, 2).contiguous()
    return out, lse
