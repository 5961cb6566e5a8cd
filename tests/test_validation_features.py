"""The input rules of the attention features: GQA, windows, out=, varlen, data pointers, offsets.

Every rule is checked on CPU tensors, with the message it gives (argument, value, what is
supported).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab.validation import (
    check_cu_seqlens_values,
    check_data_pointers,
    check_inputs,
    check_varlen_inputs,
)


def check(q: object, k: object, v: object, **kwargs: object):
    return check_inputs(q, k, v, require_cuda=False, **kwargs)  # type: ignore[arg-type]


def check_varlen(*args: object, **kwargs: object):
    return check_varlen_inputs(*args, require_cuda=False, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# GQA / MQA
@pytest.mark.parametrize(("heads", "heads_kv"), [(8, 8), (8, 4), (8, 2), (8, 1), (6, 3), (0, 2)])
def test_kv_heads_dividing_q_heads_are_accepted(make_qkv, heads: int, heads_kv: int) -> None:
    problem = check(*make_qkv(heads=heads, heads_kv=heads_kv))
    assert (problem.num_heads, problem.num_heads_kv) == (heads, heads_kv)


@pytest.mark.parametrize(("heads", "heads_kv"), [(6, 4), (2, 4), (8, 3), (1, 0)])
def test_kv_heads_not_dividing_q_heads_are_refused(make_qkv, heads: int, heads_kv: int) -> None:
    q, k, v = make_qkv(2, 4, 8, heads, 64, heads_kv=heads_kv)
    with pytest.raises(ValueError) as info:
        check(q, k, v)
    message = str(info.value)
    assert message.startswith(f"q has {heads} heads, not a multiple of the {heads_kv} heads of k")
    assert f"q {tuple(q.shape)}, k {tuple(k.shape)}" in message


def test_k_and_v_heads_must_agree(make_qkv) -> None:
    q, k, _ = make_qkv(2, 4, 8, 8, 64, heads_kv=4)
    v = torch.randn(2, 8, 2, 64).half()
    with pytest.raises(ValueError, match=r"^k and v must have the same number of heads, got k 4 "
                                         r"and v 2"):
        check(q, k, v)


# --------------------------------------------------------------------------------------------
# causal and window_size
@pytest.mark.parametrize(
    ("causal", "window_size", "window"),
    [
        (False, (-1, -1), (-1, -1)),
        (True, (-1, -1), (-1, 0)),
        (False, (0, 0), (0, 0)),
        (False, [16, 3], (16, 3)),
        (True, (16, 3), (16, 0)),
        (False, (np.int64(4), 2), (4, 2)),
    ],
)
def test_window_with_causal_folded_in(make_qkv, causal: bool, window_size, window) -> None:
    problem = check(*make_qkv(), causal=causal, window_size=window_size)
    assert problem.window == window
    assert all(type(side) is int for side in problem.window)
    assert problem.causal == (window == (-1, 0))


@pytest.mark.parametrize("causal", [1, None, "yes", np.bool_(True)])
def test_non_bool_causal_refused(make_qkv, causal: object) -> None:
    with pytest.raises(TypeError) as info:
        check(*make_qkv(), causal=causal)
    assert str(info.value) == f"causal must be a bool, got {type(causal).__name__} {causal!r}"


@pytest.mark.parametrize("window_size", [64, (64,), (1, 2, 3), (1.0, 0), (True, 0), "ab", None])
def test_window_of_wrong_type_refused(make_qkv, window_size: object) -> None:
    with pytest.raises(TypeError) as info:
        check(*make_qkv(), window_size=window_size)
    message = str(info.value)
    assert message.startswith("window_size must be a (left, right) tuple of two ints")
    assert f"{type(window_size).__name__} {window_size!r}" in message


@pytest.mark.parametrize("window_size", [(-2, 0), (0, -2), (-5, -5)])
def test_window_side_below_minus_one_refused(make_qkv, window_size: tuple[int, int]) -> None:
    with pytest.raises(ValueError) as info:
        check(*make_qkv(), window_size=window_size)
    assert str(info.value) == (
        "window_size must be (left, right) with each side -1 (unbounded) or a number of keys "
        f">= 0, got {window_size}"
    )


# --------------------------------------------------------------------------------------------
# out=
def test_out_like_q_accepted_in_any_copyable_layout(make_qkv) -> None:
    q, k, v = make_qkv(2, 8, 8, 2, 64)
    check(q, k, v, out=torch.empty_like(q))
    check(q, k, v, out=torch.empty(2, 2, 8, 64).half().transpose(1, 2))


@pytest.mark.parametrize("out", [[1.0], np.zeros((2, 16, 2, 64), np.float16)])
def test_out_not_a_tensor_refused(make_qkv, out: object) -> None:
    with pytest.raises(TypeError, match=f"^out must be a torch.Tensor or None, got "
                                        f"{type(out).__name__}$"):
        check(*make_qkv(), out=out)


def test_out_of_another_shape_refused(make_qkv) -> None:
    q, k, v = make_qkv(2, 8, 12, 2, 64)
    with pytest.raises(ValueError) as info:
        check(q, k, v, out=torch.empty(2, 12, 2, 64).half())
    assert str(info.value) == "out must have q's shape (2, 8, 2, 64), got (2, 12, 2, 64)"


def test_out_of_another_dtype_refused(make_qkv) -> None:
    q, k, v = make_qkv()
    with pytest.raises(TypeError) as info:
        check(q, k, v, out=torch.empty(q.shape, dtype=torch.float32))
    assert str(info.value) == "out must have q's dtype torch.float16, got torch.float32"


def test_out_layout_follows_q_rules(make_qkv) -> None:
    q, k, v = make_qkv(head_dim=64)
    with pytest.raises(ValueError, match=re.escape("out must be contiguous in its last dim")):
        check(q, k, v, out=torch.empty(2, 16, 2, 128).half()[..., ::2])
    with pytest.raises(ValueError, match="^out strides of dims 0..2 must be multiples of 8"):
        check(q, k, v, out=torch.empty(2, 16, 2, 68).half()[..., :64])


def test_out_on_another_device_refused(make_qkv) -> None:
    q, k, v = make_qkv()
    with pytest.raises(ValueError) as info:
        check(q, k, v, out=torch.empty_like(q, device="meta"))
    assert str(info.value) == (
        "q, k, v and out must be on one device, got q on cpu, k on cpu, v on cpu, out on meta"
    )


def test_out_is_checked_for_cuda_too(make_qkv) -> None:
    q, k, v = (t.to("meta") for t in make_qkv())
    with pytest.raises(ValueError, match=r"^attnlab kernels run on CUDA tensors; q is on meta$"):
        check_inputs(q, k, v, out=torch.empty_like(q))


# --------------------------------------------------------------------------------------------
# Data pointers: alignment, and out overlapping q/k/v
def test_pointer_checks_can_be_left_to_the_launch(make_qkv) -> None:
    q, k, v = make_qkv()
    shifted = torch.randn(q.numel() + 1).half()[1:].view(q.shape)
    with pytest.raises(ValueError, match="^q must start on a 16-byte boundary"):
        check(shifted, k, v)
    assert check(shifted, k, v, check_pointers=False).seqlen_q == 16
    with pytest.raises(ValueError, match="^out must not overlap the memory of q"):
        check(q, k, v, out=q)
    assert check(q, k, v, out=q, check_pointers=False).seqlen_q == 16


def test_misaligned_out_refused(make_qkv) -> None:
    q, k, v = make_qkv()
    shifted = torch.empty(q.numel() + 8).half()[8 - 1:-1].view(q.shape)
    with pytest.raises(ValueError) as info:
        check_data_pointers(q, k, v, shifted)
    message = str(info.value)
    assert message.startswith("out must start on a 16-byte boundary")
    assert "storage offset 7" in message


def test_out_sharing_a_buffer_but_not_an_address_range_is_accepted(make_qkv) -> None:
    # q and out are the two halves of one buffer along the batch: disjoint ranges.
    buffer = torch.empty(4, 16, 2, 64).half()
    q, out = buffer[:2], buffer[2:]
    _, k, v = make_qkv()
    check_data_pointers(q, k, v, out)


def test_overlap_message_gives_both_ranges(make_qkv) -> None:
    q, k, v = make_qkv()
    with pytest.raises(ValueError) as info:
        check_data_pointers(q, k, v, v)
    message = str(info.value)
    start, end = v.data_ptr(), v.data_ptr() + v.numel() * v.element_size()
    assert f"out spans [{start:#x}, {end:#x}), v spans [{start:#x}, {end:#x})" in message


# --------------------------------------------------------------------------------------------
# Varlen
def test_varlen_inputs_describe_the_problem(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 0, 7], [4, 6, 0], heads=4, heads_kv=2)
    problem = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert (problem.batch, problem.seqlen_q, problem.seqlen_k) == (3, 7, 6)
    assert (problem.num_heads, problem.num_heads_kv, problem.head_dim) == (4, 2, 64)
    assert problem.varlen and problem.causal
    assert problem.softmax_scale == 1 / math.sqrt(64)


def test_varlen_max_seqlen_may_exceed_every_length(make_varlen) -> None:
    q, k, v, cu_q, cu_k, _, _ = make_varlen([3, 4], [4, 6])
    assert check_varlen(q, k, v, cu_q, cu_k, 4096, 4096).seqlen_q == 4096


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_varlen_wants_3d_tensors(make_varlen, which: str) -> None:
    args = list(make_varlen([3, 4], [4, 6]))
    index = "qkv".index(which)
    args[index] = args[index].unsqueeze(0)
    with pytest.raises(ValueError) as info:
        check_varlen(*args)
    message = str(info.value)
    assert message.startswith(f"{which} must be 3-D [total_tokens, heads, head_dim]")
    assert "4-D tensor" in message


def test_varlen_k_and_v_totals_must_agree(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 4], [4, 6])
    with pytest.raises(ValueError, match=r"^k and v must have the same total length \(dim 0\), "
                                         r"got k 10 and v 9"):
        check_varlen(q, k, v[:9], cu_q, cu_k, max_q, max_k)


def test_varlen_heads_and_head_dim_follow_the_dense_rules(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 4], [4, 6], heads=6, heads_kv=4)
    with pytest.raises(ValueError, match="^q has 6 heads, not a multiple of the 4 heads"):
        check_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    q, k, v, *rest = make_varlen([3, 4], [4, 6], head_dim=80)
    with pytest.raises(ValueError, match=r"^head_dim 80 \(last dim of q\) is not supported"):
        check_varlen(q, k, v, *rest)


@pytest.mark.parametrize(
    ("which", "cu", "error", "message"),
    [
        ("cu_seqlens_q", [0, 3, 7], TypeError, "cu_seqlens_q must be a torch.Tensor, got list"),
        ("cu_seqlens_k", torch.tensor([0, 4, 10]), TypeError,
         "cu_seqlens_k must have dtype torch.int32, got torch.int64"),
        ("cu_seqlens_q", torch.tensor([[0, 3, 7]], dtype=torch.int32), ValueError,
         "cu_seqlens_q must be 1-D with batch + 1 >= 1 offsets, got shape (1, 3)"),
        ("cu_seqlens_k", torch.zeros(0, dtype=torch.int32), ValueError,
         "cu_seqlens_k must be 1-D with batch + 1 >= 1 offsets, got shape (0,)"),
        ("cu_seqlens_q", torch.tensor([0, 9, 3, 9, 7, 9], dtype=torch.int32)[::2], ValueError,
         "cu_seqlens_q must be contiguous, got stride 2; call cu_seqlens_q.contiguous()"),
        ("cu_seqlens_k", torch.tensor([0, 10], dtype=torch.int32), ValueError,
         "cu_seqlens_q and cu_seqlens_k must hold one offset per sequence plus one, for the "
         "same batch; got 3 and 2 offsets"),
    ],
)
def test_varlen_bad_offsets_tensor_refused(
    make_varlen, which: str, cu: object, error: type[Exception], message: str
) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 4], [4, 6])
    offsets = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, which: cu}
    with pytest.raises(error) as info:
        check_varlen(q, k, v, offsets["cu_seqlens_q"], offsets["cu_seqlens_k"], max_q, max_k)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("max_q", "max_k", "error", "message"),
    [
        (4.0, 6, TypeError, "max_seqlen_q must be an int, got float 4.0"),
        (4, True, TypeError, "max_seqlen_k must be an int, got bool True"),
        (4, None, TypeError, "max_seqlen_k must be an int, got NoneType None"),
        (-1, 6, ValueError, "max_seqlen_q must be >= 0, got -1"),
    ],
)
def test_varlen_bad_max_seqlen_refused(
    make_varlen, max_q: object, max_k: object, error: type[Exception], message: str
) -> None:
    q, k, v, cu_q, cu_k, _, _ = make_varlen([3, 4], [4, 6])
    with pytest.raises(error) as info:
        check_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    assert str(info.value) == message


def test_varlen_offsets_must_be_on_the_tensors_device(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 4], [4, 6])
    with pytest.raises(ValueError) as info:
        check_varlen(q, k, v, cu_q, cu_k.to("meta"), max_q, max_k)
    assert str(info.value) == (
        "q, k, v, cu_seqlens_q and cu_seqlens_k must be on one device, got q on cpu, k on cpu, "
        "v on cpu, cu_seqlens_q on cpu, cu_seqlens_k on meta"
    )
    with pytest.raises(ValueError, match=r"^attnlab kernels run on CUDA tensors; q is on cpu$"):
        check_varlen_inputs(q, k, v, cu_q, cu_k, max_q, max_k)


def test_varlen_out_follows_the_out_rules(make_varlen) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 4], [4, 6])
    check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=torch.empty_like(q))
    shape_error = r"^out must have q's shape \(7, 2, 64\), got \(7, 2, 32\)"
    with pytest.raises(ValueError, match=shape_error):
        check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=torch.empty(7, 2, 32).half())
    with pytest.raises(ValueError, match="^out must not overlap the memory of k"):
        check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=k[:7])


def test_varlen_window_follows_the_window_rules(make_varlen) -> None:
    args = make_varlen([3, 4], [4, 6])
    assert check_varlen(*args, causal=True, window_size=(8, 8)).window == (8, 0)
    with pytest.raises(ValueError, match="^window_size must be"):
        check_varlen(*args, window_size=(-3, 0))


# --------------------------------------------------------------------------------------------
# Offset values (a host read, on request)
def offsets(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_valid_offsets_pass() -> None:
    check_cu_seqlens_values(offsets(0, 3, 3, 7), offsets(0, 0, 5, 6), 7, 6, 4, 5)
    check_cu_seqlens_values(offsets(0), offsets(0), 0, 0, 0, 0)


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "max_q", "max_k", "message"),
    [
        ((1, 3, 7), (0, 4, 6), 4, 4, "cu_seqlens_q must start at 0, got 1 (cu_seqlens_q = "
                                     "[1, 3, 7])"),
        ((0, 3, 7), (0, 4, 2, 6), 4, 4, "cu_seqlens_k must be non-decreasing, got [0, 4, 2, 6]"),
        ((0, 3, 6), (0, 4, 6), 4, 4, "cu_seqlens_q must end at the packed length 7, got 6 "
                                     "(cu_seqlens_q = [0, 3, 6])"),
        ((0, 3, 7), (0, 4, 6), 3, 4, "max_seqlen_q = 3 is below the longest sequence in "
                                     "cu_seqlens_q, 4 (cu_seqlens_q = [0, 3, 7])"),
    ],
)
def test_bad_offsets_refused(cu_q, cu_k, max_q: int, max_k: int, message: str) -> None:
    with pytest.raises(ValueError) as info:
        check_cu_seqlens_values(offsets(*cu_q), offsets(*cu_k), 7, 6, max_q, max_k)
    assert str(info.value) == message


# --------------------------------------------------------------------------------------------
def test_attention_checks_window_before_the_device(make_qkv) -> None:
    with pytest.raises(ValueError, match="^window_size must be"):
        attnlab.attention(*make_qkv(), window_size=(-2, 0))


def test_attention_varlen_refuses_cpu_tensors(make_varlen) -> None:
    with pytest.raises(ValueError, match="attnlab kernels run on CUDA tensors; q is on cpu"):
        attnlab.attention_varlen(*make_varlen([3, 4], [4, 6]))
