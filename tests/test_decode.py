"""Decoding on CPU (issue 21): the kernels cross-compiled for sm_80 and sm_90a and their SASS,
the tile and split choices, and the inputs ``attention_with_kvcache`` refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import attnlab
from attnlab import decode
from attnlab.analysis.resources import read_resources
from attnlab.analysis.sass import disassemble, histogram, parse
from attnlab.compile import compile_spec
from attnlab.config import ConfigError
from attnlab.decode import choose_splits, cluster_merge, decode_tile, serial_merge
from attnlab.kernels.abi import (
    DECODE_WARPS,
    CombineSpec,
    DecodeArgs,
    DecodeSpec,
    spec_from_dict,
)
from attnlab.kernels.common.decode import MERGE_SPLITS, THREADS, FlashDecode
from attnlab.kernels.common.layouts import atom_cols


def test_launch_abi_is_spelled_out_once():
    import inspect

    params = list(inspect.signature(FlashDecode.__call__).parameters)
    assert params == ["self", *DecodeArgs._fields, "stream"]


def test_specs_round_trip():
    for spec in (DecodeSpec("sm_90a", "bfloat16", 128, paged=True, windowed=True, split=True),
                 CombineSpec("sm_80", "float16", 64)):
        assert spec_from_dict(spec.to_dict()) == spec


def test_tiles_fit_shared_memory_and_splits_fill_the_gpu():
    assert decode_tile(128, "sm_90a") == (32, 3)  # three 64 KiB blocks of K and V
    assert decode_tile(128, "sm_80") == (32, 2)   # 163 KiB: two
    assert decode_tile(64, "sm_80") == (32, 3)
    assert decode_tile(256, "sm_80") == (16, 2)
    assert decode_tile(128, "sm_86") == (16, 2)  # 99 KiB: 64-key blocks
    with pytest.raises(ConfigError, match="no decoding tile"):
        decode_tile(256, "sm_86")
    assert choose_splits(8, 256, 132) == 16      # B=1, 8 K/V heads: 128 CTAs, one wave
    assert choose_splits(64, 256, 132) == 2      # not 3: 192 CTAs would take two waves
    assert choose_splits(64, 32, 132) == 1       # half a wave, a short walk: no partials
    h100, h200 = 3.35e12, 4.81e12                # nominal DRAM bytes a second
    assert choose_splits(64, 32, 132, True, h100) == 1  # a paged walk too where DRAM is slow
    assert choose_splits(64, 32, 132, True, h200) == 2  # ... for its SMs, else it keeps two
    assert choose_splits(32, 32, 132) == 4       # a short walk on a quarter wave still splits
    assert choose_splits(512, 256, 132) == 1     # the grid already fills the GPU
    assert choose_splits(8, 4, 132) == 2         # two K/V blocks a split at least
    assert choose_splits(8, 32, 132) == 16       # B=1 x 4k MQA: 16 splits of two blocks
    assert choose_splits(1, 10_000, 132) == 64   # capped
    # B = 1 MQA paged where the DRAM outruns half the SMs' paged CTAs: the whole wave, while
    # every split walks four blocks (1 x 64k); 1 x 32k keeps 64 splits of two.
    assert choose_splits(1, 1024, 132, True, h200) == 128
    assert choose_splits(1, 512, 132, True, h200) == 128
    assert choose_splits(1, 256, 132, True, h200) == 64
    assert choose_splits(1, 1024, 132, True, h100) == 64
    assert choose_splits(1, 1024, 132, False, h200) == 64
    assert choose_splits(2, 1024, 132, True, h200) == 64   # 128 CTAs already: unchanged


def test_short_walks_merge_in_the_decoding_kernel():
    # B = 1 x 4k GQA (16 splits of 2 blocks) and MQA (32 of 1): host-bound calls, one launch.
    assert serial_merge(16, 32) and serial_merge(32, 32)
    assert not serial_merge(1, 32)               # nothing to merge
    assert not serial_merge(16, 256)             # 8 x 32k MQA: 16 blocks a split
    assert not serial_merge(128, 256)            # 1 x 32k MQA: 128 partials for one CTA


def test_splits_merge_in_clusters_that_run_side_by_side():
    assert cluster_merge(2, 64, 132, "sm_90a")       # 64 x 4k MQA paged: 64 clusters of 2
    assert not cluster_merge(2, 67, 132, "sm_90a")   # past one wave
    assert cluster_merge(8, 8, 132, "sm_90a")        # 8 clusters of 8: half a wave
    assert not cluster_merge(4, 32, 132, "sm_90a")   # 32 clusters of 4: not all fit at once
    assert not cluster_merge(16, 1, 132, "sm_90a")   # past the portable cluster size
    assert not cluster_merge(2, 64, 132, "sm_80")    # no clusters before sm_90
    assert not cluster_merge(1, 64, 132, "sm_90a")   # nothing to merge
    assert not cluster_merge(2, 64, 132, "sm_90a", enabled=False)


# (arch, head dim, knobs): the variants a call can pick.
COMPILED = [("sm_80", 64, {}), ("sm_80", 128, {"paged": True, "windowed": True}),
            ("sm_90a", 128, {"split": True, "batch_idx": True, "kv_stages": 3}),
            ("sm_90a", 256, {"paged": True, "split": True, "keys_per_warp": 16}),
            ("sm_90a", 96, {"windowed": True}),
            ("sm_90a", 128, {"paged": True, "split": True, "v_strides": True}),
            ("sm_90a", 128, {"split": True, "serial_merge": True, "kv_stages": 3}),
            ("sm_80", 64, {"paged": True, "split": True, "serial_merge": True}),
            ("sm_90a", 128, {"paged": True, "cluster_splits": 16, "kv_stages": 3})]


@pytest.mark.parametrize("arch, head_dim, knobs", COMPILED)
def test_kernels_cross_compile_without_spills(arch, head_dim, knobs, tmp_path):
    """Per K/V block: S (16 rows x the warp's keys x D) and P V (16 x D x keys) in m16n8k16
    MMAs, K and V gathered by 16-byte cp.async (one per thread per 8 columns of a row), no
    local memory."""
    spec = DecodeSpec(arch, "bfloat16", head_dim, **knobs)
    art = compile_spec(spec, tmp_path)
    text = disassemble(art.cubin)
    ops = histogram(parse(text))
    keys = spec.keys_per_warp
    # S: keys / 8 n-tiles x D / 16 k-steps; P V: D / 8 x keys / 16 (one loop body).
    assert ops["HMMA"] == keys * head_dim // 64
    copies_per_block = 2 * keys * DECODE_WARPS * head_dim // 8 // (32 * DECODE_WARPS)
    # A block's loads per prologue stage and the loop's, then Q's few and the length's.
    in_code = spec.kv_stages * copies_per_block
    assert in_code < ops["LDGSTS"] <= in_code + 5
    res = read_resources(art.cubin, text)
    assert not res.spills and res.registers <= 255, res


@pytest.mark.parametrize("knobs", [{"split": True}, {"batch_idx": True},
                                   {"paged": True, "split": True}, {"windowed": True}])
def test_first_blocks_are_copied_before_the_length_is_back(knobs, tmp_path):
    """A contiguous cache's splits interleave their blocks, so without a window a split's
    first ``kv_stages - 1`` blocks' copies are all issued before the first wait for a copy
    (``DEPBAR``), the length by its own 4-byte copy, no global load but the cache row's
    before it. A paged cache or a window loads the length before any block's copy."""
    spec = DecodeSpec("sm_90a", "bfloat16", 128, **knobs)
    listing = parse(disassemble(compile_spec(spec, tmp_path).cubin))
    wait = next(n for n, i in enumerate(listing) if i.opcode.startswith("DEPBAR"))
    before = [i.opcode for i in listing[:wait]]
    copies_per_block = 2 * spec.keys_per_warp * DECODE_WARPS * 128 // 8 // THREADS
    q_copies = 16 * 128 // 8 // THREADS
    if spec.paged or spec.windowed:
        first_load = next(n for n, op in enumerate(before) if op.startswith("LDG."))
        assert sum(op.startswith("LDGSTS") for op in before[:first_load]) <= q_copies
        return
    wide = sum(op.startswith("LDGSTS") and op.endswith(".128") for op in before)
    assert wide == (spec.kv_stages - 1) * copies_per_block + q_copies
    assert sum(op.startswith("LDGSTS") and not op.endswith(".128") for op in before) == 1
    assert sum(op.startswith("LDG.") for op in before) == spec.batch_idx


@pytest.mark.parametrize("arch, head_dim", [("sm_90a", 64), ("sm_90a", 128), ("sm_90a", 256),
                                            ("sm_80", 128), ("sm_80", 256)])
def test_staged_warp_outputs_take_their_stores_without_bank_conflicts(arch, head_dim):
    """After the walk each warp stores its accumulator (8-byte column pairs of 8 rows at once)
    into the K ring for the warps' merge: with the rows padded (``O_PAD``), every half-warp
    phase of a store is one wavefront, where unpadded rows put 4 rows on the same banks; the
    padding stays out where the ring cannot hold it (sm_80 hd256)."""
    from attnlab.analysis.banks import fragment_store_coords, instruction_ways

    kpw, stages = decode_tile(head_dim, arch)
    kernel = FlashDecode(DecodeSpec(arch, "bfloat16", head_dim, keys_per_warp=kpw,
                                    kv_stages=stages, split=True))
    ring = stages * kpw * DECODE_WARPS * head_dim * 2
    assert DECODE_WARPS * 16 * kernel.o_stride * 4 <= ring
    padded = kernel.o_stride > head_dim
    assert padded == ((arch, head_dim) != ("sm_80", 256))
    for col0 in range(0, head_dim, 8):
        store = [(r * kernel.o_stride + c) * 4 for r, c in fragment_store_coords(0, col0)]
        assert max(instruction_ways(store, 8)) == (1 if padded else 4)
# (head dim, knobs): TMA boxes of a block (contiguous), of a page shorter than a block, and
# of a block inside a longer page.
TMA_COMPILED = [(128, {"tma_rows": 128, "split": True}),
                (96, {"tma_rows": 16, "paged": True, "split": True}),
                (256, {"tma_rows": 64, "paged": True, "split": True, "serial_merge": True}),
                (128, {"tma_rows": 128, "batch_idx": True, "windowed": True})]


@pytest.mark.parametrize("head_dim, knobs", TMA_COMPILED)
def test_tma_kernels_bring_k_and_v_in_boxes(head_dim, knobs, tmp_path):
    """With ``tma_rows`` a K/V block comes in block / rows boxes per tensor and swizzle atom's
    columns, at the prologue's ``kv_stages - 1`` issue sites and the loop's; only Q's rows go
    by ``cp.async``; no spill, and fewer registers than the row gathers hold addresses in."""
    keys_per_warp, stages = decode_tile(head_dim, "sm_90a")
    spec = DecodeSpec("sm_90a", "bfloat16", head_dim, keys_per_warp=keys_per_warp,
                      kv_stages=stages, **knobs)
    resources, ops = {}, {}
    for name, kernel in (("tma", spec), ("gathers", dataclasses.replace(spec, tma_rows=0))):
        art = compile_spec(kernel, tmp_path / name)
        text = disassemble(art.cubin)
        resources[name], ops[name] = read_resources(art.cubin, text), histogram(parse(text))
    boxes = keys_per_warp * DECODE_WARPS // spec.tma_rows * head_dim // atom_cols(head_dim)
    assert ops["tma"]["UTMALDG"] == stages * 2 * boxes
    assert ops["tma"]["LDGSTS"] <= 4 < ops["gathers"]["LDGSTS"]
    assert not resources["tma"].spills
    assert resources["tma"].registers < resources["gathers"].registers


def test_tma_boxes_follow_the_pages(monkeypatch):
    """``decode.tma_rows``: off unless ``TMA_KV_LOADS`` on sm_90a; a contiguous cache's whole
    block, a page that divides the block, the block inside a page that holds whole blocks;
    pages that straddle blocks (48 keys) keep the row gathers."""
    assert decode.tma_rows("sm_90a", 128, None) == 0
    monkeypatch.setattr(decode, "TMA_KV_LOADS", True)
    assert decode.tma_rows("sm_80", 128, None) == 0
    assert [decode.tma_rows("sm_90a", 128, page) for page in (None, 16, 32, 48, 64, 128,
                                                              256, 96)] == [
        128, 16, 32, 0, 64, 128, 128, 0]
    assert decode.tma_rows("sm_90a", 64, 256) == 64


def test_k_and_v_share_a_rows_offset_where_their_strides_agree(tmp_path):
    """A paged row's offset (page entry x page stride + row x row stride, 64-bit: at least
    two IMADs) is computed once for K and V unless ``v_strides``: V's own costs at least two
    IMADs more per row a thread copies, at each of the block's copy sites (the prologue's
    ``kv_stages - 1`` and the loop's one)."""
    ops = {}
    for own in (False, True):
        spec = DecodeSpec("sm_90a", "bfloat16", 128, paged=True, split=True, v_strides=own)
        art = compile_spec(spec, tmp_path / str(own))
        ops[own] = histogram(parse(disassemble(art.cubin)))
    # 8 threads copy a row's 64-column swizzle atom (16 bytes each), so a 128-key block
    # is 8 rows per thread.
    rows_per_thread = 128 // (THREADS // 8)
    assert ops[True]["IMAD"] - ops[False]["IMAD"] >= 2 * rows_per_thread * 2
    assert ops[True]["LDGSTS"] == ops[False]["LDGSTS"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_serial_merge_counts_each_split_in_once(arch, tmp_path):
    """With ``serial_merge`` a split counts in by one atomic add behind a release fence and
    (the last) reads the partials back behind an acquire fence; the split kernel for the
    combine has neither, and neither writes more than its partial rows' vectors and LSEs
    (plus, serially, the merged rows' and the counter's reset)."""
    ops = {}
    keys_per_warp, stages = decode_tile(128, arch)
    for serial in (False, True):
        spec = DecodeSpec(arch, "bfloat16", 128, split=True, keys_per_warp=keys_per_warp,
                          kv_stages=stages, serial_merge=serial)
        art = compile_spec(spec, tmp_path / str(serial))
        text = disassemble(art.cubin)
        ops[serial] = histogram(parse(text))
        assert not read_resources(art.cubin, text).spills
    assert ops[True]["ATOMG"] == 1 and "ATOMG" not in ops[False]
    assert ops[True]["MEMBAR"] >= 2 and "MEMBAR" not in ops[False]
    # A merged vector, its row's LSE and the counter's reset, beside the partial's stores.
    assert ops[True]["STG"] - ops[False]["STG"] == 3
    # The merge's loop: a split's LSE and vector for each of MERGE_SPLITS splits, all
    # loaded before the batch's maximum.
    assert ops[True]["LDG"] - ops[False]["LDG"] == 2 * MERGE_SPLITS
    listing = [i.base for i in parse(text)]
    merge = listing[listing.index("ATOMG"):]
    assert merge[:merge.index("FMNMX")].count("LDG") == 2 * MERGE_SPLITS


@pytest.mark.parametrize("splits", [2, 16])
def test_cluster_merge_reads_each_peer_once_and_writes_the_output(tmp_path, splits):
    """With ``cluster_splits`` the CTAs meet at two cluster barriers and, in between, each
    thread reads its items' LSE and 16-byte vector from every peer's shared memory (all
    before the first maximum); the only global stores are the merged vectors and LSEs (no
    partials, no counter)."""
    keys_per_warp, stages = decode_tile(128, "sm_90a")
    spec = DecodeSpec("sm_90a", "bfloat16", 128, keys_per_warp=keys_per_warp,
                      kv_stages=stages, cluster_splits=splits)
    art = compile_spec(spec, tmp_path)
    text = disassemble(art.cubin)
    ops = histogram(parse(text))
    assert not read_resources(art.cubin, text).spills
    assert ops["UCGABAR_ARV"] == ops["UCGABAR_WAIT"] == 2
    # 16 rows x 32 vectors dealt out over splits x 128 threads.
    items = -(-16 * 128 // 4 // (splits * THREADS))
    assert ops["LD"] == 2 * splits * items
    assert ops["STG"] == 2 * items and "ATOMG" not in ops
    listing = [i.base for i in parse(text)]
    merge = listing[listing.index("UCGABAR_WAIT"):]
    assert merge[:merge.index("FMNMX")].count("LD") == 2 * splits


@pytest.mark.parametrize("head_dim", [96, 128, 256])
def test_combine_shares_a_rows_splits_out_over_the_cta(tmp_path, head_dim):
    """A CTA per row: per split of a thread's batch its LSE and one vector, all loaded before
    the first maximum (one round of latency; not told one CTA an SM, ptxas put 6 of 8
    vectors after it), one CTA barrier for the groups' meeting, no spills."""
    from attnlab.kernels.common.decode_combine import SPLITS_BATCH

    art = compile_spec(CombineSpec("sm_90a", "bfloat16", head_dim), tmp_path)
    text = disassemble(art.cubin)
    listing = parse(text)
    ops = histogram(listing)
    assert ops["LDG"] == 2 * SPLITS_BATCH
    assert ops["BAR"] == 1 and ops["STG"] == 2 and "SHFL" not in ops
    opcodes = [i.base for i in listing]
    first_max = opcodes.index("FMNMX")
    assert opcodes[:first_max].count("LDG") == 2 * SPLITS_BATCH
    assert not read_resources(art.cubin, text).spills


def _inputs(**changes):
    q = torch.randn(2, 1, 8, 64, dtype=torch.bfloat16)
    cache = torch.randn(2, 128, 2, 64, dtype=torch.bfloat16)
    args = {"q": q, "k_cache": cache, "v_cache": cache.clone()}
    args.update(changes)
    return args


@pytest.mark.parametrize("changes, kwargs, error, message", [
    ({}, {"num_splits": 129}, ValueError, "num_splits"),
    ({}, {"block_table": torch.zeros(2, 2, dtype=torch.int64)}, TypeError, "int32"),
    ({}, {"block_table": torch.zeros(3, 2, dtype=torch.int32)}, ValueError, "B, max_pages"),
    ({"k_cache": torch.randn(4, 8, 2, 64, dtype=torch.bfloat16),
      "v_cache": torch.randn(4, 8, 2, 64, dtype=torch.bfloat16)},
     {"block_table": torch.zeros(2, 2, dtype=torch.int32)}, ValueError, "page_size"),
    ({}, {"block_table": torch.zeros(2, 2, dtype=torch.int32),
          "cache_batch_idx": torch.zeros(2, dtype=torch.int32)}, ValueError, "pass one"),
    ({}, {"cache_seqlens": torch.zeros(2, dtype=torch.int64)}, ValueError, "int32"),
    ({}, {"cache_seqlens": -1}, TypeError, "cache_seqlens"),
    ({"q": torch.randn(2, 1, 5, 64, dtype=torch.bfloat16)}, {}, ValueError, "multiple"),
    ({"v_cache": torch.randn(2, 64, 2, 64, dtype=torch.bfloat16)}, {}, ValueError,
     "one shape"),
    ({}, {"k": torch.randn(2, 1, 2, 64, dtype=torch.bfloat16)}, ValueError, "both k and v"),
    ({}, {"k": torch.randn(2, 1, 4, 64, dtype=torch.bfloat16),
          "v": torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)}, ValueError, "S_new, Hkv"),
    ({"k_cache": torch.randn(1, 128, 2, 64, dtype=torch.bfloat16),
      "v_cache": torch.randn(1, 128, 2, 64, dtype=torch.bfloat16)}, {}, ValueError,
     "cache_batch_idx"),
    ({}, {}, ValueError, "CUDA"),
])
def test_bad_inputs_are_refused_before_any_kernel(changes, kwargs, error, message):
    with pytest.raises(error, match=message):
        attnlab.attention_with_kvcache(**_inputs(**changes), **kwargs)


def test_inputs_that_require_grad_are_refused_with_a_pointer_to_attention():
    args = _inputs()
    args["q"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        attnlab.attention_with_kvcache(**args)
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA"):
        attnlab.attention_with_kvcache(**args)  # past the grad check: the CPU tensors



def test_fake_decoding_op_gives_the_outputs_torch_compile_sees():
    """``attnlab::attention_kvcache`` on fake CUDA tensors (no GPU): a new contiguous output in
    q's shape and dtype and an fp32 ``[B, Hq, Sq]`` LSE, the caches declared mutated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from attnlab import decode

    schema = torch.ops.attnlab.attention_kvcache.default._schema
    assert [a.name for a in schema.arguments if a.alias_info is not None and
            a.alias_info.is_write] == ["k_cache", "v_cache"]
    with FakeTensorMode():
        q = torch.empty(3, 2, 16, 128, device="cuda", dtype=torch.bfloat16)
        cache = torch.empty(40, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
        table = torch.empty(3, 10, device="cuda", dtype=torch.int32)
        lengths = torch.empty(3, device="cuda", dtype=torch.int32)
        out, lse = decode.attention_kvcache(q, cache, cache, None, None, lengths, None, table,
                                            0.0883, 1 << 30, 0, 0)
        assert (out.shape, out.dtype) == (q.shape, q.dtype) and out.is_contiguous()
        assert (lse.shape, lse.dtype) == ((3, 16, 2), torch.float32)


def test_sm90_kernels_wait_for_the_previous_grid_and_let_the_combine_launch_early(tmp_path):
    """PDL on sm_90a: both kernels begin with ``griddepcontrol.wait`` (ACQBULK) before any
    global read; a split decoding signals its dependents (PREEXIT) once past its walk; no
    such instruction on sm_80."""
    def ops(spec):
        art = compile_spec(spec, tmp_path / spec.label / spec.arch)
        return parse(disassemble(art.cubin))

    split = DecodeSpec("sm_90a", "bfloat16", 128, split=True)
    for spec in (split, CombineSpec("sm_90a", "bfloat16", 128)):
        listing = [i.opcode for i in ops(spec)]
        first_load = min(n for n, op in enumerate(listing) if op.startswith(("LDG", "LDGSTS")))
        assert "ACQBULK" in listing[:first_load], spec
    assert "PREEXIT" in [i.opcode for i in ops(split)]
    for spec in (DecodeSpec("sm_80", "bfloat16", 128, split=True),
                 CombineSpec("sm_80", "bfloat16", 128)):
        assert not {"ACQBULK", "PREEXIT"} & {i.opcode for i in ops(spec)}
