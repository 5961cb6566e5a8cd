"""Autotuner pieces that need no GPU: search space, selection, pruning summary, the cache, and
the dispatch that reads it."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import pytest
import torch

from attnlab import device, dispatch, ladder, memo, policy
from attnlab.config import FlashConfig
from attnlab.device import DeviceInfo
from attnlab.tune.cache import SEQLEN_BUCKETS, TuneCache, TuneKey, seqlen_bucket
from attnlab.tune.prune import Inspection
from attnlab.tune.search import select_for_timing, summarize_pruning
from attnlab.tune.space import ROW_SUM_CHAINS, WGMMA_SCHEDULES, knob_neighbours, search_space
from attnlab.validation import Problem


def test_search_space_is_valid_unique_and_holds_the_default():
    space = search_space()
    assert len(space) == len(set(space)) > 20
    # Tuning can always fall back to what it started from: the default's tile is in the
    # space, and its knobs (chains, the TMA ring) are the refinement's.
    assert policy.mma_sync_default_for("sm_90a").replace(
        row_sum_chains=1, tma_kv_loads=False, kv_stages=1, interleave_softmax=False,
        ptxas_opt_level=3) in space
    assert all(c.eager_kv_loads and c.fused_softmax and c.async_copy for c in space)
    wide = search_space(wide=True)
    assert set(space) < set(wide)
    assert any(c.swizzle == "pad8" for c in wide)
    assert any(c.k_frags_per_load != c.v_frags_per_load for c in wide)


def test_search_space_on_sm90a_holds_every_wgmma_default():
    """On sm_90a the tuner also searches the wgmma kernel's tiles and schedules: every
    default of ``policy.SM90A_WGMMA_KNOBS`` is in the space (in the per-head tile order on one
    CTA per tile, rescaling eagerly, the row sums in the old order: the others are the
    refinement's), Ampere's space has
    none; a wgmma tile's neighbours are its ring depths, schedules and grids (without a mask
    also the persistent walk in clusters of two), within shared memory, at a B_c that is not
    a power of two ``fence_p`` too, under a mask both tile orders, and the tile itself with
    the other ``lazy_rescale``, the other ``correction_first`` and the other
    ``try_wait_first``."""
    hopper, ampere = search_space(arch="sm_90a"), search_space()
    assert not any(c.wgmma for c in ampere)
    wgmma = [c for c in hopper if c.wgmma]
    assert len(wgmma) == len(set(wgmma)) and set(hopper) == set(ampere) | set(wgmma)
    for head_dim, windowed in policy.SM90A_WGMMA_KNOBS:
        default = policy.default_for("sm_90a", head_dim, windowed)
        assert default.replace(lpt=False, l2_section_mb=40, persistent=False,
                               dynamic_tiles=False, q_stages=1, lazy_rescale=False,
                               correction_first=False, split_tail=False) in wgmma
    tall = policy.default_for("sm_90a", 64)
    around = knob_neighbours(tall, "sm_90a", 64)
    # Three ring depths, each schedule, three grids; and the tile with lazy rescaling, with
    # the row sums in the other order, with the other count of Q buffers, waiting for a
    # stage by a try first and with the other tail.
    assert tall.replace(q_stages=3 - tall.q_stages) in around
    assert tall.replace(split_tail=not tall.split_tail) in around
    assert tall in around and len(around) == len(set(around)) == 3 * len(WGMMA_SCHEDULES) * 3 + 5
    assert [c for c in around if c.lazy_rescale] == [tall.replace(lazy_rescale=True)]
    assert [c for c in around if c.try_wait_first] == [tall.replace(try_wait_first=True)]
    assert [c for c in around if c.intra_wg_overlap
            and c.correction_first != tall.correction_first] == [
        tall.replace(correction_first=not tall.correction_first)]
    assert {(c.persistent, c.cluster_m) for c in around} == {(False, 1), (True, 1), (True, 2)}
    assert {(c.block_m, c.block_n) for c in around} == {(192, 128)}
    assert {c.kv_stages for c in knob_neighbours(policy.default_for("sm_90a", 256), "sm_90a",
                                                 256)} == {2}
    assert not any(c.fence_p for c in around)
    # B_c = 96 (hd192's default) also tries P pinned before the P V MMAs.
    hd192 = policy.default_for("sm_90a", 192)
    wide = [c for c in knob_neighbours(hd192, "sm_90a", 192)
            if c.lazy_rescale == hd192.lazy_rescale
            and c.correction_first == hd192.correction_first
            and c.try_wait_first == hd192.try_wait_first
            and c.split_tail == hd192.split_tail]
    assert {c.fence_p for c in wide} == {False, True}
    # Its lazy rescaling needs the overlap: the schedules without one rescale every block.
    plain_walks = [c for c in knob_neighbours(hd192, "sm_90a", 192) if not c.intra_wg_overlap]
    assert hd192.lazy_rescale and plain_walks and not any(c.lazy_rescale for c in plain_walks)
    assert len(wide) == 2 * len({c.replace(fence_p=False) for c in wide})
    masked = [c for c in knob_neighbours(policy.default_for("sm_90a", 64, True), "sm_90a", 64,
                                         True)
              if not (c.lazy_rescale or c.correction_first or c.try_wait_first
                      or c.q_stages > 1)]
    assert {(c.lpt, c.l2_section_mb) for c in masked} == {(False, 40), (True, 40), (True, 16)}
    assert {(c.persistent, c.dynamic_tiles, c.cluster_m) for c in masked} == {
        (False, False, 1), (True, False, 1), (True, True, 1)}
    assert len(masked) == 3 * len({c.replace(lpt=False, l2_section_mb=40) for c in masked})


@pytest.mark.parametrize("head_dim,windowed,dtype", [(128, False, "bfloat16"),
                                                      (64, True, "float16")])
def test_knob_neighbours_cover_chains_walks_and_loads_of_one_tile(head_dim, windowed, dtype):
    """The refinement keeps the tile and varies only the row-sum chains (up to a full tree of
    block_n / 4), the K/V walk and, on sm_90, cp.async against the TMA ring, with the
    whole-tile or the sliced softmax on the ring; every neighbour has a name of its own (the
    timing key)."""
    best = policy.mma_sync_default_for("sm_90a", head_dim, windowed, dtype)
    around = knob_neighbours(best, "sm_90a", head_dim)
    assert best in around
    chains = [c for c in ROW_SUM_CHAINS if c <= best.block_n // 4]
    loads = {(False, 1, False), (True, 2, False), (True, 2, True)}
    assert len(around) == len(set(around)) == 2 * len(chains) * len(loads)
    assert len({c.short_name() for c in around}) == len(around)
    assert {(c.row_sum_chains, c.reverse_kv, c.tma_kv_loads, c.kv_stages, c.interleave_softmax)
            for c in around} == {(n, r, *load) for n in chains for r in (False, True)
                                 for load in loads}
    assert all(c.ptxas_opt_level == (1 if c.interleave_softmax else 3) for c in around)
    plain = {"row_sum_chains": 1, "reverse_kv": False, "tma_kv_loads": False, "kv_stages": 1,
             "interleave_softmax": False, "ptxas_opt_level": 3}
    assert all(dataclasses.replace(c, **plain) == dataclasses.replace(best, **plain)
               for c in around)
    assert max(c.row_sum_chains for c in knob_neighbours(best.replace(block_n=32,
                                                                      row_sum_chains=1))) == 8
    # Ampere has no TMA; a ring that does not fit is left out.
    assert not any(c.tma_kv_loads for c in knob_neighbours(best, "sm_80", head_dim))
    big = FlashConfig(block_m=128, block_n=128, num_warps=8)
    assert not any(c.kv_stages == 2 for c in knob_neighbours(big, "sm_90a", 256))


def test_select_for_timing_takes_every_shape_once_then_big_tiles_and_fewer_registers():
    small = Inspection(FlashConfig(block_m=64, block_n=64), registers=128)
    big_hungry = Inspection(FlashConfig(block_m=128, block_n=64), registers=250)
    big_lean = Inspection(FlashConfig(block_m=128, block_n=64, q_frags_per_load=2),
                          registers=200)
    chosen, left_out = select_for_timing([small, big_hungry, big_lean], max_timed=2)
    assert chosen == [big_lean.config, small.config]
    assert left_out == 1
    chosen, left_out = select_for_timing([small, big_hungry, big_lean], max_timed=3)
    assert chosen == [big_lean.config, small.config, big_hungry.config]
    assert left_out == 0


def test_pruning_summary_adds_up():
    summary = summarize_pruning(10, Counter({"register spills": 3, "compile error": 1}), 2)
    assert summary == {"candidates": 10, "register spills": 3, "compile error": 1,
                       "over the timing budget": 2, "timed": 4}


@pytest.mark.parametrize("seqlen,bucket", [(1, 512), (512, 512), (513, 1024), (4096, 4096),
                                           (4097, 8192), (100_000, 16384)])
def test_seqlen_bucket(seqlen, bucket):
    assert seqlen_bucket(seqlen) == bucket
    assert bucket in SEQLEN_BUCKETS


KEY = TuneKey("NVIDIA H200", "90", "bfloat16", 128, False, 4096)


def test_cache_round_trip_and_clear(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    cache = TuneCache(path)
    assert cache.get(KEY) is None
    cfg = ladder.k06.replace(block_m=128)
    cache.put(KEY, cfg, best_ms=1.5, default_ms=1.6)
    cache.save()
    again = TuneCache(path)
    assert again.get(KEY) == cfg
    assert again.entries[KEY.text()]["best_ms"] == 1.5
    assert again.get(TuneKey("NVIDIA H200", "90", "float16", 128, False, 4096)) is None
    assert again.clear() == 1 and not path.exists()
    assert TuneCache(path).entries == {}


def test_cache_ignores_entries_it_cannot_read(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 1, "entries": {
        KEY.text(): {"config": {"block_m": 3}}}}))  # invalid config: a user is not crashed
    assert TuneCache(path).get(KEY) is None
    path.write_text(json.dumps({"version": 0, "entries": {KEY.text(): {}}}))
    assert TuneCache(path).entries == {}


def test_default_path_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_TUNE_CACHE", str(tmp_path / "t.json"))
    assert TuneCache().path == tmp_path / "t.json"


H200 = DeviceInfo(0, "NVIDIA H200", (9, 0), "sm_90a", 132, 60 << 20)


@pytest.fixture
def fake_h200(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "info", lambda which=None: H200)
    monkeypatch.setenv("ATTNLAB_TUNE_CACHE", str(tmp_path / "tune.json"))
    dispatch.reload_tune_cache()
    yield TuneCache()
    dispatch.reload_tune_cache()


def problem(seqlen_q: int, dtype=torch.bfloat16) -> Problem:
    return Problem(batch=4, seqlen_q=seqlen_q, seqlen_k=seqlen_q, num_heads=16, num_heads_kv=16,
                   head_dim=128, dtype=dtype, softmax_scale=128**-0.5)


def test_dispatch_uses_the_tuned_entry_then_falls_back(fake_h200):
    device = H200
    # 4096 and 8192 queries make even counts of row blocks: paired (``paired_row_blocks``).
    paired = {"cluster_m": 2}
    assert dispatch.config_for(device, problem(4096)) == policy.default_for(
        "sm_90a", seqlen=4096).replace(**paired)
    tuned = ladder.k06.replace(block_m=128, block_n=128, num_warps=8)
    fake_h200.put(KEY, tuned)
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(device, problem(4096)) == tuned
    assert dispatch.config_for(device, problem(3000)) == tuned  # same bucket
    fallback = policy.default_for("sm_90a", seqlen=8192).replace(**paired)
    assert dispatch.config_for(device, problem(8192)) == fallback  # no entry
    assert (dispatch.config_for(device, problem(4096, torch.float16))
            == policy.default_for("sm_90a", dtype="float16", seqlen=4096).replace(
                **paired))  # key's dtype


def test_varlen_dispatch_never_picks_the_mma_sync_tma_ring(fake_h200):
    """Packed sequences run the wgmma kernel on sm_90a (its TMA boxes start at each
    sequence); the mma.sync kernel's TMA ring cannot serve them, so an entry tuned with it
    gives way to the varlen default (the dense one's walk on the counter), and a tuned wgmma
    entry stands, without the clusters of a dense walk and on the counter."""
    device = H200
    packed = dataclasses.replace(problem(4096), varlen=True)
    packed_default = policy.default_for("sm_90a", 128, seqlen=4096).replace(dynamic_tiles=True)
    assert dispatch.config_for(device, packed) == packed_default == (
        dispatch.config_for(device, problem(4096)).replace(cluster_m=1, dynamic_tiles=True))
    ring = policy.mma_sync_default_for("sm_90a", 128).replace(row_sum_chains=16)
    assert ring.tma_kv_loads and not ring.wgmma
    fake_h200.put(KEY, ring)
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(device, problem(4096)) == ring
    assert dispatch.config_for(device, packed) == packed_default
    tall = policy.default_for("sm_90a", 64)
    fake_h200.put(KEY, tall.replace(cluster_m=2))
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(device, packed) == tall.replace(dynamic_tiles=True)
    assert dispatch.config_for(device, problem(4096)) == tall.replace(cluster_m=2)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_warm_covers_every_default_the_dispatch_picks(fake_h200, monkeypatch, arch):
    """``attnlab cache --warm`` (``policy.default_specs``) compiles the kernel a call runs
    without a tuned entry at every head dim, dtype, mask and query length (each bucket's
    walk, a short K/V walk), packed or dense (a dense masked grid the static walk leaves
    unbalanced, which ``dispatch`` moves to the counter, excepted)."""
    monkeypatch.setattr(device, "info", lambda which=None: dataclasses.replace(H200, arch=arch))
    warmed = {(s.config, s.dtype, s.head_dim, s.windowed, s.varlen)
              for s in policy.default_specs(arch)}
    for head_dim, dtype, window, seqlen_q, seqlen_k, varlen in itertools.product(
            (32, 64, 96, 128, 192, 256), (torch.bfloat16, torch.float16), ((-1, -1), (-1, 0)),
            (300, 1024, 2048, 4096, 8192, 16384), (77, 16384), (False, True)):
        call = dataclasses.replace(problem(seqlen_q), varlen=varlen, head_dim=head_dim,
                                   dtype=dtype, window=window, seqlen_k=seqlen_k)
        chosen = dispatch.config_for(device.info(), call)
        if call.windowed and not varlen and chosen.dynamic_tiles:
            chosen = policy.default_for(arch, head_dim, True, call.dtype_name, False,
                                        seqlen_bucket(seqlen_q))
        assert (chosen, call.dtype_name, head_dim, call.windowed, varlen) in warmed, call


def test_a_sliding_band_looks_its_default_up_by_its_head_dims_length(fake_h200):
    """A dense window at most half as wide as the queries takes, at hd128, the masked default
    of 4k queries (a persistent walk, not one CTA a tile) and, at hd256, the short masked tile,
    as does hd96 for any band up to 1024 keys wide; causal masks, wider windows, one-sided
    ones, hd64 and packed sequences keep their own."""
    assert policy.masked_lookup_seqlen(128, 16384, (1024, 0)) == 4096
    assert policy.masked_lookup_seqlen(128, 16384, (512, 512)) == 4096
    assert policy.masked_lookup_seqlen(128, 2048, (512, 0)) == 2048
    assert policy.masked_lookup_seqlen(256, 8192, (2048, 0)) == 1
    assert policy.masked_lookup_seqlen(96, 16384, (512, 512)) == 1
    assert policy.masked_lookup_seqlen(96, 8192, (1024, 0)) == 1
    assert policy.masked_lookup_seqlen(96, 2048, (512, 512)) == 1
    for head_dim, window in ((128, (-1, 0)), (128, (8192, 0)), (128, (512, -1)),
                             (64, (512, 512)), (96, (1536, 0)), (96, (512, 513))):
        assert policy.masked_lookup_seqlen(head_dim, 16384, window) == 16384, window
    band = dataclasses.replace(problem(16384), batch=1, window=(1024, 0))
    causal = dataclasses.replace(band, window=(-1, 0))
    chosen = dispatch.config_for(H200, band)
    assert chosen == dispatch.choose(H200, band, 4096, False)
    assert chosen.persistent and chosen.lazy_rescale and chosen.q_stages == 2
    assert not dispatch.config_for(H200, causal).persistent
    wide = dispatch.config_for(H200, dataclasses.replace(band, head_dim=256))
    assert wide.block_n == 64 and wide == dispatch.choose(
        H200, dataclasses.replace(band, head_dim=256), 512, False)
    packed = dataclasses.replace(band, varlen=True)
    assert dispatch.config_for(H200, packed) == dispatch.choose(H200, packed, 16384, False)
    # An entry tuned for causal 4k problems serves the band too; the causal 16k call keeps
    # its default.
    tuned = policy.default_for("sm_90a", 128, True).replace(block_n=96)
    fake_h200.put(dataclasses.replace(KEY, causal=True), tuned)
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(H200, band) == tuned
    assert dispatch.config_for(H200, causal) != tuned


def test_a_tuned_cluster_entry_pairs_only_row_blocks_that_pair_up(fake_h200):
    """An entry tuned with clusters of two serves its whole length bucket: where a length
    makes an odd count of row blocks (3900 queries, 31 of 128), the entry runs without them
    (a cluster would idle on a wasted tile)."""
    clustered = policy.default_for("sm_90a", 128).replace(cluster_m=2, block_n=144)
    fake_h200.put(KEY, clustered)
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(H200, problem(4096)) == clustered
    assert dispatch.config_for(H200, problem(3840)) == clustered  # 30 row blocks
    assert dispatch.config_for(H200, problem(3900)) == clustered.replace(cluster_m=1)


def test_dispatch_chooses_right_past_its_memo_bound(fake_h200, monkeypatch):
    """Plain problems' choices are keyed by exact query length, in a memo that starts over at
    ``memo.MAX_MEMO`` entries: a server that sees more lengths than that gets each chosen
    right, before and after the memo starts over."""
    monkeypatch.setattr(memo, "MAX_MEMO", 4)
    for _ in range(2):
        for seqlen in range(1000, 1010):
            assert dispatch.config_for(H200, problem(seqlen)).cluster_m == 2
        assert dispatch.config_for(H200, problem(1025)).cluster_m == 1  # 9 row blocks


def test_memo_starts_over_at_its_bound(monkeypatch):
    """``memo.remember`` keeps at most ``MAX_MEMO`` entries, the newest always among them."""
    monkeypatch.setattr(memo, "MAX_MEMO", 4)
    table: dict = {}
    for i in range(11):
        memo.remember(table, (i,), i)
        assert len(table) <= 4 and table[(i,)] == i
    assert len(table) == 3  # started over at the ninth entry


def test_dispatch_pairs_row_blocks_where_they_pair_up(fake_h200):
    """Unmasked dense problems at hd128, hd192 and hd256 share their K/V loads in clusters of
    two where their row blocks (128 rows) pair up; an odd count, hd64, hd96, hd32, a mask,
    packed sequences and a short K/V walk keep one CTA a tile."""
    for seqlen, cluster in ((4096, 2), (1000, 2), (256, 2), (3900, 1), (300, 1), (128, 1)):
        assert dispatch.config_for(H200, problem(seqlen)).cluster_m == cluster, seqlen
    for head_dim in (192, 256):
        assert dispatch.config_for(H200, dataclasses.replace(problem(4096), head_dim=head_dim)
                                   ).cluster_m == 2
    for other in ({"head_dim": 64}, {"head_dim": 96}, {"head_dim": 32}, {"window": (-1, 0)},
                  {"varlen": True}, {"seqlen_k": 77}):
        assert dispatch.config_for(H200, dataclasses.replace(problem(4096), **other)
                                   ).cluster_m == 1, other


def test_dispatch_default_follows_the_mask_variant(fake_h200):
    """Causal and windowed calls compile the windowed kernel, whose default is looked up
    under its own key, as is each dtype; the masked default has its own knobs where they
    measured faster (the longest-first order at hd32, not at hd128;
    policy.SM90A_WGMMA_KNOBS)."""
    device = H200
    causal = dataclasses.replace(problem(4096), window=(-1, 0))
    chosen = dispatch.config_for(device, causal)
    assert chosen == policy.default_for("sm_90a", 128, windowed=True, seqlen=4096)
    # From 2k to below 8k masked queries (hd64/128; hd192/256 at every length) lazy
    # rescaling, at hd128 without the warpgroups' turns and with O rescaled first; not
    # beyond, not plain.
    long = dict(lazy_rescale=True, pingpong=False, rescale_o_before_pv=True)
    assert chosen == policy.default_for("sm_90a", 128, windowed=True).replace(**long)
    for seqlen, in_range in ((1024, False), (2048, True), (8192, False)):
        at = dispatch.config_for(device, dataclasses.replace(causal, seqlen_q=seqlen,
                                                             seqlen_k=seqlen))
        assert (at.lazy_rescale, at.pingpong, at.rescale_o_before_pv) == (
            in_range, not in_range, in_range), seqlen
    chosen_plain = dispatch.config_for(device, problem(4096))
    fp16 = dispatch.config_for(device, problem(4096, torch.float16))
    assert fp16 == policy.default_for("sm_90a", 128, dtype="float16", seqlen=4096).replace(
        cluster_m=2) != ladder.k16
    hd32 = dataclasses.replace(problem(4096), head_dim=32)
    assert dispatch.config_for(device, hd32).block_m == 192
    assert dispatch.config_for(device, dataclasses.replace(hd32, window=(-1, 0))).lpt
    assert not dispatch.config_for(device, hd32).lpt and not chosen.lpt
    # Short masked queries (up to 1k: by length bucket) keep two warpgroups in the per-head
    # order.
    hd64 = dataclasses.replace(problem(4096), head_dim=64, window=(-1, 0))
    for seqlen, rows, lpt in ((1024, 128, False), (1500, 192, True), (2048, 192, True),
                              (16384, 192, True)):
        short = dispatch.config_for(device, dataclasses.replace(hd64, seqlen_q=seqlen))
        assert (short.block_m, short.lpt) == (rows, lpt), seqlen
    # hd64 by length: the static walk in the 2k bucket (it balances here), the counter from
    # 4k, B_c 128 from 8k; an unbalanced static walk goes to the counter.
    for seqlen, batch, dynamic, block_n in ((2048, 4, False, 96), (4096, 4, True, 96),
                                            (8192, 4, True, 128), (2048, 1, True, 96)):
        chosen64 = dispatch.config_for(device, dataclasses.replace(
            hd64, seqlen_q=seqlen, seqlen_k=seqlen, batch=batch))
        assert (chosen64.dynamic_tiles, chosen64.block_n) == (dynamic, block_n), seqlen
    assert dispatch.config_for(device, dataclasses.replace(hd32, seqlen_q=1024)).block_m == 192
    # Cross-attention to at most 80 keys: one 80-key block at hd64/128, unmasked only.
    clip = dataclasses.replace(problem(4096), seqlen_k=77)
    assert dispatch.config_for(device, clip) == chosen_plain.replace(block_n=80, fence_p=True,
                                                                     cluster_m=1)
    assert dispatch.config_for(device, dataclasses.replace(clip, seqlen_k=81)) == chosen_plain
    assert dispatch.config_for(device, dataclasses.replace(clip, window=(-1, 0))).block_n == 128
    assert dispatch.config_for(device, dataclasses.replace(hd32, seqlen_k=77)).block_n == 128
    assert {s.config.block_n for s in policy.default_specs("sm_90a")
            if s.config.fence_p and s.head_dim in (64, 128) and not s.windowed} == {80}
    # An entry tuned on plain attention is not used for masked calls.
    fake_h200.put(KEY, ladder.k06.replace(block_m=128))
    fake_h200.save()
    dispatch.reload_tune_cache()
    assert dispatch.config_for(device, causal) == chosen
    assert dispatch.config_for(device, problem(4096)) == ladder.k06.replace(block_m=128)


def inspected(registers: int, **changes) -> Inspection:
    cfg = ladder.k06.replace(**changes)
    return Inspection(cfg, registers=registers, smem_bytes=cfg.smem_bytes(128))


@pytest.mark.parametrize("item,reason", [
    (Inspection(ladder.k06, error="DSLRuntimeError: boom"), "compile error"),
    (Inspection(ladder.k06, registers=255, stack_bytes=256, spills=True), "register spills"),
    # A few spilled values (the Hopper defaults spill 8-88 B) stay in the search.
    (dataclasses.replace(inspected(255, block_m=128), stack_bytes=88, spills=True), None),
    # 170 KiB of tiles fit an H100 CTA, but only one: 4 warps per SM, under the floor of 8.
    (inspected(128, block_m=128, block_n=256, swizzle="pad8"), "occupancy"),
    # 255 registers round to 256 per thread: two 4-warp CTAs fit 64 K registers, 8 warps.
    (inspected(255), None),
])
def test_prune_reasons_on_h100(item, reason):
    from attnlab.analysis.occupancy import get_spec
    from attnlab.tune.prune import prune_reason

    assert prune_reason(item, get_spec("H100"), min_warps_per_sm=8) == reason


def test_prune_shared_memory_on_a100_and_counts():
    from attnlab.analysis.occupancy import get_spec
    from attnlab.tune.prune import prune

    big = inspected(128, block_m=128, block_n=256, swizzle="pad8")
    assert big.smem_bytes > get_spec("A100").smem_per_cta_optin
    ok = inspected(168)
    survivors, reasons = prune([big, ok, Inspection(ladder.k06, error="x")], get_spec("A100"))
    assert survivors == [ok]
    assert reasons == Counter({"shared memory": 1, "compile error": 1})


@pytest.mark.parametrize("refine", [True, False])
def test_tuning_refines_the_knobs_of_the_best_tile(fake_h200, monkeypatch, refine):
    """The tuning loop times the pruned space, then (``refine``) the best tile's chain counts
    and K/V walks without the default among them, and caches the faster of what it timed."""
    from attnlab.analysis import occupancy
    from attnlab.cli import measure
    from attnlab.tune import search

    default = policy.default_for("sm_90a", 128)
    tile = policy.mma_sync_default_for("sm_90a", 128).replace(block_n=32, row_sum_chains=1)
    rounds = []

    def fake_time(point, base, candidates, *, runs, on_impl=None):
        rounds.append(list(candidates))
        ms = {c: 1.0 - 0.01 * c.row_sum_chains - 0.05 * c.reverse_kv - 0.001 * c.tma_kv_loads
              - 0.0005 * c.interleave_softmax for c in candidates}
        best = min(ms, key=ms.get)
        return search.TuneOutcome(point, base, best, ms[best], 1.5, [])

    monkeypatch.setattr(search, "prune_space", lambda *a, **k: ([tile], {"candidates": 1}))
    monkeypatch.setattr(search, "time_candidates", fake_time)
    monkeypatch.setattr(occupancy, "current_device_spec", lambda: None)
    measure._run_tuning(fake_h200, [4096], 128, "bfloat16", 16384, 2048, 1, 4, 5, False, refine)
    assert rounds[0] == [tile]
    if refine:
        assert rounds[1] == [c for c in knob_neighbours(tile, "sm_90a", 128) if c != default]
        expected = tile.replace(row_sum_chains=8, reverse_kv=True)  # block_n / 4 caps chains
    else:
        assert len(rounds) == 1
        expected = tile
    assert TuneCache().get(KEY) == expected


def test_tuning_causal_entries_prune_and_time_the_masked_kernel(fake_h200, monkeypatch):
    """``tune --mode both``: each mask prunes its own kernel build, is timed on its own problem
    against its own default at that problem's length, and lands under its own key (where
    masked dispatch looks)."""
    from attnlab.analysis import occupancy
    from attnlab.cli import measure
    from attnlab.tune import search

    pruned, timed = [], []

    def fake_prune(*args, windowed=False, **kwargs):
        pruned.append(windowed)
        return [policy.default_for("sm_90a", 64).replace(block_n=64)], {"candidates": 1}

    def fake_time(point, base, candidates, *, runs, on_impl=None):
        timed.append((point.causal, base))
        return search.TuneOutcome(point, base, candidates[0], 1.0, 1.5, [])

    monkeypatch.setattr(search, "prune_space", fake_prune)
    monkeypatch.setattr(search, "time_candidates", fake_time)
    monkeypatch.setattr(occupancy, "current_device_spec", lambda: None)
    measure._run_tuning(fake_h200, [512], 64, "float16", 16384, 2048, 1, 4, 5, False, False,
                        (False, True))
    assert pruned == [False, True]
    # At seq 512 the masked default is the short masked tile, not the 4k one.
    short = policy.default_for("sm_90a", 64, windowed=True, dtype="float16", seqlen=512)
    assert short != policy.default_for("sm_90a", 64, windowed=True, dtype="float16")
    assert timed == [(False, policy.default_for("sm_90a", 64, dtype="float16", seqlen=512)),
                     (True, short)]
    cache = TuneCache()
    tile = policy.default_for("sm_90a", 64).replace(block_n=64)
    for causal in (False, True):
        assert cache.get(TuneKey("NVIDIA H200", "90", "float16", 64, causal, 512)) == tile


def test_tune_rejects_an_unknown_mode():
    from typer.testing import CliRunner

    from attnlab.cli import app

    result = CliRunner().invoke(app, ["tune", "--mode", "diagonal"])
    assert result.exit_code != 0
    assert "--mode" in result.output


def test_masked_calls_draw_tiles_from_the_counter_where_the_static_walk_is_unbalanced(
        fake_h200):
    """A masked hd128 call keeps the persistent grid's static walk where it gives the busiest
    CTA at most ``MAX_IMBALANCE`` of the average, and draws its tiles from the counter
    (``dynamic_tiles``) where it would not (the table's hd128 causal seq 16k, one sequence);
    from seq 4k the three-warpgroup tiles and hd256 always draw from it. Packed sequences,
    whose lengths the host does not know, draw from it with the dense masked tile from the
    4k bucket and with the short one below it (hd256 there: one CTA per tile)."""
    causal = dataclasses.replace(problem(4096), window=(-1, 0))
    static = policy.default_for("sm_90a", 128, True)
    assert static.persistent and not static.dynamic_tiles
    # At 4k queries with ``policy._LONG_MASKED_TILES``'s knobs.
    at_4k = static.replace(lazy_rescale=True, pingpong=False, rescale_o_before_pv=True)
    assert dispatch.config_for(H200, causal) == at_4k
    # From 8k queries hd128 runs one CTA per tile, longest first (FA4's grid); below, an
    # unbalanced static walk goes to the counter (B = 1, H = 2: 32 tiles on 132 SMs).
    long = dataclasses.replace(causal, batch=1, seqlen_q=16384, seqlen_k=16384)
    assert dispatch.config_for(H200, long) == static.replace(
        persistent=False, q_stages=1, lpt=True, l2_section_mb=16)
    few = dataclasses.replace(causal, batch=1, num_heads=2, num_heads_kv=2)
    assert dispatch.config_for(H200, few) == at_4k.replace(dynamic_tiles=True)
    short = dataclasses.replace(causal, head_dim=64, seqlen_q=1024, seqlen_k=1024)
    assert dispatch.config_for(H200, short) == policy.default_for("sm_90a", 64, True,
                                                                  seqlen=1024)
    assert policy.default_for("sm_90a", 64, True, seqlen=1024).block_m == 128
    assert policy.default_for("sm_90a", 64, True, seqlen=2048).block_m == 192
    assert dispatch.config_for(H200, dataclasses.replace(short, batch=1)).dynamic_tiles
    for head_dim in (32, 64, 96, 256):
        chosen = dispatch.config_for(H200, dataclasses.replace(causal, head_dim=head_dim))
        assert chosen == policy.default_for("sm_90a", head_dim, True, seqlen=4096)
        assert chosen.dynamic_tiles
    for head_dim in (64, 128, 256):
        packed = dataclasses.replace(causal, head_dim=head_dim, varlen=True)
        assert dispatch.config_for(H200, packed) == policy.default_for(
            "sm_90a", head_dim, True).replace(dynamic_tiles=True)
        shorter = dispatch.config_for(H200, dataclasses.replace(packed, seqlen_q=2048))
        assert shorter.persistent == shorter.dynamic_tiles == (head_dim != 256)
        assert shorter.q_stages == 1
