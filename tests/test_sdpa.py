"""attnlab.sdpa: how it maps torch SDPA's arguments onto attention(), and what it refuses.

Two levels: a stand-in attention() records the mapping (views, scale, window); and, with the
runtime replaced by conftest.Recorder (reference results), the whole call is compared with
torch's own F.scaled_dot_product_attention on CPU, which pins down the semantics (notably
top-left causal alignment) independently of our reading of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import pytest
import torch
import torch.nn.functional as F

import attnlab

if TYPE_CHECKING:
    from conftest import Recorder

sdpa_module = importlib.import_module("attnlab.sdpa")


def bhsd(make_qkv, batch=2, seqlen_q=6, seqlen_k=10, heads=4, head_dim=64, heads_kv=None,
         seed=0):
    """q/k/v in SDPA's BHSD layout (contiguous)."""
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, head_dim, heads_kv=heads_kv, seed=seed)
    return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))


class AttentionSpy:
    """Stand-in for attnlab.attention: records its arguments, returns a dense BSHD tensor."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.returned: torch.Tensor | None = None

    def __call__(self, q, k, v, **kwargs):
        self.calls.append(dict(q=q, k=k, v=v, **kwargs))
        self.returned = torch.randn(q.shape).to(q.dtype)
        return self.returned


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> AttentionSpy:
    spy = AttentionSpy()
    monkeypatch.setattr(sdpa_module, "attention", spy)
    return spy


def is_transpose_of(view: torch.Tensor, t: torch.Tensor) -> bool:
    """``view`` is ``t.transpose(1, 2)``: the same memory, no copy."""
    return (view.data_ptr() == t.data_ptr() and view.shape == t.transpose(1, 2).shape
            and view.stride() == t.transpose(1, 2).stride())


# --------------------------------------------------------------------------------------------
def test_transposed_views_in_and_out(make_qkv, spy: AttentionSpy) -> None:
    q, k, v = bhsd(make_qkv)
    out = attnlab.sdpa(q, k, v)
    (call,) = spy.calls
    assert is_transpose_of(call["q"], q)
    assert is_transpose_of(call["k"], k) and is_transpose_of(call["v"], v)
    assert call["softmax_scale"] is None and call["window_size"] == (-1, -1)
    assert out.shape == q.shape
    assert is_transpose_of(out, spy.returned)


def test_scale_is_passed_through(make_qkv, spy: AttentionSpy) -> None:
    attnlab.sdpa(*bhsd(make_qkv), scale=0.3)
    assert spy.calls[0]["softmax_scale"] == 0.3


@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "keys", "window"),
    [
        (8, 8, 8, (-1, 0)),  # square: top-left and bottom-right agree
        (6, 10, 6, (-1, 0)),  # Sq < Sk: keys past row Sq - 1 are seen by none
        (10, 4, 4, (-1, 6)),  # Sq > Sk: right = Sq - Sk puts the diagonal at j = i
        (5, 0, 0, (-1, 5)),
    ],
)
def test_is_causal_maps_top_left_onto_keys_and_window(
    make_qkv, spy: AttentionSpy, seqlen_q: int, seqlen_k: int, keys: int, window
) -> None:
    q, k, v = bhsd(make_qkv, seqlen_q=seqlen_q, seqlen_k=seqlen_k)
    attnlab.sdpa(q, k, v, is_causal=True)
    (call,) = spy.calls
    assert call["window_size"] == window
    assert is_transpose_of(call["k"], k[:, :, :keys]) and is_transpose_of(call["v"], v[:, :, :keys])


def test_gqa_heads_pass_through_unexpanded(make_qkv, spy: AttentionSpy) -> None:
    q, k, v = bhsd(make_qkv, heads=8, heads_kv=2)
    attnlab.sdpa(q, k, v, enable_gqa=True)
    (call,) = spy.calls
    assert call["k"].shape[2] == 2 and is_transpose_of(call["k"], k)


# --------------------------------------------------------------------------------------------
def test_dense_mask_is_not_implemented(make_qkv, spy: AttentionSpy) -> None:
    q, k, v = bhsd(make_qkv)
    mask = torch.ones(6, 10, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="^attnlab.sdpa does not support attn_mask"):
        attnlab.sdpa(q, k, v, attn_mask=mask)
    assert spy.calls == []


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 1e-9])
def test_dropout_is_not_implemented(make_qkv, spy: AttentionSpy, dropout_p: float) -> None:
    with pytest.raises(NotImplementedError) as info:
        attnlab.sdpa(*bhsd(make_qkv), dropout_p=dropout_p)
    assert str(info.value) == (
        "attnlab.sdpa does not support dropout (the kernel has none): dropout_p must be 0.0, "
        f"got {dropout_p!r}"
    )
    assert spy.calls == []


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_other_ranks_are_not_implemented(make_qkv, spy: AttentionSpy, which: str) -> None:
    args = dict(zip(("query", "key", "value"), bhsd(make_qkv), strict=True))
    args[which] = args[which][0]
    with pytest.raises(NotImplementedError) as info:
        attnlab.sdpa(**args)
    assert str(info.value).startswith(
        f"attnlab.sdpa takes 4-D [batch, heads, seqlen, head_dim] tensors; {which} is 3-D"
    )


def test_non_tensor_is_a_type_error(make_qkv, spy: AttentionSpy) -> None:
    q, k, _ = bhsd(make_qkv)
    with pytest.raises(TypeError, match="^value must be a torch.Tensor, got list$"):
        attnlab.sdpa(q, k, [[1.0]])


@pytest.mark.parametrize(("heads", "heads_kv"), [(8, 2), (4, 8)])
def test_head_mismatch_without_enable_gqa(make_qkv, spy, heads: int, heads_kv: int) -> None:
    q, k, v = bhsd(make_qkv, heads=heads, heads_kv=heads_kv)
    with pytest.raises(sdpa_module.HeadCountMismatch) as ours:
        attnlab.sdpa(q, k, v)
    assert isinstance(ours.value, ValueError) and isinstance(ours.value, RuntimeError)
    assert str(ours.value) == (
        f"query, key and value must have the same number of heads (dim 1) unless "
        f"enable_gqa=True, got {heads}, {heads_kv} and {heads_kv}"
    )
    # torch raises a RuntimeError for the same call: code catching that catches ours.
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert spy.calls == []


def test_scale_and_enable_gqa_are_keyword_only(make_qkv, spy: AttentionSpy) -> None:
    q, k, v = bhsd(make_qkv)
    with pytest.raises(TypeError):
        attnlab.sdpa(q, k, v, None, 0.0, False, 0.3)  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# Semantics against torch's SDPA (CPU math backend, fp32), runtime replaced by the Recorder
@pytest.mark.parametrize(
    ("seqlen_q", "seqlen_k", "heads", "heads_kv", "is_causal", "scale"),
    [
        (7, 7, 4, 4, False, None),
        (7, 7, 4, 4, True, None),
        (5, 12, 4, 2, True, 0.2),
        (12, 5, 4, 1, True, None),
        (9, 3, 2, 2, False, 0.5),
        (1, 16, 8, 2, True, None),
    ],
)
def test_matches_torch_sdpa(
    make_qkv, recorder: Recorder, seqlen_q, seqlen_k, heads, heads_kv, is_causal, scale
) -> None:
    q, k, v = bhsd(make_qkv, 2, seqlen_q, seqlen_k, heads, 64, heads_kv, seed=seqlen_q)
    got = attnlab.sdpa(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=heads != heads_kv)
    want = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale,
        enable_gqa=heads != heads_kv,
    )
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.float(), want, atol=2e-3, rtol=2e-3)
