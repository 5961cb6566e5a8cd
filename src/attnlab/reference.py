"""The ground truth every kernel test compares against: attention in plain torch ops.

Nothing here is fast or clever on purpose; it is the definition the kernels must reproduce.
"""

from __future__ import annotations

import torch

from attnlab.config import FlashConfig
from attnlab.validation import KERNEL_DTYPES, check_inputs

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
    return_lse: bool = False,
    config: FlashConfig | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention ``softmax(scale * Q K^T) V`` computed in ``compute_dtype``.

    Takes the same arguments as :func:`attnlab.attention` and validates them by the same rules
    (:func:`attnlab.validation.check_inputs`), except that tensors may live on any device and
    may also be float32 or float64.

    Args:
        q: ``[B, Sq, H, D]``.
        k, v: ``[B, Sk, H, D]``.
        softmax_scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``.
        return_lse: also return the log-sum-exp of each row of scores.
        config: accepted so calls can switch between the kernel and the reference unchanged;
            ignored.
        compute_dtype: ``torch.float32`` or ``torch.float64``.

    Returns:
        ``out`` of shape ``[B, Sq, H, D]``, or ``(out, lse)`` with ``lse`` of shape
        ``[B, H, Sq]``, where ``lse = log(sum_j exp(scale * s_j))`` (natural log). Both are in
        ``compute_dtype`` and are *not* cast back to the input dtype, so a comparison is not
        blurred by rounding the truth. With ``Sk == 0``, ``out`` is zeros and ``lse`` is -inf.

    Raises:
        ValueError: ``compute_dtype`` is not float32/float64, or as ``check_inputs``.
        TypeError: as ``check_inputs``.
    """
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(
            f"compute_dtype must be one of {', '.join(map(str, COMPUTE_DTYPES))}, "
            f"got {compute_dtype}"
        )
    problem = check_inputs(
        q, k, v, softmax_scale=softmax_scale, require_cuda=False, allowed_dtypes=_INPUT_DTYPES
    )
    # BSHD -> BHSD so that matmul batches over (B, H).
    qh, kh, vh = (t.to(compute_dtype).transpose(1, 2) for t in (q, k, v))
    scores = torch.matmul(qh, kh.transpose(-2, -1)) * problem.softmax_scale
    # Empty sizes need no special case: over Sk == 0, logsumexp gives -inf and the
    # [Sq, 0] @ [0, D] product gives zeros; B, H or Sq == 0 give empty tensors.
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), vh).transpose(1, 2).contiguous()
    if return_lse:
        return out, lse
    return out
