"""Decoding against a KV cache on the GPU (issue 21): ``attention_with_kvcache`` against an
fp64 reference built from the gathered cache, appends, paged vs contiguous, every split."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab import reference
from attnlab.kernels.abi import DECODE_WARPS

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def randn(*shape, dtype, gen):
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)


def make_cache(batch, capacity, heads_kv, head_dim, dtype, gen, page_size=None):
    """(k_cache, v_cache, block_table): contiguous, or paged with the pages shuffled (a
    sequence's pages scattered over the pool, some pages unused)."""
    if page_size is None:
        return (randn(batch, capacity, heads_kv, head_dim, dtype=dtype, gen=gen),
                randn(batch, capacity, heads_kv, head_dim, dtype=dtype, gen=gen), None)
    per_seq = -(-capacity // page_size)
    pages = batch * per_seq + 3
    order = torch.randperm(pages, device="cuda", generator=gen)[: batch * per_seq]
    table = order.view(batch, per_seq).to(torch.int32).contiguous()
    return (randn(pages, page_size, heads_kv, head_dim, dtype=dtype, gen=gen),
            randn(pages, page_size, heads_kv, head_dim, dtype=dtype, gen=gen), table)


def gathered(cache, table, b, length, batch_idx=None):
    """Sequence b's first ``length`` keys as [1, length, Hkv, D]."""
    if table is None:
        row = b if batch_idx is None else int(batch_idx[b])
        return cache[row, :length][None]
    page_size = cache.shape[1]
    pages = table[b, : -(-length // page_size)].long()
    return cache[pages].flatten(0, 1)[:length][None]


def reference_out(q, k_cache, v_cache, table, lengths, window, scale, batch_idx=None):
    outs, lses = [], []
    for b, length in enumerate(lengths):
        k = gathered(k_cache, table, b, length, batch_idx).double()
        v = gathered(v_cache, table, b, length, batch_idx).double()
        o, lse = reference.attention(q[b: b + 1].double(), k, v, softmax_scale=scale,
                                     window_size=window, return_lse=True,
                                     compute_dtype=torch.float64)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def check(out, lse, ref_out, ref_lse, dtype, what):
    assert not out.isnan().any(), f"{what}: NaN in the output"
    err = (out.double() - ref_out).abs().max().item()
    bound = 2e-2 if dtype == torch.bfloat16 else 4e-3
    assert err <= bound, f"{what}: max abs error {err:.3e} > {bound}"
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite), f"{what}: LSE -inf pattern differs"
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() <= 1e-3 if (
        finite.any()) else True


# (batch, Sq, Hq, Hkv, D, page_size, window)
CASES = [
    (1, 1, 32, 8, 128, None, (-1, -1)),     # decode, GQA 4
    (3, 1, 8, 1, 128, 16, (-1, -1)),        # MQA, paged (16-row pages)
    (2, 4, 16, 4, 64, 64, (-1, 0)),         # speculative rows, causal, paged
    (2, 3, 8, 8, 256, None, (100, 0)),      # hd256, sliding window
    (4, 1, 32, 8, 96, 32, (-1, -1)),        # hd96
    (2, 5, 12, 4, 128, None, (-1, 0)),      # 15 packed rows: one tile
    (1, 7, 16, 4, 64, None, (-1, 0)),       # 28 packed rows: two tiles
    (2, 1, 8, 2, 32, None, (-1, -1)),       # hd32
    (1, 2, 16, 4, 192, 32, (-1, 0)),        # hd192, paged, causal
    (2, 1, 16, 4, 96, 16, (-1, -1)),        # hd96: a thread's rows 32 keys apart, 2 pages
    (3, 1, 32, 8, 128, 48, (-1, -1)),       # pages that straddle the 128-key blocks
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"w{c[6]}")
# 3, 0 (auto: at most 12 here) and 32: merged serially; 64 (most of them empty): by the combine.
@pytest.mark.parametrize("num_splits", [1, 3, 0, 32, 64])
def test_matches_the_reference_over_ragged_caches(case, dtype, num_splits):
    batch, seqlen_q, _, _, head_dim, _, _ = case
    check_ragged_call(case, DTYPES[dtype], num_splits, batch * 131 + head_dim + seqlen_q)


def check_ragged_call(case, dt, num_splits, seed, poison=False):
    """One call over ragged caches of 1500 keys (one length 0 when there are several
    sequences) against the fp64 reference, into an ``out`` poisoned with NaN; ``poison``:
    NaN in every cache slot past the lengths too (``poison_past_lengths``)."""
    batch, seqlen_q, heads, heads_kv, head_dim, page_size, window = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    capacity = 1500
    k_cache, v_cache, table = make_cache(batch, capacity, heads_kv, head_dim, dt, gen,
                                         page_size)
    lengths = [0 if b == 1 else 1 + (977 * (b + 1)) % capacity for b in range(batch)]
    if poison:
        poison_past_lengths(k_cache, v_cache, table, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = randn(batch, seqlen_q, heads, head_dim, dtype=dt, gen=gen)
    scale = 1 / math.sqrt(head_dim)
    out = torch.full_like(q, math.nan)
    got, lse = attnlab.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, softmax_scale=scale,
        window_size=window, num_splits=num_splits, return_lse=True, out=out)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr()
    ref_out, ref_lse = reference_out(q, k_cache, v_cache, table, lengths, window, scale)
    check(got, lse, ref_out, ref_lse, dt, f"{case} splits={num_splits}")


@pytest.mark.parametrize("num_splits", [0, 128])
def test_one_long_paged_range_split_over_the_whole_wave(num_splits):
    """B = 1 MQA over a paged cache of 64k keys and more: where the DRAM outruns half the SMs'
    paged CTAs, the automatic split count is 128 (``decode.PAGED_WAVE_SPLITS``), 64 elsewhere;
    both, and 128 asked for, against the fp64 reference (the last split's walk ragged)."""
    gen = torch.Generator(device="cuda").manual_seed(11 + num_splits)
    dt = torch.bfloat16
    capacity, length = 70_000, 69_999
    k_cache, v_cache, table = make_cache(1, capacity, 1, 128, dt, gen, 64)
    q = randn(1, 1, 8, 128, dtype=dt, gen=gen)
    scale = 128 ** -0.5
    out = torch.full_like(q, math.nan)
    got, lse = attnlab.attention_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor([length], dtype=torch.int32,
                                                        device="cuda"),
        block_table=table, softmax_scale=scale, num_splits=num_splits, return_lse=True,
        out=out)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_out(q, k_cache, v_cache, table, [length], (-1, -1), scale)
    check(got, lse, ref_out, ref_lse, dt, f"1 x {length} MQA paged splits={num_splits}")


@pytest.mark.parametrize("paged", [False, True])
def test_appends_land_at_their_slots_and_nothing_else_moves(paged):
    gen = torch.Generator(device="cuda").manual_seed(5)
    dt = torch.bfloat16
    batch, heads, heads_kv, head_dim, new = 3, 16, 4, 128, 3
    k_cache, v_cache, table = make_cache(batch, 600, heads_kv, head_dim, dt, gen,
                                         32 if paged else None)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    lengths = [5, 0, 590]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = randn(batch, new, heads, head_dim, dtype=dt, gen=gen)
    k = randn(batch, new, heads_kv, head_dim, dtype=dt, gen=gen)
    v = randn(batch, new, heads_kv, head_dim, dtype=dt, gen=gen)
    out = attnlab.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                         block_table=table, causal=True)
    torch.cuda.synchronize()
    # The new rows are where they belong; every other row is untouched.
    expect_k, expect_v = before_k.clone(), before_v.clone()
    for b, length in enumerate(lengths):
        for i in range(new):
            pos = length + i
            if table is None:
                where = (b, pos)
            else:
                where = (int(table[b, pos // 32]), pos % 32)
            expect_k[where] = k[b, i]
            expect_v[where] = v[b, i]
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)
    ref_out, _ = reference_out(q, k_cache, v_cache, table, [n + new for n in lengths],
                               (-1, 0), 1 / math.sqrt(head_dim))
    assert (out.double() - ref_out).abs().max().item() <= 2e-2


def test_paged_and_contiguous_caches_agree():
    gen = torch.Generator(device="cuda").manual_seed(9)
    dt = torch.float16
    batch, capacity, heads_kv, head_dim, page = 2, 1024, 8, 128, 64
    k_cache, v_cache, table = make_cache(batch, capacity, heads_kv, head_dim, dt, gen, page)
    dense_k = torch.stack([gathered(k_cache, table, b, capacity)[0] for b in range(batch)])
    dense_v = torch.stack([gathered(v_cache, table, b, capacity)[0] for b in range(batch)])
    q = randn(batch, 1, 32, head_dim, dtype=dt, gen=gen)
    seqlens = torch.tensor([1000, 333], dtype=torch.int32, device="cuda")
    for splits in (1, 4):
        paged = attnlab.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                               block_table=table, num_splits=splits)
        dense = attnlab.attention_with_kvcache(q, dense_k, dense_v, cache_seqlens=seqlens,
                                               num_splits=splits)
        if splits == 1:
            assert torch.equal(paged, dense)
        else:
            # A contiguous cache's splits interleave their blocks, a paged one's take ranges:
            # the same keys merged in another order, an fp16 rounding or two apart.
            torch.testing.assert_close(paged, dense, rtol=0, atol=1e-3)


@pytest.mark.parametrize("layout", ["packed_kv", "v_padded"])
@pytest.mark.parametrize("page_size", [None, 32])
def test_caches_with_their_own_strides(layout, page_size):
    """K and V as views of one packed [.., .., 2, Hkv, D] tensor (equal strides, so the
    kernel computes each row's offset once for both), and a V whose rows are padded (its
    strides differ from K's: ``DecodeSpec.v_strides``)."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    dt = torch.bfloat16
    batch, capacity, heads_kv, head_dim = 3, 600, 4, 128
    k_cache, v_cache, table = make_cache(batch, capacity, heads_kv, head_dim, dt, gen,
                                         page_size)
    if layout == "packed_kv":
        kv = torch.stack([k_cache, v_cache], dim=2)
        k_cache, v_cache = kv[:, :, 0], kv[:, :, 1]
    else:
        padded = randn(*v_cache.shape[:-1], head_dim + 8, dtype=dt, gen=gen)
        padded[..., :head_dim] = v_cache
        v_cache = padded[..., :head_dim]
    assert (v_cache.stride()[:2] != k_cache.stride()[:2]) == (layout == "v_padded")
    lengths = [600, 1, 257]
    q = randn(batch, 1, 16, head_dim, dtype=dt, gen=gen)
    for splits in (1, 3):
        out, lse = attnlab.attention_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32,
                                                            device="cuda"),
            block_table=table, num_splits=splits, return_lse=True,
            out=torch.full_like(q, math.nan))
        ref_out, ref_lse = reference_out(q, k_cache, v_cache, table, lengths, (-1, -1),
                                         head_dim ** -0.5)
        check(out, lse, ref_out, ref_lse, dt, f"{layout} pages={page_size} splits={splits}")


def test_cache_batch_idx_selects_cache_rows():
    gen = torch.Generator(device="cuda").manual_seed(13)
    dt = torch.bfloat16
    k_cache, v_cache, _ = make_cache(5, 700, 2, 64, dt, gen)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda")
    q = randn(3, 1, 8, 64, dtype=dt, gen=gen)
    lengths = [700, 12, 333]
    out = attnlab.attention_with_kvcache(q, k_cache, v_cache, cache_batch_idx=idx,
                                         cache_seqlens=torch.tensor(lengths, dtype=torch.int32,
                                                                    device="cuda"))
    ref_out, _ = reference_out(q, k_cache, v_cache, None, lengths, (-1, -1), 0.125, idx)
    assert (out.double() - ref_out).abs().max().item() <= 2e-2


def test_lengths_given_as_none_or_an_int_follow_each_call():
    """No ``cache_seqlens`` (the whole cache), then ints that change and repeat: each call
    attends to exactly its own length (the filled lengths are reused only for the same
    count)."""
    gen = torch.Generator(device="cuda").manual_seed(21)
    dt = torch.bfloat16
    k_cache, v_cache, _ = make_cache(2, 640, 2, 64, dt, gen)
    q = randn(2, 1, 8, 64, dtype=dt, gen=gen)
    for length in (None, 100, 100, 37, 640, None):
        out = attnlab.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=length)
        n = 640 if length is None else length
        ref_out, _ = reference_out(q, k_cache, v_cache, None, [n, n], (-1, -1), 0.125)
        assert (out.double() - ref_out).abs().max().item() <= 2e-2, length


def test_opt_in_check_refuses_lengths_and_pages_out_of_range():
    gen = torch.Generator(device="cuda").manual_seed(2)
    k_cache, v_cache, table = make_cache(2, 256, 2, 64, torch.bfloat16, gen, 64)
    q = randn(2, 1, 4, 64, dtype=torch.bfloat16, gen=gen)
    too_long = torch.tensor([10, 257], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="does not fit"):
        attnlab.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=too_long,
                                       block_table=table, check_cache=True)
    bad = table.clone()
    bad[1, 0] = 10_000
    with pytest.raises(ValueError, match="names pages outside"):
        attnlab.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, block_table=bad,
                                       check_cache=True)


def _step_inputs(seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16
    k_cache, v_cache, table = make_cache(2, 512, 2, 64, dt, gen, 64)
    q = randn(2, 2, 8, 64, dtype=dt, gen=gen)
    k, v = (randn(2, 2, 2, 64, dtype=dt, gen=gen) for _ in range(2))
    return q, k_cache, v_cache, k, v, table


def test_torch_compile_fullgraph_matches_eager_and_appends():
    torch.compiler.reset()
    q, k_cache, v_cache, k, v, table = _step_inputs(21)
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([100, 7], dtype=torch.int32, device="cuda")

    def step(q, k_cache, v_cache, k, v, seqlens):
        return attnlab.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                              block_table=table, causal=True, return_lse=True)

    got, got_lse = torch.compile(step, fullgraph=True)(q, k_cache, v_cache, k, v, seqlens)
    want, want_lse = step(q, k_eager, v_eager, k, v, seqlens)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)


@pytest.mark.parametrize("cluster", [False, True], ids=["serial", "cluster"])
def test_cuda_graph_replays_a_decode_step_with_new_lengths(cluster, monkeypatch):
    """Without the cluster merge: eager, the 4 splits merge in the decoding kernel
    (``serial_merge``); captured, in the combine kernel (replays have no host side to
    save). With it (sm_90a), in a cluster of the splits' CTAs both ways. Each against the
    eager result."""
    from attnlab import decode

    if cluster and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("clusters of the splits are sm_90a's")
    monkeypatch.setattr(decode, "CLUSTER_MERGE", cluster)
    q, k_cache, v_cache, k, v, table = _step_inputs(22)
    seqlens = torch.tensor([40, 300], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def step():
        attnlab.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                       block_table=table, num_splits=4, out=out)

    monkeypatch.setattr(decode, "_calls", {})
    step()  # builds the kernels outside the capture
    (call,) = decode._calls.values()
    assert call.serial != cluster and call.cluster == cluster
    combines = []
    combine = call.combine
    call.combine = lambda *args: (combines.append(1), combine(*args))
    try:
        step()
        assert not combines
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        assert combines == ([] if cluster else [1])
    finally:
        call.combine = combine
    for lengths in ([0, 17], [255, 400]):
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        q.normal_()
        k_eager, v_eager = k_cache.clone(), v_cache.clone()
        out.fill_(math.nan)
        graph.replay()
        want = attnlab.attention_with_kvcache(q, k_eager, v_eager, k, v, cache_seqlens=seqlens,
                                              block_table=table, num_splits=4)
        torch.cuda.synchronize()
        # The two merges round differently (one pass rescaling, or the largest LSE first).
        assert not out.isnan().any()
        assert (out.double() - want.double()).abs().max().item() <= 2e-2
        assert torch.equal(k_cache, k_eager)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("splits", [1, 3, 37, 128])
def test_combine_merges_partials_by_their_lses(head_dim, splits):
    """The combine against an fp64 merge of random partials: some splits saw no key (LSE
    -inf, weight 0), one row none at all (O = 0, LSE -inf); outputs start as NaN."""
    from attnlab import device, kernel_cache
    from attnlab.kernels.abi import CombineSpec

    gen = torch.Generator(device="cuda").manual_seed(splits * 7 + head_dim)
    batch, seqlen_q, heads = 3, 2, 5
    part = torch.randn(splits * batch, seqlen_q, heads, head_dim, device="cuda", generator=gen)
    part_lse = 4 * torch.randn(splits * batch, heads, seqlen_q, device="cuda", generator=gen)
    empty = torch.rand(part_lse.shape, device="cuda", generator=gen) < 0.3
    part_lse[empty] = -math.inf
    part_lse.view(splits, batch, heads, seqlen_q)[:, 1, 2, 0] = -math.inf
    out = torch.full((batch, seqlen_q, heads, head_dim), math.nan, dtype=torch.bfloat16,
                     device="cuda")
    lse = torch.full((batch, heads, seqlen_q), math.nan, device="cuda")
    spec = CombineSpec(device.info(out.device).arch, "bfloat16", head_dim)
    kernel_cache.get(spec).fn(part, part_lse, out, lse, splits)
    torch.cuda.synchronize()
    lses = part_lse.double().view(splits, batch, heads, seqlen_q)
    ref_lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - ref_lse.nan_to_num(neginf=0.0)).nan_to_num(0.0)
    parts = part.double().view(splits, batch, seqlen_q, heads, head_dim)
    ref = (weights.permute(0, 1, 3, 2)[..., None] * parts).sum(0)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out.double() - ref).abs().max().item() <= 2e-2
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite) and not finite[1, 2, 0]
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() <= 1e-4
    assert out[1, 0, 2].abs().max().item() == 0


def poison_past_lengths(k_cache, v_cache, table, lengths):
    """NaN in every cache slot no sequence reads: past each length, and unused pages; and
    the table's entries past a sequence's pages point far outside the cache (a kernel may
    read them, never follow them)."""
    if table is None:
        for b, length in enumerate(lengths):
            k_cache[b, length:] = math.nan
            v_cache[b, length:] = math.nan
        return
    page_size = k_cache.shape[1]
    unused = torch.ones(k_cache.shape[0], dtype=torch.bool, device=k_cache.device)
    for b, length in enumerate(lengths):
        for i, page in enumerate(table[b].tolist()):
            unused[page] = False
            first = max(0, length - i * page_size)
            k_cache[page, first:] = math.nan
            v_cache[page, first:] = math.nan
    k_cache[unused] = math.nan
    v_cache[unused] = math.nan
    for b, length in enumerate(lengths):
        table[b, -(-length // page_size):] = 2**30


# (batch, Sq, Hq, Hkv, D, page_size, window): contiguous (a 1500-key cache: its last block
# runs past the tensor), pages of 16 / 32 / 64 keys (boxes of a page), of 256 (boxes of a
# block inside a page), and of 48 (straddling blocks: the gathers).
TMA_CASES = [
    (3, 1, 32, 8, 128, None, (-1, -1)),
    (3, 1, 8, 1, 128, 16, (-1, -1)),
    (2, 4, 16, 4, 64, 64, (-1, 0)),
    (2, 3, 8, 8, 256, 256, (100, 0)),
    (2, 1, 16, 4, 96, 32, (-1, -1)),
    (2, 1, 8, 2, 128, 48, (-1, -1)),
]


@pytest.mark.parametrize("tma", [False, True], ids=["cp_async", "tma"])
@pytest.mark.parametrize("case", TMA_CASES, ids=lambda c: "x".join(map(str, c[:6])))
@pytest.mark.parametrize("num_splits", [1, 3, 0])
def test_unread_cache_slots_never_reach_the_output(case, num_splits, tma, monkeypatch):
    """Either way of loading K and V (``cp.async`` row gathers, or TMA boxes on sm_90a:
    ``decode.TMA_KV_LOADS``), with NaN in every slot past the sequences' lengths and in the
    unused pages: the boxes that bring such rows in must leave them masked in S and zero in
    V."""
    from attnlab import decode

    if tma and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("TMA boxes are sm_90a's")
    monkeypatch.setattr(decode, "TMA_KV_LOADS", tma)
    monkeypatch.setattr(decode, "_calls", {})
    batch, seqlen_q, _, _, head_dim, page_size, _ = case
    dt = torch.bfloat16 if head_dim != 96 else torch.float16
    keys_per_warp, _ = decode.decode_tile(head_dim, "sm_90a")
    block_n = keys_per_warp * DECODE_WARPS
    assert (decode.tma_rows("sm_90a", block_n, page_size) > 0) == (tma and page_size != 48)
    check_ragged_call(case, dt, num_splits, batch * 7 + head_dim + seqlen_q, poison=True)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:6])) + f"w{c[6]}")
@pytest.mark.parametrize("num_splits", [2, 3, 0, 16])
def test_splits_merged_in_a_cluster_match_the_reference(case, num_splits, monkeypatch):
    """The cluster merge (``decode.cluster_merge``, sm_90a): a query tile's splits are one
    cluster's CTAs (2 to 16 of them) and merge in distributed shared memory, over ragged
    caches (one sequence of length 0, the last block of each ragged), NaN in every cache
    slot past the lengths and in ``out`` before the call."""
    from attnlab import decode

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("clusters of the splits are sm_90a's")
    # Every split count here in a cluster, whatever the grid (the policy keeps clusters
    # of more than two splits to half a wave).
    monkeypatch.setattr(decode, "cluster_merge", lambda splits, *_: 1 < splits <= 16)
    monkeypatch.setattr(decode, "_calls", {})
    batch, seqlen_q, _, _, head_dim, _, _ = case
    check_ragged_call(case, torch.bfloat16, num_splits, batch * 13 + head_dim + seqlen_q,
                      poison=True)
