"""The custom ops on CPU: fake implementations, opcheck, config encoding, torch.compile tracing.

The real implementation needs the GPU runtime; here conftest.Recorder stands in for it (it
writes reference results), which is enough to check everything torch sees of the ops: schemas,
fake shapes/dtypes/strides, mutation declarations, and full-graph tracing of the public API.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attnlab
import attnlab.reference
from attnlab import ladder, ops
from attnlab.kernels.abi import BackwardSpec, PreprocessSpec

if TYPE_CHECKING:
    from conftest import Recorder

# (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, left, right, config ints, strs)
DENSE_ARGS = (None, None, None, None, 0.125, -1, -1, [], "")


def varlen_args(cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int) -> tuple:
    return (cu_q, cu_k, max_q, max_k, 0.125, -1, 0, *ops.encode_config(ladder.k01))


# --------------------------------------------------------------------------------------------
# Fake implementations: what torch.compile sees, on fake CUDA tensors (no GPU needed)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_dense_outputs(dtype: torch.dtype) -> None:
    with FakeTensorMode():
        # q as a strided BSHD view of BHSD memory: out is still dense BSHD.
        q = torch.empty(2, 8, 100, 64, device="cuda", dtype=dtype).transpose(1, 2)
        k = v = torch.empty(2, 37, 2, 64, device="cuda", dtype=dtype)
        out, lse = ops.attention_fwd(q, k, v, *DENSE_ARGS)
        assert (out.shape, out.dtype, out.device.type) == ((2, 100, 8, 64), dtype, "cuda")
        assert out.is_contiguous()
        assert (lse.shape, lse.dtype, lse.device.type) == ((2, 8, 100), torch.float32, "cuda")
        assert lse.is_contiguous()


def test_fake_varlen_outputs() -> None:
    with FakeTensorMode():
        q = torch.empty(300, 8, 128, device="cuda", dtype=torch.bfloat16)
        k = v = torch.empty(500, 1, 128, device="cuda", dtype=torch.bfloat16)
        cu = torch.empty(5, device="cuda", dtype=torch.int32)
        out, lse = ops.attention_fwd(q, k, v, *varlen_args(cu, cu, 120, 200))
        assert (out.shape, out.dtype) == ((300, 8, 128), torch.bfloat16) and out.is_contiguous()
        assert (lse.shape, lse.dtype) == ((8, 300), torch.float32) and lse.is_contiguous()


@pytest.mark.parametrize("varlen", [False, True])
def test_fake_out_variant_returns_only_lse(varlen: bool) -> None:
    with FakeTensorMode():
        if varlen:
            q = k = v = torch.empty(30, 4, 64, device="cuda", dtype=torch.float16)
            cu = torch.empty(3, device="cuda", dtype=torch.int32)
            args, lse_shape = varlen_args(cu, cu, 20, 20), (4, 30)
        else:
            q = k = v = torch.empty(2, 30, 4, 64, device="cuda", dtype=torch.float16)
            args, lse_shape = DENSE_ARGS, (2, 4, 30)
        out = torch.empty_like(q)
        lse = ops.attention_fwd_out(q, k, v, out, *args)
        assert isinstance(lse, torch.Tensor)
        assert (lse.shape, lse.dtype, lse.device.type) == (lse_shape, torch.float32, "cuda")


def test_op_schemas() -> None:
    # What attnlab.runtime.launch_forward receives mirrors these; a changed schema is a changed
    # contract.
    tail = ("Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt? max_seqlen_q, "
            "SymInt? max_seqlen_k, float softmax_scale, SymInt window_left, SymInt window_right, "
            "SymInt[] config_ints, str config_strs)")
    assert str(torch.ops.attnlab.attention_fwd.default._schema) == (
        f"attnlab::attention_fwd(Tensor q, Tensor k, Tensor v, {tail[:-1]}, "
        "bool deterministic=False) -> (Tensor, Tensor)"
    )
    assert str(torch.ops.attnlab.attention_fwd_out.default._schema) == (
        f"attnlab::attention_fwd_out(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, {tail} "
        "-> Tensor"
    )
    assert str(torch.ops.attnlab.attention_bwd.default._schema) == (
        "attnlab::attention_bwd(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, "
        "Tensor out, Tensor lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
        "SymInt? max_seqlen_q, SymInt? max_seqlen_k, float softmax_scale, SymInt window_left, "
        "SymInt window_right, bool deterministic) -> (Tensor, Tensor, Tensor)"
    )


def test_autograd_wiring_on_meta_tensors() -> None:
    """The forward op records its backward (the backward op, with the LSE's gradient), whose
    fake implementation gives q/k/v-shaped gradients."""
    def meta(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device="meta", requires_grad=True)

    q, k, v = meta(2, 128, 4, 64), meta(2, 96, 2, 64), meta(2, 96, 2, 64)
    out, lse = ops.attention_fwd(q, k, v, *DENSE_ARGS)
    grads = torch.autograd.grad(out.float().sum() + lse.sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    dout = torch.empty(2, 128, 4, 64, dtype=torch.bfloat16, device="meta")
    torch.library.opcheck(ops.attention_bwd, (dout, None, q.detach(), k.detach(), v.detach(),
                                              out.detach(), lse.detach(), *DENSE_ARGS[:7],
                                              False), test_utils=("test_schema",
                                                                  "test_faketensor"))


# --------------------------------------------------------------------------------------------
# opcheck: schema, fake vs real, aot dispatch; the real implementation runs on the Recorder
def test_opcheck_dense(make_qkv, recorder: Recorder) -> None:
    q, k, v = make_qkv(2, 9, 13, 4, 64, heads_kv=2)
    torch.library.opcheck(ops.attention_fwd, (q, k, v, *DENSE_ARGS))
    out = torch.empty_like(q)
    torch.library.opcheck(ops.attention_fwd_out, (q, k, v, out, *DENSE_ARGS))
    assert recorder.launches


def test_opcheck_varlen(make_varlen, recorder: Recorder) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 0, 5], [4, 2, 0], heads=2)
    args = varlen_args(cu_q, cu_k, max_q, max_k)
    torch.library.opcheck(ops.attention_fwd, (q, k, v, *args))
    torch.library.opcheck(ops.attention_fwd_out, (q, k, v, torch.empty_like(q), *args))
    assert recorder.launches


# --------------------------------------------------------------------------------------------
# Config encoding
def test_no_config_encodes_as_empty() -> None:
    assert ops.encode_config(None) == ([], "")
    assert ops.decode_config([], "") is None


@pytest.mark.parametrize("name", list(ladder.LADDER))
def test_ladder_configs_survive_encoding(name: str) -> None:
    config = ladder.LADDER[name]
    ints, strs = ops.encode_config(config)
    assert all(type(value) is int for value in ints)
    decoded = ops.decode_config(ints, strs)
    assert decoded == config
    # Types too: a bool knob must come back a bool, not 1.
    for field in dataclasses.fields(config):
        assert type(getattr(decoded, field.name)) is type(getattr(config, field.name))


def test_every_knob_survives_encoding() -> None:
    base = attnlab.FlashConfig()
    variants = [
        base.replace(block_m=128, block_n=32, num_warps=8),
        base.replace(swizzle="pad8"),
        base.replace(swizzle="none", async_copy=False, eager_kv_loads=False),
        base.replace(q_frags_per_load=2, k_frags_per_load=4, v_frags_per_load=0),
        base.replace(fused_softmax=False),
    ]
    for config in variants:
        assert ops.decode_config(*ops.encode_config(config)) == config


# --------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) traces the public API through the ops (CPU, aot_eager backend:
# the graph runs the same op implementations, so results must be bit-identical to eager).
@pytest.fixture
def fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def compiled(fn):
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_compile_dense_masked_gqa(make_qkv, recorder: Recorder, fresh_dynamo) -> None:
    q, k, v = make_qkv(2, 12, 20, 4, 64, heads_kv=2, seed=1)

    def fn(q, k, v):
        out, lse = attnlab.attention(q, k, v, causal=True, window_size=(5, -1), return_lse=True)
        return out * 2, lse

    want_out, want_lse = fn(q, k, v)
    got_out, got_lse = compiled(fn)(q, k, v)
    assert torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse)
    assert [launch["window"] for launch in recorder.launches] == [(5, 0), (5, 0)]


def test_compile_out_variant(make_qkv, recorder: Recorder, fresh_dynamo) -> None:
    q, k, v = make_qkv(2, 8, 8, 2, 64, seed=2)
    want = attnlab.attention(q, k, v)
    out = torch.full_like(q, torch.nan)

    def fn(q, k, v, out):
        return attnlab.attention(q, k, v, out=out, return_lse=True)

    result, lse = compiled(fn)(q, k, v, out)
    assert torch.equal(out, want)
    assert torch.equal(result, want)
    assert lse.shape == (2, 2, 8)


def test_compile_out_variant_into_a_strided_view(make_qkv, recorder, fresh_dynamo) -> None:
    # out as a BSHD view of BHSD memory (what sdpa hands over): written through the view.
    q, k, v = make_qkv(2, 8, 8, 2, 64, seed=3)
    want = attnlab.attention(q, k, v, causal=True)
    memory = torch.full((2, 2, 8, 64), torch.nan, dtype=q.dtype)

    def fn(q, k, v, memory):
        return attnlab.attention(q, k, v, causal=True, out=memory.transpose(1, 2)) * 1

    got = compiled(fn)(q, k, v, memory)
    assert torch.equal(got, want)
    assert torch.equal(memory.transpose(1, 2), want)


def test_compile_varlen(make_varlen, recorder: Recorder, fresh_dynamo) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([3, 0, 7], [4, 6, 0], heads=2, seed=3)

    def fn(q, k, v, cu_q, cu_k):
        return attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                        return_lse=True)

    want_out, want_lse = fn(q, k, v, cu_q, cu_k)
    got_out, got_lse = compiled(fn)(q, k, v, cu_q, cu_k)
    assert torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse)


def test_compile_sdpa(make_qkv, recorder: Recorder, fresh_dynamo) -> None:
    q, k, v = (t.transpose(1, 2) for t in make_qkv(1, 6, 10, 4, 64, heads_kv=2, seed=4))

    def fn(q, k, v):
        return attnlab.sdpa(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)

    assert torch.equal(compiled(fn)(q, k, v), fn(q, k, v))


def test_compile_follows_changing_configs_scales_and_windows(
    make_qkv, recorder: Recorder, fresh_dynamo
) -> None:
    # Recompiling for a second value makes torch.compile treat ints and floats as symbolic;
    # the config, scale and window must still reach the launch exactly.
    q, k, v = make_qkv(1, 8, 8, 2, 64, seed=5)
    fn = compiled(lambda q, k, v, config, scale, left: attnlab.attention(
        q, k, v, config=config, softmax_scale=scale, window_size=(left, 2)
    ))
    calls = [
        (ladder.k07, 0.5, 1),
        (ladder.k01, 0.25, 3),
        (ladder.k07.replace(block_m=128, num_warps=8), 0.75, 4),
    ]
    for config, scale, left in calls:
        fn(q, k, v, config, scale, left)
    launched = [(launch["config"], launch["softmax_scale"], launch["window"])
                for launch in recorder.launches]
    assert launched == [(config, scale, (left, 2)) for config, scale, left in calls]


def test_validation_errors_stop_the_compiled_call(make_qkv, recorder, fresh_dynamo) -> None:
    q, k, v = make_qkv()

    def fn(q, k, v):
        return attnlab.attention(q, k, v, window_size=(-2, 0))

    # Without fullgraph, dynamo falls back to eager at the raise: the ValueError itself.
    with pytest.raises(ValueError, match="^window_size must be"):
        torch.compile(fn, backend="aot_eager")(q, k, v)
    # With fullgraph, torch reports any exception raised while tracing as its own error, which
    # quotes ours.
    with pytest.raises(Exception, match="window_size must be"):
        compiled(fn)(q, k, v)
    assert recorder.launches == []


def test_compiled_returns_what_the_launch_wrote(make_qkv, recorder: Recorder,
                                                fresh_dynamo) -> None:
    """The compiled graph's output is the op's, i.e. what the one launch wrote, with the
    window and GQA of the call: nothing else computes it."""
    q, k, v = make_qkv(2, 10, 14, 4, 64, heads_kv=1, seed=6)
    got = compiled(lambda q, k, v: attnlab.attention(q, k, v, causal=True))(q, k, v)
    (launch,) = recorder.launches
    assert launch["window"] == (-1, 0) and launch["k"].shape[2] == 1
    assert torch.equal(got, launch["out"])


# --------------------------------------------------------------------------------------------
# Training on CPU: the Recorder's backward stand-ins implement the kernels' contract (P from
# L in log2, dS from D) in fp64, so the whole path above them runs for real: the eager
# autograd.Function, the backward's memoised launch and preprocess contract, the LSE's
# gradient, GQA, varlen, and the custom op's formula under torch.compile.
def _ref_grads(q, k, v, dout, dlse=None, **options):
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    out, lse = attnlab.reference.attention(*leaves, return_lse=True,
                                           compute_dtype=torch.float64, **options)
    outputs, grads = (out,), (dout.double(),)
    if dlse is not None:
        outputs, grads = (out, lse), (dout.double(), dlse.double())
    return torch.autograd.grad(outputs, leaves, grads)


def _close(ours, ref) -> None:
    for o, r in zip(ours, ref, strict=True):
        assert not o.isnan().any()
        err = (torch.linalg.vector_norm(o.double() - r) / torch.linalg.vector_norm(r)).item()
        assert err < 2e-2, err


def test_eager_training_path_matches_the_reference(make_qkv, recorder: Recorder) -> None:
    q, k, v = (t.requires_grad_(True) for t in make_qkv(2, 24, 40, 4, 64, heads_kv=2, seed=7))
    dout = torch.randn(q.shape, dtype=q.dtype)
    dlse = torch.randn(2, 4, 24)
    out, lse = attnlab.attention(q, k, v, causal=True, return_lse=True)
    ours = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    _close(ours, _ref_grads(q, k, v, dout, dlse, causal=True))
    # Output only: the LSE's gradient is absent, not zeros.
    ours = torch.autograd.grad(attnlab.attention(q, k, v, window_size=(5, 3)), (q, k, v), dout)
    _close(ours, _ref_grads(q, k, v, dout, window_size=(5, 3)))
    kinds = {type(spec).__name__ for spec in recorder.specs}
    assert {"ForwardSpec", "PreprocessSpec", "BackwardSpec"} <= kinds
    assert any(isinstance(s, PreprocessSpec) and s.with_dlse for s in recorder.specs)


def test_varlen_training_path_matches_per_sequence_reference(make_varlen, recorder) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k = make_varlen([5, 0, 9], [7, 3, 0], heads=2, seed=4)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    dout = torch.randn(q.shape, dtype=q.dtype)
    out = attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                   deterministic=True)
    ours = torch.autograd.grad(out, (q, k, v), dout)
    refs = [[], [], []]
    for b in range(3):
        sq = slice(int(cu_q[b]), int(cu_q[b + 1]))
        sk = slice(int(cu_k[b]), int(cu_k[b + 1]))
        part = [t.detach()[None, s] for t, s in ((q, sq), (k, sk), (v, sk))]
        if part[0].shape[1] and part[1].shape[1]:
            grads = _ref_grads(*part, dout[None, sq], causal=True)
        else:
            grads = [torch.zeros(t.shape, dtype=torch.float64) for t in part]
        for i in range(3):
            refs[i].append(grads[i][0])
    _close(ours, [torch.cat(r) for r in refs])
    assert any(isinstance(s, BackwardSpec) and s.deterministic and s.varlen
               for s in recorder.specs)


def test_compiled_training_path_equals_eager(make_qkv, recorder: Recorder,
                                             fresh_dynamo) -> None:
    q, k, v = (t.requires_grad_(True) for t in make_qkv(2, 16, 16, 2, 64, seed=9))
    dout = torch.randn(q.shape, dtype=q.dtype)

    def loss(q, k, v):
        return (attnlab.attention(q, k, v, causal=True).float() * dout.float()).sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    traced = torch.autograd.grad(compiled(loss)(q, k, v), (q, k, v))
    for a, b in zip(eager, traced, strict=True):
        assert torch.equal(a, b)


def test_out_is_not_differentiable(make_qkv, recorder: Recorder) -> None:
    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 8, 8, 2, 64))
    with pytest.raises(RuntimeError, match="out= is not differentiable"):
        attnlab.attention(q, k, v, out=torch.empty_like(q))
