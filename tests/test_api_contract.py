"""attnlab.attention's orchestration on CPU, with dispatch and runtime replaced by recorders.

The real dispatch/runtime need a GPU; here stand-ins (conftest.Recorder) record what the API
hands them, so the contract (which config, which scale, what out and lse look like, when no
kernel runs) is tested on any machine. The kernel itself is tested against the reference by the
GPU tests.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types
from typing import TYPE_CHECKING

import pytest
import torch

import attnlab
from attnlab import api, reference

if TYPE_CHECKING:
    from conftest import Recorder


def test_default_config_and_scale_reach_the_launch(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 12, 20, 3, 128, seed=1)
    out, lse = attnlab.attention(q, k, v, return_lse=True)
    (problem,) = recorder.problems
    assert (problem.batch, problem.seqlen_q, problem.seqlen_k) == (2, 12, 20)
    (launch,) = recorder.launches
    assert launch["config"] is recorder.default
    assert launch["softmax_scale"] == 1 / math.sqrt(128)
    assert launch["out"] is out and launch["lse"] is lse
    assert out.shape == (2, 12, 3, 128) and out.dtype == torch.float16
    assert lse.shape == (2, 3, 12) and lse.dtype == torch.float32


def test_explicit_config_and_scale_are_used(make_qkv, recorder: Recorder) -> None:
    config = attnlab.FlashConfig(swizzle="pad8")
    out = attnlab.attention(*make_qkv(), softmax_scale=0.5, config=config)
    assert isinstance(out, torch.Tensor)
    assert recorder.problems == []
    (launch,) = recorder.launches
    # The config crosses the custom op as its fields: an equal config arrives, not the object.
    assert launch["config"] == config
    assert launch["softmax_scale"] == 0.5


def test_config_that_cannot_serve_the_problem_is_refused(make_qkv, recorder: Recorder) -> None:
    # 196608 bytes of shared memory at head_dim 128: more than the stand-in's sm_86 has.
    config = attnlab.FlashConfig(block_m=256, block_n=256)
    with pytest.raises(attnlab.ConfigError, match="sm_86 allows"):
        attnlab.attention(*make_qkv(head_dim=128), config=config)
    assert recorder.launches == []


def test_out_is_dense_bshd_for_a_strided_q(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 8, 8, 2, 64, dtype=torch.bfloat16)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
    out, lse = attnlab.attention(q_view, k, v, return_lse=True)
    assert out.is_contiguous() and out.shape == q.shape and out.dtype == torch.bfloat16
    want_out, want_lse = reference.attention(q, k, v, return_lse=True)
    torch.testing.assert_close(out.float(), want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse)


@pytest.mark.parametrize("shape", [(0, 4, 4, 2, 64), (2, 0, 4, 2, 64), (2, 4, 4, 0, 128)])
def test_empty_problem_launches_nothing(make_qkv, recorder, shape: tuple[int, ...]) -> None:
    batch, seqlen_q, _, heads, head_dim = shape
    out, lse = attnlab.attention(*make_qkv(*shape), return_lse=True)
    assert out.shape == (batch, seqlen_q, heads, head_dim) and out.dtype == torch.float16
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float32
    assert recorder.launches == [] and recorder.problems == []


def test_no_keys_gives_zeros_and_minus_inf_without_a_launch(make_qkv, recorder) -> None:
    q, k, v = make_qkv(2, 5, 0, 3, 64)
    out, lse = attnlab.attention(q, k, v, return_lse=True)
    want_out, want_lse = reference.attention(q, k, v, return_lse=True)
    assert torch.equal(out.float(), want_out) and out.dtype == torch.float16
    assert torch.equal(lse, want_lse)
    assert recorder.launches == []


# --------------------------------------------------------------------------------------------
# Masks, GQA and out=
@pytest.mark.parametrize(
    ("causal", "window_size", "window"),
    [
        (False, (-1, -1), (-1, -1)),
        (True, (-1, -1), (-1, 0)),
        (False, (64, 0), (64, 0)),
        (True, (5, 32), (5, 0)),  # causal sets the right side to 0 and keeps the left
        (True, [3, -1], (3, 0)),
        (False, (0, 0), (0, 0)),
        (False, (4, 7), (4, 7)),
    ],
)
def test_causal_and_window_reach_the_launch_as_one_window(
    make_qkv, recorder: Recorder, causal: bool, window_size, window: tuple[int, int]
) -> None:
    q, k, v = make_qkv(1, 20, 30, 2, 64, seed=2)
    out, lse = attnlab.attention(q, k, v, causal=causal, window_size=window_size, return_lse=True)
    (launch,) = recorder.launches
    assert launch["window"] == window and all(type(side) is int for side in launch["window"])
    (problem,) = recorder.problems
    assert problem.window == window
    assert problem.causal == (window == (-1, 0))
    want_out, want_lse = reference.attention(
        q, k, v, causal=causal, window_size=window_size, return_lse=True
    )
    torch.testing.assert_close(out.float(), want_out, atol=1e-3, rtol=1e-3)
    assert torch.equal(lse, want_lse)


def test_gqa_hands_the_launch_unexpanded_kv(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 9, 11, 8, 64, heads_kv=2, seed=3)
    out = attnlab.attention(q, k, v)
    (problem,) = recorder.problems
    assert (problem.num_heads, problem.num_heads_kv) == (8, 2)
    (launch,) = recorder.launches
    assert launch["k"] is k and launch["v"] is v
    assert out.shape == q.shape
    torch.testing.assert_close(out.float(), reference.attention(q, k, v), atol=1e-3, rtol=1e-3)


def test_out_is_written_and_returned(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 8, 12, 4, 64, heads_kv=2, seed=4)
    out = torch.full_like(q, torch.nan)
    result, lse = attnlab.attention(q, k, v, causal=True, out=out, return_lse=True)
    assert result is out
    (launch,) = recorder.launches
    assert launch["out"] is out and launch["lse"] is lse
    assert lse.shape == (2, 4, 8) and lse.dtype == torch.float32
    want_out, want_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(out.float(), want_out, atol=1e-3, rtol=1e-3)
    assert torch.equal(lse, want_lse)
    assert attnlab.attention(q, k, v, out=out) is out


def test_out_keeps_its_own_strides(make_qkv, recorder: Recorder) -> None:
    # A BSHD view of BHSD memory, as sdpa hands over: written in place, not replaced.
    q, k, v = make_qkv(2, 8, 8, 2, 64, seed=5)
    out = torch.full((2, 2, 8, 64), torch.nan, dtype=q.dtype).transpose(1, 2)
    strides = out.stride()
    assert attnlab.attention(q, k, v, out=out) is out
    assert out.stride() == strides
    torch.testing.assert_close(out.float(), reference.attention(q, k, v), atol=1e-3, rtol=1e-3)


def test_out_without_keys_is_zeroed(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 5, 0, 3, 64)
    out = torch.full_like(q, torch.nan)
    assert attnlab.attention(q, k, v, out=out) is out
    assert torch.equal(out, torch.zeros_like(out))
    assert recorder.launches == []


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_out_overlapping_an_input_is_refused_before_the_launch(
    make_qkv, recorder: Recorder, which: str
) -> None:
    args = dict(zip("qkv", make_qkv(), strict=True))
    with pytest.raises(ValueError, match=f"^out must not overlap the memory of {which}"):
        attnlab.attention(**args, out=args[which])
    assert recorder.launches == []


def test_out_interleaved_with_an_input_is_refused(recorder: Recorder) -> None:
    # out and q share no element, but out lies within q's address range: refused, as documented.
    packed = torch.randn(2, 16, 4, 2, 64).half()
    q, k, v, out = packed.unbind(dim=2)
    with pytest.raises(ValueError, match="^out must not overlap the memory of q"):
        attnlab.attention(q, k.clone(), v.clone(), out=out)
    assert recorder.launches == []


def test_misaligned_input_is_refused_before_the_launch(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv()
    shifted = torch.randn(q.numel() + 1).half()[1:].view(q.shape)
    with pytest.raises(ValueError, match="^q must start on a 16-byte boundary"):
        attnlab.attention(shifted, k, v)
    assert recorder.launches == []


# --------------------------------------------------------------------------------------------
# Varlen
def test_varlen_reaches_the_launch(make_varlen, recorder: Recorder) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen(
        [3, 0, 7, 5, 2], [4, 6, 0, 9, 1], heads=4, heads_kv=2, seed=6
    )
    out, lse = attnlab.attention_varlen(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=True, softmax_scale=0.2, return_lse=True
    )
    (problem,) = recorder.problems
    assert (problem.batch, problem.seqlen_q, problem.seqlen_k) == (5, 7, 9)
    assert (problem.num_heads, problem.num_heads_kv, problem.varlen) == (4, 2, True)
    (launch,) = recorder.launches
    assert launch["cu_seqlens_q"] is cu_q and launch["cu_seqlens_k"] is cu_k
    # The grid is sized by max_seqlen_q; key lengths come from cu_seqlens_k in the kernel.
    assert launch["max_seqlen_q"] == 7
    assert launch["window"] == (-1, 0) and launch["softmax_scale"] == 0.2
    assert launch["out"] is out and launch["lse"] is lse
    assert out.shape == (17, 4, 64) and out.dtype == torch.float16
    assert lse.shape == (4, 17) and lse.dtype == torch.float32
    want_out, want_lse = reference.attention_varlen(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=True, softmax_scale=0.2, return_lse=True
    )
    torch.testing.assert_close(out.float(), want_out, atol=1e-3, rtol=1e-3)
    assert torch.equal(lse, want_lse)


def test_varlen_dense_launch_gets_no_varlen_arguments(make_qkv, recorder: Recorder) -> None:
    attnlab.attention(*make_qkv())
    (launch,) = recorder.launches
    assert launch["cu_seqlens_q"] is launch["cu_seqlens_k"] is None
    assert launch["max_seqlen_q"] == launch["q"].shape[1]  # dense: Sq sizes the grid
    assert launch["window"] == (-1, -1)


def test_varlen_out_is_written_and_returned(make_varlen, recorder: Recorder) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([5, 3], [2, 8], seed=7)
    out = torch.full_like(q, torch.nan)
    assert attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, out=out) is out
    want = reference.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    torch.testing.assert_close(out.float(), want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize(
    ("seqlens_q", "seqlens_k"), [([3, 4], [0, 0]), ([], []), ([0, 0], [5, 1])],
    ids=["no-keys", "no-sequences", "no-queries"],
)
def test_varlen_without_work_launches_nothing(
    make_varlen, recorder: Recorder, seqlens_q: list[int], seqlens_k: list[int]
) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen(seqlens_q, seqlens_k, heads=3)
    out, lse = attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True)
    assert out.shape == q.shape and lse.shape == (3, q.shape[0])
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -torch.inf))
    assert recorder.launches == [] and recorder.problems == []


def test_varlen_offsets_are_read_only_on_request(
    make_varlen, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(api, "check_cu_seqlens_values", lambda *args: calls.append(args))
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([2, 3], [4, 1])
    attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k)
    assert calls == []
    attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, check_cu_seqlens=True)
    assert calls == [(cu_q, cu_k, 5, 5, 3, 4)]


def test_varlen_bad_offsets_are_refused_when_checked(make_varlen, recorder: Recorder) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([2, 3], [4, 1])
    with pytest.raises(ValueError, match="max_seqlen_k = 3 is below the longest sequence"):
        attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, 3, check_cu_seqlens=True)
    assert recorder.launches == []


def test_varlen_refuses_a_config_that_is_not_a_flash_config(make_varlen) -> None:
    with pytest.raises(TypeError, match="^config must be an attnlab.FlashConfig or None"):
        attnlab.attention_varlen(*make_varlen([2], [2]), config="k07")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
def test_public_names() -> None:
    assert attnlab.__version__ == "0.1.0"
    assert attnlab.attention is api.attention
    assert attnlab.attention_varlen is api.attention_varlen
    assert attnlab.sdpa is sys.modules["attnlab.sdpa"].sdpa
    assert attnlab.reference is reference
    assert issubclass(attnlab.ConfigError, ValueError)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        attnlab.no_such_name  # noqa: B018


def test_import_does_not_load_the_dsl() -> None:
    # Only cutlass itself: torch may import the cuda-python bindings on its own. The launch
    # path (runtime, kernel cache) loads without it: a kernel from the disk cache needs none.
    code = (
        "import sys, attnlab; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'tvm_ffi') "
        "or m in ('attnlab.compile', 'attnlab.jit') or m.startswith('attnlab.kernels.sm')); "
        "print(heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_compile_config_and_ladder_load_on_first_access(monkeypatch: pytest.MonkeyPatch) -> None:
    compile_module = types.ModuleType("attnlab.compile")
    compile_module.compile_config = lambda *args, **kwargs: "compiled"
    ladder = types.ModuleType("attnlab.ladder")
    monkeypatch.setitem(sys.modules, "attnlab.compile", compile_module)
    monkeypatch.setitem(sys.modules, "attnlab.ladder", ladder)
    if "ladder" in vars(attnlab):  # a real import earlier in the session sets the attribute
        monkeypatch.delattr(attnlab, "ladder")
    assert attnlab.compile_config is compile_module.compile_config
    assert attnlab.ladder is ladder


def test_the_lab_families_load_on_first_access() -> None:
    import importlib

    assert attnlab.conv is importlib.import_module("attnlab.conv")
    assert attnlab.gemm is importlib.import_module("attnlab.gemm")
    assert callable(attnlab.conv.conv2d) and callable(attnlab.gemm.matmul)


# --------------------------------------------------------------------------------------------
# The eager fast path: one validation per call signature
def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    check = api.check_inputs

    def counting(*args, **kwargs):
        calls.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(api, "check_inputs", counting)
    return calls


def test_a_call_signature_is_validated_once(make_qkv, recorder, monkeypatch) -> None:
    calls = _count_validations(monkeypatch)
    q, k, v = make_qkv(2, 12, 20, 3, 64, seed=8)
    for _ in range(3):
        attnlab.attention(q, k, v, causal=True)
    assert len(calls) == 1 and len(recorder.problems) == 1 and len(recorder.launches) == 3
    # Other tensors with the same metadata share the signature; new values of any option,
    # shape or layout do not.
    attnlab.attention(*make_qkv(2, 12, 20, 3, 64, seed=9), causal=True)
    assert len(calls) == 1
    attnlab.attention(q, k, v)
    attnlab.attention(q, k, v, causal=True, return_lse=True)
    attnlab.attention(q[:, :6], k, v, causal=True)
    attnlab.attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=True)
    assert len(calls) == 5


def test_an_unhashable_option_takes_the_slow_path_every_time(make_qkv, recorder,
                                                             monkeypatch) -> None:
    calls = _count_validations(monkeypatch)
    q, k, v = make_qkv(1, 8, 8, 2, 64, seed=10)
    for _ in range(2):
        out = attnlab.attention(q, k, v, window_size=[3, 0])  # a list: valid, not hashable
    assert len(calls) == 2 and recorder.launches[-1]["window"] == (3, 0)
    torch.testing.assert_close(out.float(), reference.attention(q, k, v, window_size=(3, 0)),
                               atol=1e-3, rtol=1e-3)


def test_a_refusal_carries_no_lookup_context(make_qkv, recorder) -> None:
    """The memo miss must not show in the error a user reads."""
    q, k, v = make_qkv()
    with pytest.raises(TypeError) as info:
        attnlab.attention(q.float(), k, v)
    assert info.value.__context__ is None
    with pytest.raises(TypeError, match="must be a torch.Tensor") as info:
        attnlab.attention(q.numpy(), k, v)
    assert info.value.__context__ is None


def test_a_misaligned_tensor_is_refused_on_a_known_signature(recorder) -> None:
    """Addresses are checked on every call: a view 8 bytes off has the metadata of an
    aligned tensor whose signature is already known."""
    storage = torch.randn(2 * 16 * 2 * 64 + 4, dtype=torch.float16)
    aligned = storage[:-4].view(2, 16, 2, 64)
    shifted = storage[4:].view(2, 16, 2, 64)
    attnlab.attention(aligned, aligned, aligned)
    with pytest.raises(ValueError, match="16-byte boundary"):
        attnlab.attention(shifted, aligned, aligned)
    assert len(recorder.launches) == 1


def test_the_ops_launch_is_remembered_per_signature(make_qkv, recorder) -> None:
    """``runtime.forward`` (the custom ops' body) chooses the config once per signature."""
    from attnlab import runtime

    q, k, v = make_qkv(1, 8, 8, 2, 64, seed=11)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 8)
    for _ in range(2):
        runtime.forward(q, k, v, out, lse, None, None, None, None, 0.125, (-1, -1), None)
    assert len(recorder.problems) == 1 and len(recorder.launches) == 2
    assert recorder.launches[0]["lse"] is lse
