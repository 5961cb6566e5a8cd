"""GPU correctness of the attention features against the fp64 reference.

Causal (Sq == Sk, Sq < Sk, Sq > Sk), sliding windows, GQA/MQA, ragged varlen batches with empty
sequences, every supported head dim, ``out=``, ``sdpa``, torch.compile and CUDA graphs.

The bound is that of tests/test_forward_gpu.py: our relative L2 error against the fp64
reference may be at most 1.5x torch SDPA's on the same inputs (k/v heads expanded for SDPA).
Which SDPA backend gives that yardstick depends on the mask:

* none, or causal with Sq == Sk (where top-left and bottom-right alignment agree): the flash
  backend, the official FlashAttention-2;
* any other mask (causal with Sq != Sk, windows): the efficient backend (math if it declines)
  with an explicit boolean mask from ``reference.window_mask``, since flash takes no mask and
  its ``is_causal`` is top-left aligned. Rows that see no key come out NaN or arbitrary there;
  they are set to 0, the reference's value, before measuring.

Kernel checks launch ``runtime.forward`` straight into NaN-filled ``out`` and ``lse``, so
an unwritten element fails; rows that see no key must be exactly 0 with lse exactly -inf.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnlab
from attnlab import ladder, policy, reference
from attnlab.config import SUPPORTED_HEAD_DIMS, ConfigError
from attnlab.validation import describe

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: Never let the bound collapse to zero when both errors are exact (e.g. one key returns V).
ERROR_FLOOR = 1e-6
#: LSE is computed in fp32 with approximate exp2/log2: an absolute bound in nats.
LSE_TOLERANCE = 2e-3


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref)).item()


def dense_inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, seed):
    """q ``[B, Sq, H, D]``, k and v ``[B, Sk, Hkv, D]``, standard normal on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)

    return (randn(batch, seqlen_q, heads, head_dim), randn(batch, seqlen_k, heads_kv, head_dim),
            randn(batch, seqlen_k, heads_kv, head_dim))


def varlen_inputs(seqlens_q, seqlens_k, heads, heads_kv, head_dim, dtype, seed):
    """Packed q/k/v and int32 offsets; max lengths exact."""
    q, k, v = (t[0] for t in dense_inputs(1, sum(seqlens_q), sum(seqlens_k), heads, heads_kv,
                                          head_dim, dtype, seed))

    def offsets(seqlens):
        return torch.tensor([0, *seqlens], device="cuda").cumsum(0).to(torch.int32)

    return q, k, v, offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q), max(seqlens_k)


def sdpa_output(q, k, v, scale: float, window: tuple[int, int]) -> torch.Tensor:
    """torch SDPA on BSHD q/k/v (k/v heads expanded), the yardstick described above."""
    group = q.shape[2] // k.shape[2]
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, dim=2),
                                               v.repeat_interleave(group, dim=2)))
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    mask = reference.window_mask(seqlen_q, seqlen_k, window, q.device)
    if mask is None or (window == (-1, 0) and seqlen_q == seqlen_k):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale,
                                                 is_causal=mask is not None)
    else:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
        sees_a_key = mask.any(dim=1).view(1, 1, seqlen_q, 1)
        out = out.masked_fill(~sees_a_key, 0.0)
    return out.transpose(1, 2)


def launch_poisoned(q, k, v, scale, window, config=None, varlen=None):
    """Launch the kernel straight into NaN-filled out and lse; the default config unless given.

    ``varlen`` is ``(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)`` for packed inputs.
    """
    from attnlab import runtime

    cu_q, cu_k, max_q, max_k = varlen if varlen is not None else (None, None, None, None)
    out = torch.full_like(q, math.nan)
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.full(lse_shape, math.nan, device=q.device)
    runtime.forward(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, window, config)
    torch.cuda.synchronize()
    return out, lse


def assert_rows(out, lse, ref_out, ref_lse) -> None:
    """No NaN; rows that see no key exactly 0 / -inf; lse close elsewhere.

    Works for both layouts: out ``[B, Sq, H, D]`` with lse ``[B, H, Sq]``, and packed out
    ``[total_q, H, D]`` with lse ``[H, total_q]``.
    """
    assert not out.isnan().any(), "output has NaN (unwritten or poisoned elements)"
    assert not lse.isnan().any(), "lse has NaN (unwritten or poisoned elements)"
    no_keys = ref_lse == -math.inf
    assert torch.equal(lse == -math.inf, no_keys), "lse must be -inf exactly where no key is seen"
    # Move out's head dim in front of its row dim, so that its rows line up with lse's.
    rows = out.movedim(-2, -3)
    assert (rows[no_keys] == 0).all(), "rows that see no key must be 0"
    lse_err = (lse.double() - ref_lse)[~no_keys].abs().max().item() if (~no_keys).any() else 0.0
    assert lse_err < LSE_TOLERANCE, f"max |lse - ref| = {lse_err:.3e}"


def check_dense(q, k, v, window, config=None, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = launch_poisoned(q, k, v, scale, window, config)
    ref_out, ref_lse = reference.attention(q, k, v, softmax_scale=scale, window_size=window,
                                           return_lse=True, compute_dtype=torch.float64)
    assert_rows(out, lse, ref_out, ref_lse)
    ours = rel_l2(out, ref_out)
    theirs = rel_l2(sdpa_output(q, k, v, scale, window), ref_out)
    assert ours <= max(1.5 * theirs, ERROR_FLOOR), (
        f"window {window}: rel L2 error {ours:.3e} > 1.5 x SDPA {theirs:.3e}"
    )


# --------------------------------------------------------------------------------------------
# (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
CAUSAL_SHAPES = [
    (3, 1, 1, 4, 4, 64),
    (2, 1000, 1000, 8, 8, 128),  # Sq == Sk
    (2, 127, 1000, 4, 4, 64),  # Sq < Sk: every row sees keys
    (2, 1000, 127, 4, 4, 64),  # Sq > Sk: the first 873 rows see none
    (1, 4097, 4097, 2, 2, 128),
    (4, 77, 300, 8, 2, 128),  # GQA and Sq < Sk
]


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", CAUSAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_causal(shape, dtype):
    check_dense(*dense_inputs(*shape, dtype, seed=sum(shape)), window=(-1, 0))


@pytest.mark.parametrize("name", list(ladder.NAMED))
def test_causal_gqa_on_every_ladder_config(name):
    """Masking meets the tiling: every block_m/block_n of the ladder and the lab variants,
    diagonal blocks and all. A step whose clusters share one K/V walk between row blocks
    refuses the mask and runs the same shape unmasked."""
    from attnlab.dispatch import arch_of

    if name not in ladder.named_for(arch_of(torch.device("cuda")), 128):
        pytest.skip(f"{name} does not run on this GPU")
    q, k, v = dense_inputs(2, 333, 517, 8, 2, 128, torch.bfloat16, seed=1)
    config = ladder.NAMED[name]
    if config.cluster_m > 1:
        with pytest.raises(ConfigError, match="cluster_m"):
            launch_poisoned(q, k, v, 0.1, (-1, 0), config)
        check_dense(q, k, v, window=(-1, -1), config=config)
        return
    check_dense(q, k, v, window=(-1, 0), config=config)


@pytest.mark.parametrize("window", [(64, 0), (128, 128), (0, 0), (-1, 32), (200, -1)])
@pytest.mark.parametrize(
    "shape", [(2, 1000, 1000, 4, 4, 128), (2, 300, 1000, 4, 4, 64), (2, 1000, 300, 4, 4, 64)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_sliding_window(shape, window):
    check_dense(*dense_inputs(*shape, torch.bfloat16, seed=sum(shape)), window=window)


@pytest.mark.parametrize("window", [(512, 512), (1024, 0)])
@pytest.mark.parametrize("head_dim", [96, 128, 256])
def test_long_sliding_band(head_dim, window):
    """A band at most half as wide as 8k queries runs the default its head dim looks up for
    bands (``policy.masked_lookup_seqlen``: hd128 the persistent walk of 4k, hd96 and hd256
    the short masked tile), every tile's walk starting and ending at a band edge."""
    assert policy.masked_lookup_seqlen(head_dim, 8192, window) < 8192
    check_dense(*dense_inputs(1, 8192, 8192, 2, 2, head_dim, torch.bfloat16, seed=head_dim),
                window=window)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("heads_kv", [4, 1], ids=["gqa-4to1", "mqa"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)], ids=["full", "causal"])
def test_gqa_and_mqa(heads_kv, window, dtype):
    q, k, v = dense_inputs(2, 1000, 1000, 16, heads_kv, 128, dtype, seed=heads_kv)
    check_dense(q, k, v, window=window)


def test_gqa_reads_kv_in_place():
    """k/v as strided views of one packed KV buffer: nothing is copied or expanded."""
    kv = torch.randn(2, 700, 2, 2, 64, device="cuda", dtype=torch.float16)
    k, v = kv.unbind(dim=2)
    q = torch.randn(2, 500, 8, 64, device="cuda", dtype=torch.float16)
    check_dense(q, k, v, window=(-1, 0), scale=0.2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_supported_head_dim(head_dim, dtype):
    """Each head dim's default, plain and causal, in each dtype (the Hopper defaults differ
    per head dim, mask and dtype: policy.SM90_DEFAULT_KNOBS)."""
    q, k, v = dense_inputs(2, 513, 700, 4, 2, head_dim, DTYPES[dtype], seed=head_dim)
    check_dense(q, k, v, window=(-1, -1))
    check_dense(q, k, v, window=(-1, 0))


# --------------------------------------------------------------------------------------------
# Varlen: ragged, with empty q and empty k sequences
SEQLENS_Q = [0, 1, 17, 300, 0, 1000, 64, 5]
SEQLENS_K = [5, 0, 17, 1000, 0, 1000, 33, 0]


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0), (16, 16)])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_varlen_ragged(window, dtype):
    check_varlen(window, dtype)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 192, 256])
@pytest.mark.parametrize("seqlen", [None, 1024], ids=["long", "short"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_varlen_wgmma(head_dim, seqlen, window):
    """Packed sequences on the wgmma kernel: TMA boxes that start mid-tensor and read into the
    next sequence (its keys masked, its rows never stored), empty sequences, three consumer
    warpgroups (hd32/64/96 unmasked); the default of each bucket of the longest sequence
    (``policy.packed_walk``: tiles drawn from the counter, the short masked ones with one Q
    buffer or, at hd256, one CTA per tile)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, window != (-1, -1), varlen=True,
                                seqlen=seqlen)
    assert config.wgmma
    check_varlen(window, torch.bfloat16, config, head_dim)


def check_varlen(window, dtype, config=None, head_dim=128):
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_inputs(SEQLENS_Q, SEQLENS_K, 8, 2, head_dim,
                                                      dtype, seed=11)
    scale = 1 / math.sqrt(head_dim)
    out, lse = launch_poisoned(q, k, v, scale, window, config,
                               varlen=(cu_q, cu_k, max_q, max_k))
    ref_out, ref_lse = reference.attention_varlen(
        q, k, v, cu_q, cu_k, max_q, max_k, window_size=window, return_lse=True,
        compute_dtype=torch.float64,
    )
    assert_rows(out, lse, ref_out, ref_lse)
    # SDPA per sequence, as dense batches of one; sequences without queries or keys stay 0.
    yardstick = torch.zeros_like(q)
    for b in range(len(SEQLENS_Q)):
        rows = slice(cu_q[b].item(), cu_q[b + 1].item())
        keys = slice(cu_k[b].item(), cu_k[b + 1].item())
        if SEQLENS_Q[b] and SEQLENS_K[b]:
            yardstick[rows] = sdpa_output(q[None, rows], k[None, keys], v[None, keys], scale,
                                          window)[0]
    ours, theirs = rel_l2(out, ref_out), rel_l2(yardstick, ref_out)
    assert ours <= max(1.5 * theirs, ERROR_FLOOR), f"rel L2 {ours:.3e} > 1.5 x SDPA {theirs:.3e}"


def test_varlen_api_matches_reference():
    q, k, v, cu_q, cu_k, max_q, max_k = varlen_inputs(SEQLENS_Q, SEQLENS_K, 4, 4, 64,
                                                      torch.float16, seed=2)
    out, lse = attnlab.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                        return_lse=True, check_cu_seqlens=True)
    ref_out, ref_lse = reference.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k,
                                                  causal=True, return_lse=True,
                                                  compute_dtype=torch.float64)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    assert rel_l2(out, ref_out) < 1e-2
    assert_rows(out, lse, ref_out, ref_lse)


# --------------------------------------------------------------------------------------------
# The public API: causal/window mapping, out=, sdpa
def test_attention_api_causal_and_window():
    q, k, v = dense_inputs(2, 257, 300, 8, 2, 128, torch.bfloat16, seed=3)
    for kwargs, window in (({"causal": True}, (-1, 0)),
                           ({"causal": True, "window_size": (32, 32)}, (32, 0)),
                           ({"window_size": (16, 8)}, (16, 8))):
        out, lse = attnlab.attention(q, k, v, return_lse=True, **kwargs)
        ref_out, ref_lse = reference.attention(q, k, v, window_size=window, return_lse=True,
                                               compute_dtype=torch.float64)
        assert rel_l2(out, ref_out) < 1e-2, kwargs
        assert_rows(out, lse, ref_out, ref_lse)


@pytest.mark.parametrize("layout", ["bshd", "bhsd-view"])
def test_out_is_written_in_place_and_returned(layout):
    q, k, v = dense_inputs(2, 300, 400, 8, 8, 64, torch.float16, seed=4)
    if layout == "bshd":
        out = torch.full_like(q, math.nan)
    else:
        out = torch.full((2, 8, 300, 64), math.nan, device="cuda", dtype=q.dtype).transpose(1, 2)
    strides, ptr = out.stride(), out.data_ptr()
    result = attnlab.attention(q, k, v, causal=True, out=out)
    assert result is out and out.stride() == strides and out.data_ptr() == ptr
    ref = reference.attention(q, k, v, causal=True, compute_dtype=torch.float64)
    assert not out.isnan().any()
    assert rel_l2(out, ref) < 1e-2


@pytest.mark.parametrize(("seqlen_q", "seqlen_k"), [(512, 512), (200, 512), (512, 200)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_matches_torch(seqlen_q, seqlen_k, is_causal):
    """Against torch's own SDPA in fp64 (math backend): its semantics, top-left causal included."""
    q, k, v = (t.transpose(1, 2) for t in dense_inputs(2, seqlen_q, seqlen_k, 8, 2, 64,
                                                       torch.bfloat16, seed=seqlen_q))
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                          is_causal=is_causal, enable_gqa=True)
    got = attnlab.sdpa(q, k, v, is_causal=is_causal, enable_gqa=True)
    torch_bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    ours, theirs = rel_l2(got, want), rel_l2(torch_bf16, want)
    assert ours <= max(1.5 * theirs, ERROR_FLOOR), f"{ours:.3e} > 1.5 x torch {theirs:.3e}"


# --------------------------------------------------------------------------------------------
# torch.compile and CUDA graphs: the same kernel, so results must be bit-identical to eager
def test_torch_compile_fullgraph_equals_eager():
    torch.compiler.reset()
    q, k, v = dense_inputs(2, 300, 400, 8, 2, 128, torch.bfloat16, seed=5)
    packed = varlen_inputs(SEQLENS_Q, SEQLENS_K, 8, 2, 128, torch.bfloat16, seed=6)
    out_buffer = torch.empty_like(q)

    def fn(q, k, v, out_buffer, packed):
        dense, lse = attnlab.attention(q, k, v, causal=True, return_lse=True)
        windowed = attnlab.attention(q, k, v, window_size=(64, 0), out=out_buffer)
        varlen = attnlab.attention_varlen(*packed, window_size=(32, 32))
        bhsd = attnlab.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            is_causal=True, enable_gqa=True)
        return dense, lse, windowed.clone(), varlen, bhsd

    want = fn(q, k, v, torch.empty_like(q), packed)
    got = torch.compile(fn, fullgraph=True)(q, k, v, out_buffer, packed)
    for name, a, b in zip(("dense", "lse", "out=", "varlen", "sdpa"), got, want, strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(out_buffer, want[2])


def test_cuda_graph_capture_and_replay():
    q, k, v = dense_inputs(2, 300, 400, 8, 2, 128, torch.bfloat16, seed=7)
    packed = varlen_inputs(SEQLENS_Q, SEQLENS_K, 8, 2, 128, torch.bfloat16, seed=8)
    vq, vk, vv, cu_q, cu_k = packed[:5]
    # max lengths that any re-split of the same totals respects, so new offsets may be replayed.
    max_q, max_k = vq.shape[0], vk.shape[0]

    def step():
        dense = attnlab.attention(q, k, v, causal=True, return_lse=True)
        varlen = attnlab.attention_varlen(vq, vk, vv, cu_q, cu_k, max_q, max_k, causal=True,
                                          return_lse=True)
        return (*dense, *varlen)

    # Warm up outside capture (compiles the kernels, reads the tuning cache), on a side stream
    # as torch's CUDA-graph recipe asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    # New values in the static inputs, offsets included (same totals, other lengths).
    fresh_q, fresh_k, fresh_v = dense_inputs(2, 300, 400, 8, 2, 128, torch.bfloat16, seed=9)
    new_seqlens_q = [5, 0, 300, 17, 64, 1000, 0, 1]
    new_seqlens_k = [17, 5, 0, 1000, 33, 1000, 0, 0]
    fresh = varlen_inputs(new_seqlens_q, new_seqlens_k, 8, 2, 128, torch.bfloat16, seed=10)
    for static, new in zip((q, k, v, vq, vk, vv, cu_q, cu_k),
                           (fresh_q, fresh_k, fresh_v, *fresh[:5]), strict=True):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "lse", "varlen out", "varlen lse"), captured, step(),
                          strict=True):
        assert torch.equal(a, b), f"{name}: replay differs from eager on the new inputs"
    # And the replay computed the new problem, not the captured one.
    ref = reference.attention_varlen(vq, vk, vv, cu_q, cu_k, max_q, max_k, causal=True,
                                     compute_dtype=torch.float64)
    assert rel_l2(captured[2], ref) < 1e-2


# --------------------------------------------------------------------------------------------
# The knobs of kernels 10-16 and the lab's K/V ring and persistent grid (ladder.NAMED)
KNOBS = ("k10", "k13", "k15", "k16", "pipeline", "persistent")


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
@pytest.mark.parametrize("name", KNOBS)
def test_knob_configs_dense(name, window):
    """GQA, Sq != Sk, tails in both sequences; causal and sliding windows."""
    q, k, v = dense_inputs(2, 333, 517, 8, 2, 128, torch.bfloat16, seed=3)
    check_dense(q, k, v, window=window, config=ladder.NAMED[name])


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)], ids=["full", "causal"])
@pytest.mark.parametrize("name", ["pipeline", "persistent", "k16"])
def test_knob_configs_varlen(name, window):
    check_varlen(window, torch.float16, ladder.NAMED[name])


@pytest.mark.medium_memory
@pytest.mark.parametrize("loads", [{}, ladder.TMA_RING, {"tma_kv_loads": True}],
                         ids=["cp_async", "tma_ring", "tma_one_stage"])
def test_persistent_ctas_loop_over_more_tiles_than_there_are_ctas(loads):
    """512 output tiles on a grid of SMs x resident CTAs (fewer): each CTA loops over several
    tiles, and every tile is written (the outputs are poisoned). With TMA loads the barriers'
    phases run on across a CTA's tiles, which under a causal mask hold odd and even numbers
    of K/V blocks; and again with tails in both sequences."""
    from attnlab import device, runtime

    if loads and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    config = ladder.NAMED["persistent"].replace(**loads)
    q, k, v = dense_inputs(2, 1999, 2011, 8, 2, 128, torch.bfloat16, seed=6)
    check_dense(q, k, v, window=(-1, 0), config=config)
    q, k, v = dense_inputs(2, 2048, 2048, 16, 16, 128, torch.bfloat16, seed=5)
    problem = describe(q, k, 128**-0.5, (-1, -1))
    launch = runtime.launch_for(q, k, v, None, problem, config, with_lse=True)
    tiles = 2048 // config.block_m * 2 * 16
    sms = device.info(q.device).multiprocessors
    assert launch.num_ctas % sms == 0 and sms <= launch.num_ctas < tiles
    check_dense(q, k, v, window=(-1, -1), config=config)
    check_dense(q, k, v, window=(-1, 0), config=config)


@pytest.mark.medium_memory
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_sm80_path_causal_hd128_forward_on_its_persistent_grid(dtype):
    """The mma.sync default on Hopper at causal hd128 (the sm80 path's forward: TMA ring,
    persistent grid): more tiles than CTAs, tails in both sequences, GQA."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90 family's mma.sync default")
    config = policy.mma_sync_default_for("sm_90a", 128, True, str(dtype).removeprefix("torch."))
    assert config.persistent and config.tma_kv_loads
    q, k, v = dense_inputs(2, 1999, 2011, 16, 4, 128, dtype, seed=29)
    check_dense(q, k, v, window=(-1, 0), config=config)
    q, k, v = dense_inputs(1, 100, 333, 2, 1, 128, dtype, seed=30)
    check_dense(q, k, v, window=(-1, 0), config=config)


@pytest.mark.medium_memory
@pytest.mark.parametrize("head_dim,knobs", [(64, {}), (128, {}), (128, {"kv_stages": 2}),
                                            (256, {}), (64, {"q_stages": 2}),
                                            (128, {"kv_stages": 2, "q_stages": 2})],
                         ids=["hd64", "hd128-o-in-q", "hd128-o-apart", "hd256", "hd64-q2",
                              "hd128-q2"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_wgmma_persistent(head_dim, knobs, window):
    """The wgmma kernel on a persistent grid: more tiles than CTAs (each CTA walks several, Q's
    barriers and the K/V ring running on across them, the masked tiles of different lengths),
    O staged in Q's tile or its own (``stages_o_apart``), Q in one buffer or two
    (``q_stages``: the next tile's Q lands while this one's is read), tails in both
    sequences, GQA, fewer tiles than CTAs, and packed sequences with empty ones."""
    from attnlab import runtime

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        persistent=True, **knobs)
    q, k, v = dense_inputs(2, 1999, 2011, 16, 4, head_dim, torch.bfloat16, seed=head_dim)
    problem = describe(q, k, head_dim**-0.5, window)
    launch = runtime.launch_for(q, k, v, None, problem, config, with_lse=True)
    assert launch.num_ctas < 2 * -(-1999 // config.block_m) * 16
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 100, 333, 2, 1, head_dim, torch.bfloat16, seed=head_dim + 1)
    check_dense(q, k, v, window=window, config=config)
    check_varlen(window, torch.bfloat16, config, head_dim)


@pytest.mark.medium_memory
@pytest.mark.parametrize("head_dim,knobs", [(128, {}), (64, {}),
                                            (256, {"lpt": True, "l2_section_mb": 1024}),
                                            (64, {"q_stages": 2})],
                         ids=["hd128", "hd64", "hd256-global-lpt", "hd64-q2"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_wgmma_dynamic_tiles(head_dim, knobs, window):
    """``dynamic_tiles``: persistent CTAs draw their tiles from a counter. Several launches
    back to back on one stream are each right (the last CTA of each resets the counter, and
    leaves it zero), dense with tails and GQA, fewer tiles than CTAs, packed sequences with
    empty ones (tiles without rows are drawn and skipped), and on a second stream (its own
    counter); with two Q buffers the producer runs a tile further ahead of the tiles' slots."""
    from attnlab import counters

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        persistent=True, dynamic_tiles=True, **knobs)
    q, k, v = dense_inputs(2, 1999, 2011, 16, 4, head_dim, torch.bfloat16, seed=head_dim)
    for _ in range(3):
        check_dense(q, k, v, window=window, config=config)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 100, 333, 2, 1, head_dim, torch.bfloat16, seed=head_dim + 1)
    check_dense(q, k, v, window=window, config=config)
    check_varlen(window, torch.bfloat16, config, head_dim)
    torch.cuda.synchronize()
    assert len(counters._counters) >= 2
    assert all(int(c.abs().sum()) == 0 for c in counters._counters.values())


@pytest.mark.medium_memory
@pytest.mark.parametrize("kernel", ["mma_sync", "mma_sync_persistent", "wgmma"])
@pytest.mark.parametrize("window", [(-1, 0), (64, 0)], ids=["causal", "win"])
def test_longest_first_over_l2_sections(kernel, window):
    """``lpt``: a one-dimensional grid walked longest first over sections of heads (GQA
    groups whole, the narrower section first); dense with tails, and packed sequences (whose
    sections are sized from the average sequence)."""
    if kernel == "wgmma":
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("wgmma needs sm_90a")
        config = policy.default_for("sm_90a", 128, True)
    else:
        config = ladder.NAMED["persistent" if kernel.endswith("persistent") else "k16"]
    config = config.replace(lpt=True)
    # 15 query heads over 5 K/V heads of 30k keys (15 MB each): a section is two groups of
    # three query heads (40 MiB hold two K/V heads), the one group left over first.
    q, k, v = dense_inputs(1, 300, 30_000, 15, 5, 128, torch.bfloat16, seed=8)
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(3, 333, 517, 8, 2, 128, torch.bfloat16, seed=9)
    check_dense(q, k, v, window=window, config=config)
    check_varlen(window, torch.bfloat16, config)


@pytest.mark.parametrize("head_dim,tile", [(64, 16), (128, 16), (128, 64), (256, 32)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)], ids=["full", "causal"])
def test_d_head_tile(head_dim, tile, window):
    """Kernel 15's column chunks of O += P V, at several chunk widths and head dims."""
    config = policy.mma_sync_default_for("sm_90a", head_dim).replace(d_head_tile=tile)
    q, k, v = dense_inputs(2, 200, 333, 4, 2, head_dim, torch.float16, seed=head_dim + tile)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("chains", [2, 4, 16])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_row_sum_chains(chains, window):
    """Row sums added in several chains: dense (tails in both sequences) and packed."""
    q, k, v = dense_inputs(2, 333, 517, 8, 2, 128, torch.bfloat16, seed=chains)
    for varlen in (False, True):
        config = policy.mma_sync_default_for("sm_90a", 128, varlen=varlen).replace(
            row_sum_chains=chains)
        if varlen:
            check_varlen(window, torch.float16, config)
        else:
            check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("knobs", [{}, {"kv_stages": 2}, {"reverse_kv": True}],
                         ids=["eager", "ring", "reverse"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_tma_kv_loads(head_dim, knobs, window):
    """K/V through the TMA unit: tails in both sequences (zero-filled by TMA), GQA, each mask,
    each K/V schedule, and a head dim of each swizzle width (96: 64-byte rows)."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90")
    config = policy.mma_sync_default_for("sm_90a", head_dim).replace(tma_kv_loads=True, **knobs)
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, torch.bfloat16, seed=head_dim)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("changes", [{}, {"tma_kv_loads": False, "kv_stages": 1},
                                     {"fused_softmax": False, "peel_first_kv_block": True},
                                     {"reverse_kv": True, "d_head_tile": 32},
                                     {"row_sum_chains": 4, "ptxas_opt_level": 3}],
                         ids=["ring", "cp_async", "unfused_peeled", "reverse_dtile", "chains_o3"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0)], ids=["full", "causal", "win"])
def test_interleave_softmax(head_dim, changes, window):
    """The softmax sliced into the P V MMAs, with the knobs that meet it: the first block
    (peeled or not), the unfused form, walks, column chunks of O; rows that see no key."""
    if torch.cuda.get_device_capability()[0] < 9 and changes.get("tma_kv_loads", True):
        pytest.skip("the TMA ring needs sm_90")
    config = ladder.HOPPER_STEPS["interleave_softmax"].replace(**changes)
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, torch.bfloat16, seed=head_dim + 7)
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 300, 130, 4, 4, head_dim, torch.float16, seed=head_dim + 8)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("knobs", [{}, {"block_n": 64, "kv_stages": 4},
                                   {"block_n": 192, "kv_stages": 2, "q_stages": 1},
                                   {"block_m": 64, "num_warps": 4, "pingpong": False},
                                   {"fused_softmax": False},
                                   {"intra_wg_overlap": True, "block_n": 128},
                                   {"intra_wg_overlap": True, "kv_stages": 1},
                                   {"pingpong": True},
                                   {"intra_wg_overlap": True, "pingpong": True,
                                    "block_n": 128},
                                   {"block_m": 192, "num_warps": 12, "block_n": 64}],
                         ids=["default", "bn64x4", "bn192x2", "one_warpgroup", "unfused",
                              "overlap", "overlap_1stage", "pingpong", "overlap_pingpong",
                              "three_warpgroups"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0), (128, 128)],
                         ids=["full", "causal", "win", "band"])
def test_wgmma_kernel(head_dim, knobs, window):
    """The warpgroup-MMA kernel: tails in both sequences (TMA zero-fill, clipped TMA store),
    GQA, each mask, each tile and ring depth, and Sq > Sk (rows that see no key)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim).replace(**knobs)
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, torch.bfloat16, seed=head_dim)
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 300, 130, 4, 4, head_dim, torch.float16, seed=head_dim + 1)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0), (128, 128)],
                         ids=["full", "causal", "win", "band"])
def test_wgmma_head_dims(head_dim, window):
    """The wgmma default at the head dims beyond 64/128: each its own tile (B_c 96 at hd192,
    three warpgroups at hd32 unmasked) and swizzle width (96: 64-byte rows), tails, GQA, each
    mask, Sq > Sk."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, windowed=window != (-1, -1))
    assert config.wgmma
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, torch.bfloat16, seed=head_dim + 2)
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 300, 130, 4, 4, head_dim, torch.float16, seed=head_dim + 3)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim,block_n", [(192, 112), (256, 80)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (128, 128)], ids=["full", "causal", "band"])
def test_wgmma_fence_p(head_dim, block_n, window):
    """P pinned before the P V MMAs (``fence_p``) at FA3's B_c for hd192 and hd256: tails,
    GQA, masks, both dtypes."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        block_n=block_n, fence_p=True)
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, torch.bfloat16, seed=head_dim + 4)
    check_dense(q, k, v, window=window, config=config)
    q, k, v = dense_inputs(1, 300, 130, 4, 4, head_dim, torch.float16, seed=head_dim + 5)
    check_dense(q, k, v, window=window, config=config)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (128, 128)], ids=["full", "causal", "band"])
def test_wgmma_rescale_o_before_pv(head_dim, window):
    """O rescaled for block j-1's maxima before its P V (``rescale_o_before_pv``): one K/V
    block (only the prologue and the epilogue's P V), many, masks, packed sequences."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        rescale_o_before_pv=True)
    for seqlen_k in (40, 517):
        q, k, v = dense_inputs(2, 333, seqlen_k, 8, 2, head_dim, torch.bfloat16,
                               seed=head_dim + seqlen_k)
        check_dense(q, k, v, window=window, config=config)
    check_varlen(window, torch.float16, config, head_dim)


@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)], ids=["full", "causal"])
def test_wgmma_late_o_addresses(head_dim, window):
    """The epilogue's staging addresses built after the K/V loop (``late_o_addresses``), with
    O rescaled before or after P V: tails, GQA, one block and many, packed sequences (whose
    epilogue copies rows instead of one TMA store)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    base = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        late_o_addresses=True)
    for rescale_first in (False, True):
        config = base.replace(rescale_o_before_pv=rescale_first)
        for seqlen_k in (40, 517):
            q, k, v = dense_inputs(2, 333, seqlen_k, 8, 2, head_dim, torch.bfloat16,
                                   seed=head_dim + seqlen_k + rescale_first)
            check_dense(q, k, v, window=window, config=config)
    check_varlen(window, torch.float16, base, head_dim)


def lazy_inputs(keys: str, head_dim: int, dtype, seed: int):
    """q, k, v whose row maxima ``keys`` makes stay put (``random``: settled within a block
    or two), jump past the lazy threshold at every K/V block (``rising``: keys scaled up along
    the sequence), or do one or the other by row (``mixed``: every third query row large, the
    rest small, so one warp holds rows of both kinds)."""
    q, k, v = dense_inputs(2, 333, 517, 8, 2, head_dim, dtype, seed=seed)
    if keys != "random":
        ramp = 1 + torch.arange(k.shape[1], device="cuda", dtype=torch.float32) / 32
        k = (k.float() * ramp[None, :, None, None]).to(dtype)
    if keys == "mixed":
        rows = torch.arange(q.shape[1], device="cuda")
        q = (q.float() * torch.where(rows % 3 == 0, 2.0, 0.05)[None, :, None, None]).to(dtype)
    return q, k, v


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("keys", ["random", "rising", "mixed"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (128, 128)], ids=["full", "causal", "band"])
def test_wgmma_lazy_rescale(head_dim, keys, window):
    """Row maxima kept while they grow by at most 2^8 (``lazy_rescale``), O rescaled where a
    warp's rows moved: maxima that settle, that jump at every block, and both within one warp;
    O rescaled before or after P V; masks (rows without keys keep -inf), packed sequences;
    unmasked, also in clusters of two CTAs."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    base = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        lazy_rescale=True)
    for rescale_first in (False, True):
        config = base.replace(rescale_o_before_pv=rescale_first)
        q, k, v = lazy_inputs(keys, head_dim, torch.bfloat16, seed=head_dim + rescale_first)
        check_dense(q, k, v, window=window, config=config)
    q, k, v = lazy_inputs(keys, head_dim, torch.float16, seed=head_dim + 7)
    check_dense(q, k, v, window=window, config=base)
    if window == (-1, -1):
        check_dense(q, k, v, window=window, config=base.replace(cluster_m=2))
    check_varlen(window, torch.float16, base, head_dim)


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (128, 128)], ids=["full", "causal", "band"])
def test_wgmma_correction_first(head_dim, window):
    """Row sums started from the old sum times its correction (``correction_first``): maxima
    that jump at every block (each correction far from 1) and that settle, with O rescaled
    after or before P V and lazily; masks, packed sequences, both dtypes."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    base = policy.default_for("sm_90a", head_dim, window != (-1, -1)).replace(
        correction_first=True)
    for i, knobs in enumerate(({"rescale_o_before_pv": False, "lazy_rescale": False},
                               {"rescale_o_before_pv": True, "lazy_rescale": False},
                               {"lazy_rescale": True})):
        for keys in ("rising", "random"):
            q, k, v = lazy_inputs(keys, head_dim, torch.bfloat16, seed=head_dim + i)
            check_dense(q, k, v, window=window, config=base.replace(**knobs))
    q, k, v = lazy_inputs("mixed", head_dim, torch.float16, seed=head_dim + 5)
    check_dense(q, k, v, window=window, config=base)
    check_varlen(window, torch.float16, base, head_dim)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_wgmma_cluster_multicast(head_dim, dtype):
    """K and V multicast to clusters of two CTAs (``cluster_m=2``): row-block counts even
    and odd (the odd count's last CTA computes a group's tile past the last row block, which
    must write nothing: its rows would be the next batch element's), GQA and MQA, more clusters
    than tiles and several tiles a cluster (the ring runs on across tiles), K/V tails past
    the last full block, Sq != Sk, and a second call on the same launch."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, False).replace(cluster_m=2)
    check_dense_shapes(config, ((2, 1000, 1000, 8, 2), (2, 800, 777, 4, 4),
                                (3, 200, 1500, 16, 1), (1, 64, 64, 1, 1),
                                (4, 1000, 333, 16, 16)), head_dim, DTYPES[dtype], 31 * head_dim)


def check_dense_shapes(config, shapes, head_dim: int, dtype, seed: int) -> None:
    """Unmasked ``config`` at each ``(batch, seqlen_q, seqlen_k, heads, heads_kv)``, and the
    last shape again (a second call on the same launch)."""
    for i, shape in enumerate(shapes):
        q, k, v = dense_inputs(*shape, head_dim, dtype, seed=seed + i)
        check_dense(q, k, v, window=(-1, -1), config=config)
    check_dense(q, k, v, window=(-1, -1), config=config)


@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_wgmma_split_tail(head_dim, dtype, cluster):
    """``split_tail``: the last waves dealt out as runs of K/V blocks, a tile split between
    two CTAs merged through scratch. Tiles over one wave (all split), over a few whole waves
    with a K/V tail block in a piece, fewer tiles than CTAs and a whole number of waves (not
    split), odd row blocks in clusters; GQA and MQA; a second call (the flags must be down
    again) and the flags left zero."""
    from attnlab.counters import tile_counters

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, False).replace(split_tail=True,
                                                                  cluster_m=cluster)
    check_dense_shapes(config, ((2, 1000, 1000, 16, 4), (1, 3000, 777, 24, 8),
                                (4, 1000, 333, 16, 16), (3, 200, 1500, 16, 1),
                                (1, 4224, 500, 8, 8)), head_dim, DTYPES[dtype], 7 * head_dim)
    torch.cuda.synchronize()
    assert not tile_counters(torch.device("cuda"), 1024).any()


def test_static_strides_compile_per_stride_set():
    """k16 compiles the row/head strides in: a BHSD view (other strides) gets its own kernel."""
    q, k, v = dense_inputs(2, 300, 300, 4, 4, 64, torch.bfloat16, seed=9)
    check_dense(q, k, v, window=(-1, -1), config=ladder.k16)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert views[0].stride() != q.stride()
    check_dense(*views, window=(-1, -1), config=ladder.k16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("head_dim", "seqlen"), [(64, policy.LONG_MASKED_SEQLEN // 2),
                                                   (256, policy.LONG_MASKED_SEQLEN // 2),
                                                   (64, policy.MID_MASKED_SEQLEN),
                                                   (64, policy.VERY_LONG_MASKED_SEQLEN),
                                                   (128, policy.VERY_LONG_MASKED_SEQLEN)])
@pytest.mark.parametrize("window", [(-1, 0), (64, 0), (200, -1)], ids=["causal", "win", "left"])
def test_masked_default_by_length(window, head_dim, seqlen, dtype):
    """The masked defaults that depend on the query length (below 2k: hd64 on two warpgroups
    in FA4's order, hd256 at B_c 64 rescaling lazily; hd64 in the 2k bucket:
    the static walk; hd64 from 8k: B_c 128 in FA4's order (row sums from the corrected old
    sums, O rescaled after P V, late epilogue addresses); hd128 from 8k: one CTA per
    tile, longest first over 16 MiB L2 sections), on a problem short enough for the fp64
    reference: the config, not the length, is under test."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a")
    config = policy.default_for("sm_90a", head_dim, True, seqlen=seqlen)
    assert config != policy.default_for("sm_90a", head_dim, True)
    q, k, v = dense_inputs(3, 1000, 1000, 8, 2, head_dim, dtype, seed=11 + head_dim)
    check_dense(q, k, v, window=window, config=config)
