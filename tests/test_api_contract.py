"""attnlab.attention's orchestration on CPU, with dispatch and runtime replaced by recorders.

The real dispatch/runtime need a GPU; here stand-ins record what the API hands them, so the
contract (which config, which scale, what out and lse look like, when no kernel runs) is tested
on any machine. The kernel itself is tested against the reference by the GPU tests.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import types

import pytest
import torch

import attnlab
from attnlab import api, reference
from attnlab.validation import check_inputs


class Recorder:
    """Stand-in for attnlab.dispatch and attnlab.runtime; the launch writes reference results."""

    def __init__(self, default: attnlab.FlashConfig) -> None:
        self.default = default
        self.problems: list[object] = []
        self.launches: list[dict[str, object]] = []

    def arch_of(self, device: torch.device) -> str:
        return "sm_86"

    def default_config(self, arch: str, problem: object) -> attnlab.FlashConfig:
        self.problems.append(problem)
        return self.default

    def launch_forward(self, q, k, v, out, lse, softmax_scale, config) -> None:
        self.launches.append(
            dict(q=q, out=out, lse=lse, softmax_scale=softmax_scale, config=config)
        )
        want_out, want_lse = reference.attention(
            q, k, v, softmax_scale=softmax_scale, return_lse=True
        )
        out.copy_(want_out)
        lse.copy_(want_lse)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder(default=attnlab.FlashConfig(block_m=128, block_n=32))
    dispatch = types.ModuleType("attnlab.dispatch")
    dispatch.arch_of = rec.arch_of
    dispatch.default_config = rec.default_config
    runtime = types.ModuleType("attnlab.runtime")
    runtime.launch_forward = rec.launch_forward
    for name, module in (("dispatch", dispatch), ("runtime", runtime)):
        monkeypatch.setitem(sys.modules, f"attnlab.{name}", module)
        monkeypatch.setattr(attnlab, name, module, raising=False)
    # CPU tensors stand in for CUDA ones; every other input rule still applies.
    monkeypatch.setattr(api, "check_inputs", functools.partial(check_inputs, require_cuda=False))
    return rec


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
    assert launch["config"] is config
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
def test_public_names() -> None:
    assert attnlab.__version__ == "0.1.0"
    assert attnlab.attention is api.attention
    assert attnlab.reference is reference
    assert issubclass(attnlab.ConfigError, ValueError)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        attnlab.no_such_name  # noqa: B018


def test_import_does_not_load_the_dsl() -> None:
    # Only cutlass itself: torch may import the cuda-python bindings on its own.
    code = (
        "import sys, attnlab; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass' "
        "or m in ('attnlab.dispatch', 'attnlab.runtime', 'attnlab.compile', 'attnlab.ladder')); "
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
