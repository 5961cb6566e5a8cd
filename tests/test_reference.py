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
    """||actual - expected|| / max(||expected||, floor * sqrt(numel)), computed in float64.

    0 for empty tensors (callers check shapes separately).
    """
    if expected.numel() == 0:
        return 0.0
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
    q, k, v = make_qkv(head_dim=80)
    with pytest.raises(ValueError, match="head_dim 80"):
        reference.attention(q, k, v)
    with pytest.raises(TypeError, match="int32"):
        reference.attention(*(t.int() for t in make_qkv()))
    with pytest.raises(ValueError, match="softmax_scale must be finite"):
        reference.attention(*make_qkv(), softmax_scale=math.inf)


# --------------------------------------------------------------------------------------------
# Causal, windows, GQA and varlen against a naive loop with an explicit mask
def naive_masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    window: tuple[int, int] = (-1, -1),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the keys each row may see, one (batch, q head, row) at a time, in float64.

    Row ``i`` sees key ``j`` iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (a side of
    -1 unbounded); q head ``h`` reads k/v head ``h // (Hq // Hkv)``. A row that sees no key is 0
    with lse -inf. Written with Python loops and index lists so it shares nothing with
    reference.window_mask or repeat_interleave.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    left, right = window
    out = torch.zeros(batch, seqlen_q, heads, head_dim, dtype=torch.float64)
    lse = torch.full((batch, heads, seqlen_q), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            h_kv = h // (heads // heads_kv)
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                keys = [
                    j for j in range(seqlen_k)
                    if (left == -1 or j >= diagonal - left)
                    and (right == -1 or j <= diagonal + right)
                ]
                if not keys:
                    continue
                scores = (k[b, keys, h_kv].double() @ q[b, i, h].double()) * scale
                row_max = scores.max()
                weights = torch.exp(scores - row_max)
                out[b, i, h] = (weights @ v[b, keys, h_kv].double()) / weights.sum()
                lse[b, h, i] = row_max + torch.log(weights.sum())
    return out, lse


def assert_masked_matches_naive(q, k, v, causal: bool, window_size, compute_dtype) -> None:
    out, lse = reference.attention(
        q, k, v, causal=causal, window_size=window_size, return_lse=True,
        compute_dtype=compute_dtype,
    )
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    window = (window_size[0], 0) if causal else tuple(window_size)
    want_out, want_lse = naive_masked_attention(q, k, v, 1 / math.sqrt(q.shape[-1]), window)
    assert not out.isnan().any() and not lse.isnan().any()
    # Rows that see no key must be exactly 0 / -inf; compare the rest as numbers.
    no_keys = want_lse == -math.inf
    assert torch.equal(lse == -math.inf, no_keys)
    assert torch.equal(out.transpose(1, 2)[no_keys], torch.zeros_like(out.transpose(1, 2)[no_keys]))
    tol = TOLERANCE[compute_dtype]
    assert rel_l2(out, want_out, floor=1e-3) < tol
    assert rel_l2(lse[~no_keys], want_lse[~no_keys], floor=1.0) < tol


WINDOWS = st.sampled_from([(-1, -1), (-1, 0), (0, 0), (0, -1), (3, 0), (0, 5), (2, 7), (20, 20)])


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 2),
    seqlen_q=st.integers(1, 24),
    seqlen_k=st.integers(0, 24),
    heads_kv=st.integers(1, 3),
    group=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),
    window_size=WINDOWS,
    compute_dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_masked_gqa_matches_naive_on_random_shapes(
    make_qkv, batch, seqlen_q, seqlen_k, heads_kv, group, causal, window_size, compute_dtype,
    seed,
) -> None:
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads_kv * group, 64, heads_kv=heads_kv,
                       dtype=torch.bfloat16, seed=seed)
    assert_masked_matches_naive(q, k, v, causal, window_size, compute_dtype)


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "causal", "window_size"),
    [
        (8, 8, True, (-1, -1)),
        (5, 12, True, (-1, -1)),  # Sq < Sk: the last row sees every key
        (12, 5, True, (-1, -1)),  # Sq > Sk: the first 7 rows see no key
        (12, 5, False, (0, 0)),  # one key per row, none for the first 7
        (9, 9, False, (0, 0)),
        (16, 16, False, (3, 0)),
        (10, 16, False, (2, 3)),
        (16, 16, True, (4, 9)),  # causal drops the right side: (4, 0)
    ],
)
def test_masked_cases_match_naive(make_qkv, seqlen_q, seqlen_k, causal, window_size) -> None:
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 64, heads_kv=2, seed=seqlen_q * seqlen_k)
    assert_masked_matches_naive(q, k, v, causal, window_size, torch.float64)


def test_causal_with_more_queries_than_keys_leaves_leading_rows_empty(make_qkv) -> None:
    q, k, v = make_qkv(1, 6, 2, 1, 64)
    out, lse = reference.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(lse[0, 0, :4], torch.full((4,), -math.inf))
    assert torch.equal(out[0, :4], torch.zeros(4, 1, 64))
    # Row 4 sees key 0 alone, so it returns v[0] exactly; row 5 sees both keys.
    assert torch.equal(out[0, 4], v[0, 0].float())
    assert lse[0, 0, 5].isfinite()


def test_mqa_equals_mha_on_repeated_kv(make_qkv) -> None:
    q, k, v = make_qkv(2, 7, 9, 4, 64, heads_kv=1, seed=9)
    mqa = reference.attention(q, k, v, compute_dtype=torch.float64)
    mha = reference.attention(q, k.expand(-1, -1, 4, -1), v.expand(-1, -1, 4, -1),
                              compute_dtype=torch.float64)
    assert torch.equal(mqa, mha)


def test_window_changes_the_result(make_qkv) -> None:
    # Guards against a reference that ignores the mask and still matches on small windows.
    q, k, v = make_qkv(seed=10)
    full = reference.attention(q, k, v)
    assert rel_l2(reference.attention(q, k, v, window_size=(2, 2)), full) > 1e-2
    assert rel_l2(reference.attention(q, k, v, causal=True), full) > 1e-2


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ((-1, -1), None),
        ((-1, 0), [[1, 1, 1, 0], [1, 1, 1, 1]]),
        ((0, 0), [[0, 0, 1, 0], [0, 0, 0, 1]]),
        ((1, -1), [[0, 1, 1, 1], [0, 0, 1, 1]]),
    ],
)
def test_window_mask_is_bottom_right_aligned(window, expected) -> None:
    mask = reference.window_mask(2, 4, window)
    if expected is None:
        assert mask is None
    else:
        assert torch.equal(mask, torch.tensor(expected, dtype=torch.bool))


# --------------------------------------------------------------------------------------------
SEQLENS = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=4)


@settings(max_examples=30, deadline=None)
@given(
    seqlens=SEQLENS,
    group=st.sampled_from([1, 3]),
    causal=st.booleans(),
    window_size=WINDOWS,
    seed=st.integers(0, 2**31 - 1),
)
def test_varlen_matches_naive_per_sequence(
    make_varlen, seqlens, group, causal, window_size, seed
) -> None:
    seqlens_q, seqlens_k = (list(s) for s in zip(*seqlens, strict=True))
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen(
        seqlens_q, seqlens_k, 2 * group, 64, heads_kv=2, dtype=torch.bfloat16, seed=seed
    )
    out, lse = reference.attention_varlen(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window_size,
        return_lse=True, compute_dtype=torch.float64,
    )
    assert out.shape == q.shape and lse.shape == (2 * group, q.shape[0])
    window = (window_size[0], 0) if causal else window_size
    scale = 1 / math.sqrt(64)
    for b in range(len(seqlens_q)):
        rows = slice(cu_q[b].item(), cu_q[b + 1].item())
        keys = slice(cu_k[b].item(), cu_k[b + 1].item())
        want_out, want_lse = naive_masked_attention(
            q[rows].unsqueeze(0), k[keys].unsqueeze(0), v[keys].unsqueeze(0), scale, window
        )
        assert rel_l2(out[rows], want_out[0], floor=1e-3) < TOLERANCE[torch.float64]
        no_keys = want_lse[0] == -math.inf
        assert torch.equal(lse[:, rows] == -math.inf, no_keys)
        assert rel_l2(lse[:, rows][~no_keys], want_lse[0][~no_keys], floor=1.0) < 1e-12


def test_varlen_with_an_offset_max_seqlen_is_refused(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 5], [2, 2])
    with pytest.raises(ValueError, match="max_seqlen_q = 4 is below the longest sequence"):
        reference.attention_varlen(q, k, v, cu_q, cu_k, 4, max_k)


def test_varlen_sequences_do_not_see_each_other(make_varlen) -> None:
    # Attention over the packed batch as one sequence would differ: each must stay alone.
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([4, 4], [6, 6], seed=12)
    out = reference.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    whole = reference.attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))[0]
    assert rel_l2(out, whole) > 1e-2
    second = reference.attention(q[4:].unsqueeze(0), k[6:].unsqueeze(0), v[6:].unsqueeze(0))
    assert torch.equal(out[4:], second[0])
