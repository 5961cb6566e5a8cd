"""The reference against an independent, naive attention written row by row in float64."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import FlashConfig, reference

#: Relative L2 error allowed of the reference, by compute dtype.
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * Q K^T) V and its log-sum-exp, one (batch, head) at a time, in float64.

    Spelled out with exp and sum (no torch.softmax/logsumexp) so it shares no code path with the
    reference. Needs Sk >= 1.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    out = torch.empty(batch, seqlen_q, heads, head_dim, dtype=torch.float64)
    lse = torch.empty(batch, heads, seqlen_q, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            qs, ks, vs = (t[b, :, h, :].double() for t in (q, k, v))
            scores = (qs @ ks.T) * scale
            row_max = scores.max(dim=1, keepdim=True).values
            weights = torch.exp(scores - row_max)
            row_sum = weights.sum(dim=1, keepdim=True)
            out[b, :, h, :] = (weights @ vs) / row_sum
            lse[b, h, :] = (row_max + torch.log(row_sum)).squeeze(1)
    return out, lse


def rel_l2(actual: torch.Tensor, expected: torch.Tensor, floor: float = 0.0) -> float:
    """||actual - expected|| / max(||expected||, floor * sqrt(numel)), computed in float64."""
    expected = expected.double()
    scale = max(expected.norm().item(), floor * math.sqrt(expected.numel()))
    return ((actual.double() - expected).norm() / scale).item()


def assert_matches_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    compute_dtype: torch.dtype,
    softmax_scale: float | None = None,
) -> None:
    out, lse = reference.attention(
        q, k, v, softmax_scale=softmax_scale, return_lse=True, compute_dtype=compute_dtype
    )
    batch, seqlen_q, heads, head_dim = q.shape
    assert out.shape == (batch, seqlen_q, heads, head_dim)
    assert lse.shape == (batch, heads, seqlen_q)
    assert out.dtype == lse.dtype == compute_dtype
    scale = 1 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    want_out, want_lse = naive_attention(q, k, v, scale)
    tol = TOLERANCE[compute_dtype]
    assert rel_l2(out, want_out) < tol
    # An lse near zero (one key, a small score) makes a pure relative error meaningless: judge
    # it against at least unit magnitude, which is also what exp(s - lse) is sensitive to.
    assert rel_l2(lse, want_lse, floor=1.0) < tol


SHAPES = [
    # (batch, seqlen_q, seqlen_k, heads, head_dim)
    (1, 1, 1, 1, 64),
    (1, 1, 37, 2, 128),
    (2, 19, 1, 3, 64),
    (2, 5, 40, 2, 64),
    (1, 64, 64, 4, 128),
    (3, 33, 7, 1, 128),
]


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_naive(
    make_qkv, shape: tuple[int, ...], dtype: torch.dtype, compute_dtype: torch.dtype
) -> None:
    q, k, v = make_qkv(*shape, dtype=dtype, seed=sum(shape))
    assert_matches_naive(q, k, v, compute_dtype)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    seqlen_q=st.integers(1, 48),
    seqlen_k=st.integers(1, 48),
    heads=st.integers(1, 3),
    head_dim=st.sampled_from([64, 128]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    compute_dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_naive_on_random_shapes(
    make_qkv,
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    compute_dtype: torch.dtype,
    seed: int,
) -> None:
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, head_dim, dtype=dtype, seed=seed)
    assert_matches_naive(q, k, v, compute_dtype)


@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("softmax_scale", [1.0, 0.3, 4.0])
def test_explicit_softmax_scale(make_qkv, softmax_scale: float, compute_dtype) -> None:
    # 4.0 makes scores in the tens: exp without subtracting the row max would overflow.
    q, k, v = make_qkv(2, 9, 21, 2, 64, dtype=torch.bfloat16, seed=7)
    assert_matches_naive(q, k, v, compute_dtype, softmax_scale=softmax_scale)


def test_scale_changes_the_result(make_qkv) -> None:
    # Guards against a reference that ignores softmax_scale and still matches at the default.
    q, k, v = make_qkv(seed=3)
    default = reference.attention(q, k, v)
    assert rel_l2(reference.attention(q, k, v, softmax_scale=0.5), default) > 1e-2


def test_strided_views_give_the_contiguous_result(make_qkv) -> None:
    q, k, v = make_qkv(2, 12, 20, 3, 128, seed=11)
    # q stored BHSD, k with rows padded to 136 halves: both legal, neither contiguous.
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    k_view = torch.zeros(2, 20, 3, 136, dtype=k.dtype)[..., :128]
    k_view.copy_(k)
    want = reference.attention(q, k, v, compute_dtype=torch.float64)
    got = reference.attention(q_view, k_view, v, compute_dtype=torch.float64)
    assert torch.equal(got, want)
    assert got.is_contiguous()


def test_only_out_without_return_lse(make_qkv) -> None:
    out = reference.attention(*make_qkv())
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, 16, 2, 64)
    assert out.dtype == torch.float32


def test_config_is_ignored(make_qkv) -> None:
    q, k, v = make_qkv(seed=5)
    config = FlashConfig(block_m=128, block_n=32)
    assert torch.equal(reference.attention(q, k, v, config=config), reference.attention(q, k, v))


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compute_dtype", [torch.float32, torch.float64])
def test_no_keys_gives_zeros_and_minus_inf(make_qkv, compute_dtype: torch.dtype) -> None:
    q, k, v = make_qkv(2, 5, 0, 3, 64)
    out, lse = reference.attention(q, k, v, return_lse=True, compute_dtype=compute_dtype)
    assert out.shape == (2, 5, 3, 64)
    assert lse.shape == (2, 3, 5)
    assert out.dtype == lse.dtype == compute_dtype
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -math.inf))


@pytest.mark.parametrize(
    "shape",
    [(0, 5, 7, 2, 64), (2, 0, 7, 2, 128), (2, 5, 7, 0, 64), (0, 0, 0, 1, 64)],
    ids=["batch0", "seqlen_q0", "heads0", "all0"],
)
def test_empty_problems_give_empty_results(make_qkv, shape: tuple[int, ...]) -> None:
    batch, seqlen_q, _, heads, head_dim = shape
    out, lse = reference.attention(*make_qkv(*shape), return_lse=True)
    assert out.shape == (batch, seqlen_q, heads, head_dim)
    assert lse.shape == (batch, heads, seqlen_q)
    assert out.numel() == lse.numel() == 0


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compute_dtype", [torch.float16, torch.bfloat16, torch.int32])
def test_rejects_low_precision_compute_dtype(make_qkv, compute_dtype: torch.dtype) -> None:
    with pytest.raises(ValueError) as info:
        reference.attention(*make_qkv(), compute_dtype=compute_dtype)
    message = str(info.value)
    assert f"got {compute_dtype}" in message
    assert "torch.float32, torch.float64" in message


def test_rejects_what_the_kernel_rejects(make_qkv) -> None:
    q, k, v = make_qkv(head_dim=96)
    with pytest.raises(ValueError, match="head_dim 96"):
        reference.attention(q, k, v)
    with pytest.raises(TypeError, match="int32"):
        reference.attention(*(t.int() for t in make_qkv()))
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        reference.attention(*make_qkv(), softmax_scale=math.inf)
