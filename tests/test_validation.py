"""check_inputs: every rule, checked on CPU tensors, with the message it gives."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab import validation
from attnlab.config import SUPPORTED_HEAD_DIMS
from attnlab.validation import Problem, check_inputs

#: Head dims no kernel serves, whatever SUPPORTED_HEAD_DIMS holds today.
UNSUPPORTED_HEAD_DIMS = [d for d in (16, 40, 80, 100, 264) if d not in SUPPORTED_HEAD_DIMS]


def check(q: object, k: object, v: object, **kwargs: object) -> Problem:
    """check_inputs as the reference calls it: CPU tensors pass the device rule."""
    return check_inputs(q, k, v, require_cuda=False, **kwargs)  # type: ignore[arg-type]


def test_valid_inputs_describe_the_problem(make_qkv) -> None:
    q, k, v = make_qkv(3, 5, 7, 4, 128, dtype=torch.bfloat16)
    problem = check(q, k, v)
    assert problem == Problem(
        batch=3,
        seqlen_q=5,
        seqlen_k=7,
        num_heads=4,
        num_heads_kv=4,
        head_dim=128,
        dtype=torch.bfloat16,
        softmax_scale=1 / math.sqrt(128),
        window=(-1, -1),
        varlen=False,
    )
    assert not problem.causal
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.batch = 1  # type: ignore[misc]


@pytest.mark.parametrize("scale", [0.5, 2, np.float32(0.125)])
def test_explicit_scale_is_kept(make_qkv, scale: float) -> None:
    problem = check(*make_qkv(), softmax_scale=scale)
    assert problem.softmax_scale == float(scale)
    assert type(problem.softmax_scale) is float


def test_empty_sizes_are_valid(make_qkv) -> None:
    assert check(*make_qkv(0, 4, 4)).batch == 0
    assert check(*make_qkv(1, 0, 4)).seqlen_q == 0
    assert check(*make_qkv(1, 4, 0)).seqlen_k == 0


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [[[1.0]], np.zeros((1, 4, 1, 64), np.float16), None])
def test_non_tensor_rejected(make_qkv, which: str, bad: object) -> None:
    args = dict(zip("qkv", make_qkv(), strict=True))
    args[which] = bad
    expected = rf"^{which} must be a torch.Tensor, got {type(bad).__name__}$"
    with pytest.raises(TypeError, match=expected):
        check(**args)


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("shape", [(4, 2, 64), (1, 1, 4, 2, 64), (64,)])
def test_wrong_rank_rejected(make_qkv, which: str, shape: tuple[int, ...]) -> None:
    args = dict(zip("qkv", make_qkv(1, 4, 4, 2), strict=True))
    args[which] = torch.randn(shape).half()
    with pytest.raises(ValueError) as info:
        check(**args)
    message = str(info.value)
    assert message.startswith(f"{which} must be 4-D")
    assert "BSHD" in message
    assert f"{len(shape)}-D tensor of shape {shape}" in message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8, torch.bool])
def test_unsupported_dtype_rejected(make_qkv, dtype: torch.dtype) -> None:
    q, k, v = make_qkv()
    with pytest.raises(TypeError) as info:
        check(q, k.to(dtype), v.to(dtype))
    message = str(info.value)
    assert message.startswith(f"k has dtype {dtype}")
    assert "supported: torch.float16, torch.bfloat16" in message


def test_allowed_dtypes_widens_the_rule(make_qkv) -> None:
    q, k, v = make_qkv(dtype=torch.float64)
    assert check(q, k, v, allowed_dtypes=(torch.float64,)).dtype == torch.float64
    with pytest.raises(TypeError, match="q has dtype torch.float64; supported: torch.float32$"):
        check(q, k, v, allowed_dtypes=(torch.float32,))


def test_mixed_dtypes_rejected(make_qkv) -> None:
    q, k, v = make_qkv()
    with pytest.raises(TypeError) as info:
        check(q, k, v.bfloat16())
    message = str(info.value)
    assert "must share one dtype" in message
    assert "q torch.float16, k torch.float16, v torch.bfloat16" in message


@pytest.mark.parametrize(
    ("which", "shape", "what", "given", "expected"),
    [
        ("k", (3, 8, 2, 64), "batch", 3, 2),
        ("v", (1, 8, 2, 64), "batch", 1, 2),
        ("k", (2, 8, 2, 128), "head_dim", 128, 64),
        ("v", (2, 8, 2, 128), "head_dim", 128, 64),
    ],
)
def test_mismatched_dims_rejected(
    make_qkv, which: str, shape: tuple[int, ...], what: str, given: int, expected: int
) -> None:
    args = dict(zip("qkv", make_qkv(2, 4, 8, 2, 64), strict=True))
    args[which] = torch.randn(shape).half()
    with pytest.raises(ValueError) as info:
        check(**args)
    message = str(info.value)
    assert message.startswith(f"{which} has {what} {given} but q has {expected}")
    assert f"{which} {shape}" in message


def test_mismatched_kv_seqlen_rejected(make_qkv) -> None:
    q, k, _ = make_qkv(2, 4, 8, 2, 64)
    v = torch.randn(2, 9, 2, 64).half()
    with pytest.raises(ValueError, match="same sequence length, got k 8 and v 9"):
        check(q, k, v)


def test_seqlen_q_may_differ_from_seqlen_k(make_qkv) -> None:
    problem = check(*make_qkv(1, 3, 130))
    assert (problem.seqlen_q, problem.seqlen_k) == (3, 130)


@pytest.mark.parametrize("head_dim", UNSUPPORTED_HEAD_DIMS)
def test_unsupported_head_dim_rejected(make_qkv, head_dim: int) -> None:
    with pytest.raises(ValueError) as info:
        check(*make_qkv(head_dim=head_dim))
    message = str(info.value)
    assert f"head_dim {head_dim}" in message
    assert f"supported: {SUPPORTED_HEAD_DIMS}" in message


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_supported_head_dim_accepted(make_qkv, head_dim: int) -> None:
    assert check(*make_qkv(head_dim=head_dim)).head_dim == head_dim


# --------------------------------------------------------------------------------------------
def test_strided_last_dim_rejected(make_qkv) -> None:
    q, k, v = make_qkv()
    wide = torch.randn(2, 16, 2, 128).half()
    with pytest.raises(ValueError) as info:
        check(q, k, wide[..., ::2])
    message = str(info.value)
    assert message.startswith("v must be contiguous in its last dim")
    assert "(4096, 256, 128, 2)" in message
    assert "v.contiguous()" in message


def test_misaligned_start_rejected(make_qkv) -> None:
    q, k, v = make_qkv()
    # One fp16 element of offset: 2 bytes past a 16-byte boundary.
    storage = torch.randn(q.numel() + 1).half()
    shifted = storage[1:].view(q.shape)
    assert shifted.is_contiguous()
    with pytest.raises(ValueError) as info:
        check(shifted, k, v)
    message = str(info.value)
    assert message.startswith("q must start on a 16-byte boundary")
    assert "storage offset 1" in message
    assert "q.contiguous()" in message


def test_row_stride_not_multiple_of_8_elements_rejected(make_qkv) -> None:
    q, k, v = make_qkv(head_dim=64)
    # Rows of 68 halves: every head starts 136 bytes after the last, not on 16 bytes.
    padded = torch.randn(2, 16, 2, 68).half()[..., :64]
    with pytest.raises(ValueError) as info:
        check(q, padded, v)
    message = str(info.value)
    assert message.startswith("k strides of dims 0..2 must be multiples of 8 elements")
    assert "(2176, 136, 68, 1)" in message
    assert "k.contiguous()" in message


def test_aligned_views_are_accepted(make_qkv) -> None:
    # A BHSD tensor seen as BSHD, and rows padded to 72 halves, are both legal to copy.
    q, k, v = make_qkv(2, 16, 16, 2, 64)
    bhsd = q.transpose(1, 2).contiguous().transpose(1, 2)
    padded = torch.zeros(2, 16, 2, 72).half()[..., :64]
    padded.copy_(k)
    assert not bhsd.is_contiguous() and not padded.is_contiguous()
    assert check(bhsd, padded, v).seqlen_q == 16


def test_alignment_in_bytes_follows_element_size(make_qkv) -> None:
    # For fp32 inputs (the reference's), 16 bytes is 4 elements: stride 68 is aligned.
    q, k, v = make_qkv(dtype=torch.float32)
    padded = torch.randn(2, 16, 2, 68)[..., :64]
    assert check(q, padded, v, allowed_dtypes=(torch.float32,)).head_dim == 64
    odd = torch.randn(2, 16, 2, 66)[..., :64]
    with pytest.raises(ValueError, match="multiples of 4 elements"):
        check(q, odd, v, allowed_dtypes=(torch.float32,))


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [True, "0.1", torch.tensor(0.1), 1j, [0.1]])
def test_non_real_scale_rejected(make_qkv, scale: object) -> None:
    with pytest.raises(TypeError) as info:
        check(*make_qkv(), softmax_scale=scale)
    message = str(info.value)
    assert message.startswith("softmax_scale must be a real number or None")
    assert type(scale).__name__ in message


@pytest.mark.parametrize("scale", [0, 0.0, -0.0, -0.25, math.nan, math.inf, -math.inf])
def test_non_positive_or_non_finite_scale_rejected(make_qkv, scale: float) -> None:
    with pytest.raises(ValueError) as info:
        check(*make_qkv(), softmax_scale=scale)
    assert str(info.value) == f"softmax_scale must be finite and positive, got {scale!r}"


# --------------------------------------------------------------------------------------------
def test_cpu_tensors_rejected_by_default(make_qkv) -> None:
    with pytest.raises(ValueError, match=r"^attnlab kernels run on CUDA tensors; q is on cpu$"):
        check_inputs(*make_qkv())


def test_any_non_cuda_device_rejected(make_qkv) -> None:
    q, k, v = (t.to("meta") for t in make_qkv())
    with pytest.raises(ValueError, match=r"^attnlab kernels run on CUDA tensors; q is on meta$"):
        check_inputs(q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["k", "v"])
def test_the_off_cuda_argument_is_named(make_qkv, which: str) -> None:
    args = dict(zip("qkv", make_qkv(device="cuda"), strict=True))
    args[which] = args[which].cpu()
    expected = rf"^attnlab kernels run on CUDA tensors; {which} is on cpu$"
    with pytest.raises(ValueError, match=expected):
        check_inputs(**args)


def test_device_is_checked_after_shapes(make_qkv) -> None:
    # A CPU caller with a shape bug hears about the shape bug.
    q, k, _ = make_qkv()
    with pytest.raises(ValueError, match="k and v must have the same sequence length"):
        check_inputs(q, k, torch.randn(2, 3, 2, 64).half())


def test_tensors_on_different_devices_rejected(make_qkv) -> None:
    q, k, v = make_qkv()
    with pytest.raises(ValueError) as info:
        check(q, k.to("meta"), v)
    assert str(info.value) == (
        "q, k and v must be on one device, got q on cpu, k on meta, v on cpu"
    )


# --------------------------------------------------------------------------------------------
def test_attention_refuses_cpu_tensors(make_qkv) -> None:
    with pytest.raises(ValueError, match="attnlab kernels run on CUDA tensors; q is on cpu"):
        attnlab.attention(*make_qkv())


def test_attention_refuses_bad_input_before_the_device(make_qkv) -> None:
    q, k, v = make_qkv(head_dim=80)
    with pytest.raises(ValueError, match=re.escape("head_dim 80 (last dim of q) is not supported")):
        attnlab.attention(q, k, v)


@pytest.mark.parametrize("config", ["k07", {"block_m": 64}, 7])
def test_attention_refuses_a_config_that_is_not_a_flash_config(make_qkv, config: object) -> None:
    # The config type is checked before the tensors, so this holds on a CPU-only machine too.
    with pytest.raises(TypeError) as info:
        attnlab.attention(*make_qkv(), config=config)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("config must be an attnlab.FlashConfig or None")
    assert f"got {type(config).__name__} {config!r}" in message


def test_batch_element_beyond_32bit_indexing_rejected() -> None:
    # Meta tensors have shapes and strides but no memory, so the check runs without 128 GiB.
    q = torch.empty((4, 2**28, 1, 64), device="meta", dtype=torch.float16)
    k = torch.empty((4, 16, 1, 64), device="meta", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"q: one batch element spans 17179869184 elements"
                                         r".*32-bit"):
        check(q, k, k)


def test_batch_offsets_are_64_bit() -> None:
    """A serving cache past 2**31 elements is accepted when each batch element stays under."""
    q = torch.empty((64, 16, 32, 128), device="meta", dtype=torch.bfloat16)
    k = torch.empty((64, 32768, 8, 128), device="meta", dtype=torch.bfloat16)
    assert k.numel() >= 2**31
    problem = check(q, k, k)
    assert (problem.batch, problem.seqlen_k) == (64, 32768)


def test_packed_sequence_beyond_32bit_indexing_rejected() -> None:
    q = torch.empty((2**20, 8, 128), device="meta", dtype=torch.bfloat16)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    kwargs = dict(require_cuda=False, check_pointers=False)
    # 2**21 rows of 1024 elements: the packed tensor passes 2**31, one sequence does not.
    k = torch.empty((2**21 + 1, 8, 128), device="meta", dtype=torch.bfloat16)
    validation.check_varlen_inputs(q, k, k, cu, cu, 2**19, 2**20, **kwargs)
    with pytest.raises(ValueError, match=r"k: one sequence spans \d+ elements"):
        validation.check_varlen_inputs(q, k, k, cu, cu, 2**19, 2**21 + 1, **kwargs)


def test_wants_grad_sees_any_tensor_that_requires_grad_and_only_in_grad_mode():
    plain, leaf = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert not validation.wants_grad(plain, None, 3, "x")
    assert validation.wants_grad(plain, None, leaf)
    assert validation.wants_grad(leaf)
    with torch.no_grad():
        assert not validation.wants_grad(plain, leaf)
