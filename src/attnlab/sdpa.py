"""A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on attnlab's kernel.

torch's SDPA takes BHSD tensors; attnlab's kernel reads BSHD. ``q.transpose(1, 2)`` is a BSHD
view of a BHSD tensor (no copy), and the kernel honours any strides that keep rows 16-byte
aligned, so the mapping is free both ways.
"""

from __future__ import annotations

import torch

from attnlab.api import attention


class HeadCountMismatch(ValueError, RuntimeError):
    """q and k/v head counts differ without ``enable_gqa=True``.

    A ValueError like attnlab's other shape errors, and a RuntimeError, the type torch's SDPA
    raises for the same call, so ``except`` clauses written for either catch it.
    """


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` semantics, for the subset attnlab's kernel serves.

    Args:
        query: ``[B, Hq, Sq, D]`` CUDA tensor, float16 or bfloat16.
        key, value: ``[B, Hkv, Sk, D]``. ``Hkv`` must equal ``Hq`` unless ``enable_gqa``, then
            divide it.
        attn_mask: must be None: a dense mask is not supported (``is_causal`` or
            :func:`attnlab.attention`'s ``window_size`` cover causal and sliding-window masks).
        dropout_p: must be 0.0: the kernel has no dropout.
        is_causal: torch's convention, aligned to the *top-left* corner: row ``i`` sees keys
            ``j <= i`` (``tril(ones(Sq, Sk))``). attnlab's ``causal`` is bottom-right aligned,
            so this maps, exactly and without copies, to attention over the first
            ``n = min(Sq, Sk)`` keys (keys past row ``Sq - 1`` are seen by no row) with window
            ``(-1, Sq - n)``: bottom-right causal when ``Sq <= Sk``, and when ``Sq > Sk`` a
            right bound that puts the diagonal back at ``j = i``.
        scale: multiplier of QK^T; ``None`` means ``1/sqrt(D)``. Must be positive.
        enable_gqa: allow k/v to have fewer heads than q (grouped-query attention).

    Returns:
        ``[B, Hq, Sq, D]`` in query's dtype: a BHSD view of a contiguous BSHD tensor, as torch's
        flash backend returns. Unlike torch, a row that sees no key (``Sk == 0``) is 0, not NaN.

    Raises:
        NotImplementedError: ``attn_mask`` given, ``dropout_p`` not 0, or tensors that are not
            4-D (torch also takes other ranks).
        HeadCountMismatch: (ValueError and RuntimeError) head counts differ without
            ``enable_gqa``.
        TypeError, ValueError: as :func:`attnlab.attention`; its messages name the BSHD views
            ``q``, ``k``, ``v`` (so their dims 1 and 2 are swapped with respect to yours).
    """
    if attn_mask is not None:
        raise NotImplementedError(
            "attnlab.sdpa does not support attn_mask (a dense mask); use is_causal=True, "
            "attnlab.attention(..., window_size=(left, right)) for a sliding window, or torch's "
            "scaled_dot_product_attention"
        )
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"attnlab.sdpa does not support dropout (the kernel has none): dropout_p must be "
            f"0.0, got {dropout_p!r}"
        )
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise NotImplementedError(
                f"attnlab.sdpa takes 4-D [batch, heads, seqlen, head_dim] tensors; {name} is "
                f"{t.dim()}-D with shape {tuple(t.shape)}"
            )
    if not enable_gqa and not query.shape[1] == key.shape[1] == value.shape[1]:
        raise HeadCountMismatch(
            f"query, key and value must have the same number of heads (dim 1) unless "
            f"enable_gqa=True, got {query.shape[1]}, {key.shape[1]} and {value.shape[1]}"
        )
    window_size = (-1, -1)
    # (A key/value length mismatch is left unsliced, for attention() to report.)
    if is_causal and key.shape[2] == value.shape[2]:
        seqlen_q = query.shape[2]
        keys = min(seqlen_q, key.shape[2])
        key, value = key[:, :, :keys], value[:, :, :keys]
        window_size = (-1, seqlen_q - keys)
    out = attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=scale,
        window_size=window_size,
    )
    return out.transpose(1, 2)
