"""Every ladder config cross-compiles for sm_80 and sm_90a with no GPU; its SASS and resources
are what the config says they should be."""

from __future__ import annotations

import re

import pytest

from attnlab import ladder, policy
from attnlab.analysis.overlap import kv_loops, softmax_order
from attnlab.analysis.resources import read_resources
from attnlab.analysis.sass import disassemble, histogram, parse
from attnlab.compile import compile_config
from attnlab.config import SUPPORTED_HEAD_DIMS, ConfigError, FlashConfig

ARCHS = ("sm_80", "sm_90a")
#: Ladder configs assembled with ptxas -O1 because their -O3 build spills at hd128 (the
#: 32-rows-per-warp tile, docs/ladder.md); any change here must be deliberate.
O1_FOR_NO_SPILLS = {"k07", "k08", "k09", "k10", "k11", "k12", "k13", "k14", "k15", "k16"}


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def expected_hmma(cfg: FlashConfig, head_dim: int, windowed: bool = False) -> int:
    """Static m16n8k16 MMAs per warp: S = Q K^T plus O += P V in each copy of the loop body.

    The main loop runs in mask phases, each its own (not unrolled) loop: unmasked blocks and
    masked tail blocks, plus the window's left-edge blocks when windowed; a peeled first
    block (kernel 10) is one more copy.
    """
    m_tiles = cfg.block_m // cfg.num_warps // 16
    s_gemm = m_tiles * (cfg.block_n // 8) * (head_dim // 16)
    o_gemm = m_tiles * (head_dim // 8) * (cfg.block_n // 16)
    bodies = (3 if windowed else 2) + cfg.peel_first_kv_block  # kernel 10: one more copy
    return (s_gemm + o_gemm) * bodies


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(ladder.LADDER))
def test_ladder_config_cross_compiles(name, arch, artifact_dir):
    cfg = ladder.LADDER[name]
    art = compile_config(cfg, arch, dtype="bfloat16", head_dim=128, out_dir=artifact_dir)
    assert art.cubin.stat().st_size > 0
    ptx = art.ptx.read_text()
    assert "mma.sync.aligned.m16n8k16" in ptx and "ldmatrix" in ptx
    assert ("cp.async" in ptx) == cfg.async_copy
    sass_text = disassemble(art.cubin)
    ops = histogram(parse(sass_text))
    # The main loop's phases are real loops (not unrolled): each MMA appears once per phase.
    assert ops["HMMA"] == expected_hmma(cfg, 128)
    assert ops["LDSM"] > 0
    assert (ops["LDGSTS"] > 0) == cfg.async_copy
    assert ops["MUFU"] > 0  # exp2 of the softmax
    res = read_resources(art.cubin, sass_text)
    assert 0 < res.registers <= 255
    assert res.static_shared_bytes <= 1024  # the tiles are dynamic; sm_90 reserves 1 KiB
    assert not res.spills, res  # the issue's target: no ladder config spills
    assert cfg.ptxas_opt_level == (1 if name in O1_FOR_NO_SPILLS else 3)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(O1_FOR_NO_SPILLS))
def test_the_ladder_takes_o1_where_o3_spills(name, arch, artifact_dir):
    """The same PTX assembled with ptxas -O3 spills: the reason these steps take -O1."""
    cfg = ladder.LADDER[name].replace(ptxas_opt_level=3)
    art = compile_config(cfg, arch, head_dim=128, out_dir=artifact_dir)
    res = read_resources(art.cubin)
    assert res.registers == 255 and res.spills, res


#: Lab variant builds that spill under CuTe DSL 4.8 though they did not under 4.3.5, with the
#: stack they take (docs/measurement.md, "CuTe DSL 4.8"): a change either way is news.
LAB_SPILLS = {("persistent", "sm_80"): 48, ("persistent", "sm_90a"): 56}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(ladder.LAB_VARIANTS))
def test_lab_variant_cross_compiles(name, arch, artifact_dir):
    """Every lab variant builds with no spill, plain and windowed (those on kernel 7's
    32-rows-per-warp tile at ptxas -O1, as kernel 7), but the windowed persistent grid."""
    cfg = ladder.LAB_VARIANTS[name]
    assert cfg.ptxas_opt_level == 1
    for windowed in (False, True):
        art = compile_config(cfg, arch, head_dim=128, windowed=windowed, out_dir=artifact_dir)
        res = read_resources(art.cubin)
        assert 0 < res.registers <= 255
        expected = LAB_SPILLS.get((name, arch), 0) if windowed else 0
        assert res.stack_bytes == expected and res.spills == (expected > 0), res


def test_synchronous_copy_uses_ldg_sts(artifact_dir):
    cfg = ladder.k02.replace(async_copy=False)
    ops = histogram(parse(disassemble(
        compile_config(cfg, "sm_80", head_dim=64, out_dir=artifact_dir).cubin)))
    assert ops["LDGSTS"] == 0
    assert ops["LDG"] > 0 and ops["STS"] > 0


def test_fused_softmax_trades_fmul_for_ffma(artifact_dir):
    """Kernel 6: the scale folds into one FFMA per score instead of FMUL + FADD + FMUL."""
    def counts(cfg):
        return histogram(parse(disassemble(
            compile_config(cfg, "sm_80", head_dim=64, out_dir=artifact_dir).cubin)))

    unfused, fused = counts(ladder.k05), counts(ladder.k06)
    cfg = ladder.k05
    scores = cfg.block_m * cfg.block_n // cfg.num_threads  # S elements per thread per tile
    assert fused["FFMA"] >= unfused["FFMA"] + scores // 2
    assert fused["FMUL"] + fused["FADD"] < unfused["FMUL"] + unfused["FADD"] - scores


def test_fp16_and_hd64_compile(artifact_dir):
    art = compile_config(ladder.k07, "sm_90a", dtype="float16", head_dim=64,
                         out_dir=artifact_dir)
    ops = histogram(parse(disassemble(art.cubin)))
    assert ops["HMMA"] == expected_hmma(ladder.k07, 64)


def test_compile_config_caches_on_disk(artifact_dir):
    first = compile_config(ladder.k02, "sm_80", out_dir=artifact_dir)
    mtime = first.cubin.stat().st_mtime_ns
    again = compile_config(ladder.k02, "sm_80", out_dir=artifact_dir)
    assert again.cubin == first.cubin and again.cubin.stat().st_mtime_ns == mtime


def test_compile_config_rejects_bad_problems(artifact_dir):
    with pytest.raises(ValueError, match="head_dim"):
        compile_config(ladder.k02, "sm_80", head_dim=80, out_dir=artifact_dir)
    with pytest.raises(ValueError, match="dtype"):
        compile_config(ladder.k02, "sm_80", dtype="float32", out_dir=artifact_dir)
    with pytest.raises(TypeError, match="FlashConfig"):
        compile_config("k02", "sm_80", out_dir=artifact_dir)


@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
def test_mma_sync_default_of_each_head_dim_compiles_without_spills(head_dim, artifact_dir):
    cfg = policy.mma_sync_default_for("sm_90a", head_dim)
    art = compile_config(cfg, "sm_90a", head_dim=head_dim, out_dir=artifact_dir)
    sass_text = disassemble(art.cubin)
    assert histogram(parse(sass_text))["HMMA"] == expected_hmma(cfg, head_dim)
    assert not read_resources(art.cubin, sass_text).spills


@pytest.mark.parametrize(("head_dim", "windowed", "dtype"), sorted(
    key for key, knobs in policy.SM90_DEFAULT_KNOBS.items() if knobs.get("tma_kv_loads")))
def test_tma_ring_defaults_load_kv_with_no_copy_instruction(head_dim, windowed, dtype,
                                                            artifact_dir):
    """The defaults with the TMA ring: K and V arrive by UTMALDG, so the only cp.async left is
    Q's (16 bytes per copy, a predicated and an unpredicated path); the MMAs are unchanged.
    None spills: below hd128 at -O3 (their cp.async builds spilled 8-88 B), at hd128 at -O1,
    bf16 with the sliced softmax (the whole-tile softmax spills 16-24 B at -O3), fp16 with the
    whole-tile softmax (under CuTe DSL 4.8 its sliced build spills 64 B); fp16 causal hd128 on
    its persistent grid keeps one value in local memory (measured +6 % all the same)."""
    cfg = policy.mma_sync_default_for("sm_90a", head_dim, windowed, dtype)
    art = compile_config(cfg, "sm_90a", dtype=dtype, head_dim=head_dim, windowed=windowed,
                         out_dir=artifact_dir)
    sass_text = disassemble(art.cubin)
    ops = histogram(parse(sass_text))
    q_copies = cfg.block_m * head_dim * 2 // 16 // cfg.num_threads
    assert ops["UTMALDG"] > 0
    assert ops["LDGSTS"] == 2 * q_copies
    assert ops["HMMA"] == expected_hmma(cfg, head_dim, windowed)
    assert cfg.interleave_softmax == (head_dim == 128 and dtype == "bfloat16")
    res = read_resources(art.cubin, sass_text)
    kept = 1 if cfg.persistent and dtype == "float16" else 0
    assert res.spill_stores <= kept and res.spill_loads <= kept, res


def test_hopper_step_is_kernel_16_with_the_tma_ring(artifact_dir):
    """``tma_ring`` changes only the load scheme of kernel 16: the SASS swaps K/V's LDGSTS for
    UTMALDG and keeps the MMAs. Only sm_90 runs it, so the ladder leaves it out on Ampere."""
    cfg = ladder.HOPPER_STEPS["tma_ring"]
    assert ladder.BASES["tma_ring"] == "k16"
    assert cfg == ladder.k16.replace(**ladder.TMA_RING)
    ops = {}
    for name, config in (("k16", ladder.k16), ("tma_ring", cfg)):
        art = compile_config(config, "sm_90a", head_dim=128, out_dir=artifact_dir)
        ops[name] = histogram(parse(disassemble(art.cubin)))
    assert ops["k16"]["UTMALDG"] == 0 < ops["tma_ring"]["UTMALDG"]
    assert ops["tma_ring"]["LDGSTS"] < ops["k16"]["LDGSTS"]
    assert ops["tma_ring"]["HMMA"] == ops["k16"]["HMMA"] == expected_hmma(cfg, 128)
    assert "tma_ring" not in ladder.named_for("sm_80")
    # All but the tall wgmma steps, whose 192 rows and three 128-row K/V stages need 240 KB at
    # hd128.
    assert ladder.named_for("sm_90a") == {name: config for name, config in ladder.NAMED.items()
                                          if not name.startswith("wg_tall")}
    # A tile over the arch's shared memory is left out too (kernel 1's 64x64 tiles fit).
    assert "k01" in ladder.named_for("sm_80", 256)


def test_hopper_ladder_steps_change_one_thing_each(artifact_dir):
    """``attnlab ladder --family sm90``: the wgmma kernel, then one technique per step, each
    against the row before it; at hd64 every step builds without a spill, the overlap adds one
    copy of each GEMM (the first S and the last P V outside the loop), ping-pong only turn
    barriers, the persistent grid no MMA, dropping the turns again only their barriers (and
    moving O's rescale ahead of P V no MMA either, clusters of two only their multicast loads
    and cluster barrier), the third consumer warpgroup only its own
    64-row atom (HGMMA per warpgroup unchanged) and 128 threads (the rescale moved there too,
    the hd64 default until the epilogue's addresses moved after the loop); the row sums
    started from the corrected old sums (the hd64 default) only move O's rescale from after
    the last exponential to under them; a second Q buffer (the hd128 default) only two more
    barriers; the split tail (the hd128 default from 8k) no MMA, an acquire load more."""
    rows = ladder.named_for("sm_90a", 64, "sm90")
    assert list(rows) == ["wgmma", *ladder.WGMMA_STEPS]
    assert not set(ladder.WGMMA_STEPS) & set(ladder.FAMILIES["seeds"])
    # ``attnlab ladder`` labels every row it measures by its step's name.
    assert set(ladder.NAMED) <= set(ladder.STEP_NAMES)
    assert ladder.named_for("sm_80", 64, "sm90") == {}
    assert rows["wg_q2"] == policy.default_for("sm_90a", 128, seqlen=4096)
    assert rows["wg_split_tail"] == policy.default_for("sm_90a", 128)
    assert rows["wg_cluster"] == policy.paired_row_blocks(rows["wg_free"], 128, 4096)
    assert rows["wg_persistent"].replace(correction_first=True, q_stages=2) == \
        policy.default_for("sm_90a", 128, windowed=True)
    assert rows["wg_tall_correction_first"] == policy.default_for("sm_90a", 64)
    ops, orders = {}, {}
    for name, cfg in rows.items():
        art = compile_config(cfg, "sm_90a", head_dim=64, out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        assert not read_resources(art.cubin, sass_text).spills, name
        ops[name] = histogram(parse(sass_text))
        orders[name] = softmax_order(sass_text)
    # The epilogue's addresses built after the loop: ptxas waits for the previous block's
    # P V after some of this block's exponentials, not before the first.
    assert max(orders["wg_tall"].exps_before_pv_wait) == 0 < min(
        orders["wg_tall_late_o"].exps_before_pv_wait)
    gemms = 64 // 16 + 128 // 16
    assert ops["wgmma"]["HGMMA"] == ops["wg_ring3"]["HGMMA"] == 2 * gemms
    assert ops["wg_overlap"]["HGMMA"] == ops["wg_pingpong"]["HGMMA"] == 3 * gemms
    assert ops["wg_pingpong"]["BAR"] == ops["wg_overlap"]["BAR"] + 2 * 2 + 1
    assert ops["wg_persistent"]["HGMMA"] == ops["wg_tall"]["HGMMA"] == 3 * gemms
    assert ops["wg_free"]["HGMMA"] == 3 * gemms
    assert ops["wg_free"]["BAR"] < ops["wg_persistent"]["BAR"]
    assert ops["wg_cluster"]["HGMMA"] == 3 * gemms and ops["wg_cluster"]["BAR"] == ops[
        "wg_free"]["BAR"]
    assert ops["wg_cluster"]["UCGABAR_ARV"] == 1 and "UCGABAR_ARV" not in ops["wg_free"]
    assert ops["wg_q2"]["SYNCS"] == ops["wg_free"]["SYNCS"] + 2
    for op in ("HGMMA", "MUFU", "BAR"):
        assert ops["wg_q2"][op] == ops["wg_free"][op], op
    assert ops["wg_split_tail"]["HGMMA"] == ops["wg_q2"]["HGMMA"]
    assert ops["wg_split_tail"]["LDG"] > ops["wg_q2"]["LDG"]
    assert ops["wg_rescale_first"]["HGMMA"] == 3 * gemms
    assert ops["wg_rescale_first"]["BAR"] == ops["wg_free"]["BAR"]
    assert ops["wg_tall_rescale_first"]["HGMMA"] == ops["wg_tall"]["HGMMA"]
    assert rows["wg_tall"].num_threads == rows["wg_persistent"].num_threads + 128
    # O's 32 multiplies a thread: after the block's last exponential, or under them.
    assert max(orders["wg_tall_late_o"].fmuls_after_last_exp) == 32
    assert max(orders["wg_tall_correction_first"].fmuls_after_last_exp) == 0
    for op in ("HGMMA", "MUFU", "FMUL"):
        assert ops["wg_tall_correction_first"][op] == ops["wg_tall_late_o"][op], op


def _ex2_runs_between_mmas(sass_text: str) -> int:
    """Runs of MUFU.EX2 with an HMMA right before and right after them (other opcodes
    ignored)."""
    marks = "".join("H" if i.base == "HMMA" else "E" for i in parse(sass_text)
                    if i.base == "HMMA" or i.opcode.startswith("MUFU.EX2"))
    return len(re.findall(r"(?<=H)E+(?=H)", marks))


def test_interleaved_softmax_spreads_exp2_over_the_pv_mmas(artifact_dir):
    """``interleave_softmax`` moves work, it adds none: the same HMMAs and exp2s as the ring
    it changes, but the exp2s of each slice sit between the P V MMAs of the slices before,
    in program order that -O1 keeps, and nothing spills."""
    cfg = ladder.HOPPER_STEPS["interleave_softmax"]
    base = ladder.HOPPER_STEPS[ladder.BASES["interleave_softmax"]]
    assert cfg == base.replace(**ladder.INTERLEAVED_SOFTMAX) and cfg.ptxas_opt_level == 1
    ops, runs = {}, {}
    for name, config in (("base", base), ("sliced", cfg)):
        art = compile_config(config, "sm_90a", head_dim=128, out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        ops[name] = histogram(parse(sass_text))
        runs[name] = _ex2_runs_between_mmas(sass_text)
        assert not read_resources(art.cubin, sass_text).spills
    assert ops["sliced"]["HMMA"] == ops["base"]["HMMA"] == expected_hmma(cfg, 128)
    assert ops["sliced"]["MUFU"] == ops["base"]["MUFU"]
    assert runs["sliced"] > 3 * runs["base"], runs


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("windowed", [False, True], ids=["plain", "windowed"])
def test_wgmma_default_is_warpgroup_mmas_fed_by_tma(head_dim, windowed, artifact_dir):
    """The sm_90a default at every head dim: one HGMMA per 16-wide k-step of each GEMM and
    mask phase (a 64 x N atom per warpgroup), plus the intra-warpgroup overlap's first S and
    last P V outside the loop; no mma.sync, ldmatrix or cp.async left; Q/K/V come by TMA and O
    leaves by a TMA store; the producer warpgroup hands its registers over; no spill at -O3
    in the K/V loop, and none at all but where three masked consumer warpgroups walk tiles
    from the counter (hd32, hd96: a 24-32 B frame of the walk's state, stored and loaded
    outside the MMAs; measured +2 to +5% over one CTA per tile without it)."""
    cfg = policy.default_for("sm_90a", head_dim, windowed)
    # Without a length the problem is long: hd64 plain keeps one Q buffer there.
    long_plain = {} if windowed else policy._LONG_PLAIN_TILES.get(head_dim, {})
    assert cfg.wgmma and cfg == ladder.HOPPER_STEPS["wgmma"].replace(
        **policy.SM90A_WGMMA_KNOBS[head_dim, windowed]).replace(**long_plain)
    art = compile_config(cfg, "sm_90a", head_dim=head_dim, windowed=windowed,
                         out_dir=artifact_dir)
    sass_text = disassemble(art.cubin)
    ops = histogram(parse(sass_text))
    bodies = (3 if windowed else 2) + cfg.intra_wg_overlap
    # Turns between the warpgroups everywhere but hd128 unmasked and hd256 (measured faster
    # without); O rescaled under the next S = Q K^T at hd256, masked hd64 and plain hd96;
    # plain hd64 rescales after P V, its epilogue's addresses built after the K/V loop.
    assert cfg.intra_wg_overlap
    assert cfg.pingpong == ((windowed or head_dim != 128) and head_dim != 256)
    assert cfg.rescale_o_before_pv == (head_dim == 256 or (head_dim, windowed) in (
        (64, True), (96, False)))
    assert cfg.late_o_addresses == ((head_dim, windowed) == (64, False))
    assert ops["HGMMA"] == bodies * (head_dim // 16 + cfg.block_n // 16)
    assert ops["HMMA"] == ops["LDSM"] == ops["LDGSTS"] == 0
    assert ops["UTMALDG"] > 0 and ops["UTMASTG"] > 0
    assert ops["USETMAXREG"] == 2
    if windowed:
        # The band's elements selected by bits of a keep mask moved to predicates (R2P),
        # not compared one by one: fewer compares in the kernel than a thread has elements
        # in its two masked bodies (2 rows x B_c / 4 columns each; it was ~3 per element).
        elements = 2 * 2 * cfg.block_n // 4
        assert ops["R2P"] > 0 and ops["ISETP"] < elements
    assert not spills_between_mmas(parse(sass_text))
    resources = read_resources(art.cubin, sass_text)
    framed = windowed and cfg.dynamic_tiles and cfg.num_warps == 12 and head_dim in (32, 96)
    assert resources.stack_bytes <= 32 if framed else not resources.spills, resources


@pytest.mark.parametrize(("head_dim", "seqlen", "stack_bytes"), [
    (64, policy.LONG_MASKED_SEQLEN // 2, 0), (256, policy.LONG_MASKED_SEQLEN // 2, 0),
    (64, policy.MID_MASKED_SEQLEN, 0),
    (64, policy.VERY_LONG_MASKED_SEQLEN, 0), (128, policy.LONG_MASKED_SEQLEN, 0),
    (128, policy.VERY_LONG_MASKED_SEQLEN, 0)])
def test_masked_defaults_by_length_compile_with_their_measured_spills(head_dim, seqlen,
                                                                      stack_bytes, artifact_dir):
    """The masked defaults that depend on the query length: below 2k hd64 (two warpgroups, O
    in FA4's order) and hd256 (B_c 64, lazy rescaling), hd64 in the 2k bucket on the
    static walk, hd64 from 8k at B_c 128 on the counter's grid in FA4's order (row sums from
    the corrected old sums, O rescaled after P V, the epilogue's addresses built after the
    loop: the four values B_c 128 spilled with O rescaled first are gone), hd128 from 2k
    without the warpgroups' turns and with O rescaled first, and hd128 from 8k on one CTA
    per tile: no spills. The tiles in FA4's order wait for P V behind some of the
    softmax's exponentials and leave none of O's multiplies after the last (what they were
    measured faster for, docs/ladder.md, forty-eighth session)."""
    cfg = policy.default_for("sm_90a", head_dim, True, seqlen=seqlen)
    assert cfg != policy.default_for("sm_90a", head_dim, True)
    art = compile_config(cfg, "sm_90a", head_dim=head_dim, windowed=True, out_dir=artifact_dir)
    sass_text = disassemble(art.cubin)
    assert not spills_between_mmas(parse(sass_text))
    resources = read_resources(art.cubin, sass_text)
    assert resources.stack_bytes <= stack_bytes, resources
    fa4_order = all(getattr(cfg, knob) == value for knob, value in policy.FA4_ORDER.items())
    assert fa4_order == (head_dim == 64 and seqlen != policy.MID_MASKED_SEQLEN)
    if fa4_order:
        order = softmax_order(sass_text)
        assert min(order.exps_before_pv_wait) >= 8, order
        assert max(order.fmuls_after_last_exp) == 0, order


@pytest.mark.parametrize("head_dim", [64, 256])
def test_plain_defaults_below_the_long_length_compile_without_spills(head_dim, artifact_dir):
    """The unmasked defaults shorter than ``LONG_PLAIN_SEQLEN`` queries where they differ from
    the long ones (hd64 with Q's second buffer, hd256 at B_c 64): one HGMMA per 16-wide k-step
    of each GEMM, no spill."""
    cfg = policy.default_for("sm_90a", head_dim, seqlen=policy.LONG_PLAIN_SEQLEN // 2)
    assert cfg != policy.default_for("sm_90a", head_dim)
    art = compile_config(cfg, "sm_90a", head_dim=head_dim, out_dir=artifact_dir)
    sass_text = disassemble(art.cubin)
    bodies = 2 + cfg.intra_wg_overlap
    assert histogram(parse(sass_text))["HGMMA"] == bodies * (head_dim // 16 + cfg.block_n // 16)
    assert not read_resources(art.cubin, sass_text).spills


@pytest.mark.parametrize("head_dim", [64, 128])
def test_wgmma_varlen_loads_by_tma_and_stores_rows(head_dim, artifact_dir):
    """Packed sequences on the wgmma kernel: Q/K/V still by TMA (boxes from each sequence's
    first row), O by 16-byte stores of the sequence's rows instead of a TMA store (which would
    write the next sequence's); the MMAs are the dense kernel's; no spill. The packed default
    is the dense one's walk with its tiles drawn from the counter."""
    cfg = policy.default_for("sm_90a", head_dim, varlen=True)
    assert cfg == policy.default_for("sm_90a", head_dim).replace(dynamic_tiles=True,
                                                                 split_tail=False)

    def ops(varlen):
        art = compile_config(cfg, "sm_90a", head_dim=head_dim, varlen=varlen,
                             out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        # The static walk's packed build at hd64 kept an 8-byte frame (stored before the first
        # MMA, loaded after the last); the counter's keeps none.
        assert read_resources(art.cubin, sass_text).stack_bytes == 0
        assert not spills_between_mmas(parse(sass_text))
        return histogram(parse(sass_text))

    dense, packed = ops(False), ops(True)
    assert packed["HGMMA"] == dense["HGMMA"]
    assert packed["UTMALDG"] > 0 and packed["UTMASTG"] == 0 < dense["UTMASTG"]
    assert packed["STG"] >= cfg.block_m * head_dim * 2 // 16 // (cfg.num_warps * 32)


@pytest.mark.parametrize("windowed", [False, True], ids=["plain", "windowed"])
def test_dynamic_tiles_draw_from_the_counter(windowed, artifact_dir):
    """``dynamic_tiles``: the persistent kernel with two atomics (the producer's draw and its
    CTA's count-out) and the counter's reset, the MMAs of the static walk, no spill."""
    cfg = policy.default_for("sm_90a", 128, windowed, seqlen=4096)
    assert cfg.persistent

    def ops(config):
        art = compile_config(config, "sm_90a", head_dim=128, windowed=windowed,
                             out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        assert not read_resources(art.cubin, sass_text).spills
        return histogram(parse(sass_text))

    static, dynamic = ops(cfg.replace(dynamic_tiles=False)), ops(cfg.replace(dynamic_tiles=True))
    assert static["ATOMG"] == 0 and dynamic["ATOMG"] == 2
    assert dynamic["HGMMA"] == static["HGMMA"] and dynamic["STG"] == static["STG"] + 2


@pytest.mark.parametrize("head_dim,windowed,seqlen", [(64, True, 1024), (128, False, None)],
                         ids=["hd64-short-masked", "hd128-plain"])
def test_q_stages_ring_q_beside_the_same_loop(head_dim, windowed, seqlen, artifact_dir):
    """``q_stages=2`` (the policy's at these tiles): Q's ring gets a second stage, so two more
    barriers to initialise, and the loop's MMAs, exponentials and FMAs are the one-stage
    build's; no spill either way."""
    cfg = policy.default_for("sm_90a", head_dim, windowed, seqlen=seqlen)
    assert cfg.q_stages == 2

    def ops(config):
        art = compile_config(config, "sm_90a", head_dim=head_dim, windowed=windowed,
                             out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        assert not read_resources(art.cubin, sass_text).spills
        return histogram(parse(sass_text))

    one, two = ops(cfg.replace(q_stages=1)), ops(cfg)
    assert two["SYNCS"] == one["SYNCS"] + 2
    for opcode in ("HGMMA", "MUFU", "FFMA", "UTMALDG", "UTMASTG"):
        assert two[opcode] == one[opcode], opcode


def spill_free_sass(config: FlashConfig, head_dim: int, out_dir, **problem) -> tuple:
    """The sm_90a build of ``config``: its SASS text and opcode histogram (asserting that
    nothing spills)."""
    art = compile_config(config, "sm_90a", head_dim=head_dim, out_dir=out_dir, **problem)
    sass_text = disassemble(art.cubin)
    assert not read_resources(art.cubin, sass_text).spills
    return sass_text, histogram(parse(sass_text))


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
def test_cluster_multicasts_kv_and_waits_for_the_other_cta(head_dim, artifact_dir):
    """``cluster_m=2`` on the unmasked default: the K and V loads multicast (each CTA issues
    its half of a block for both), Q's stays local; the barriers' initialisation meets at a
    cluster barrier; the consumers' releases reach the other CTA's barriers; the MMAs and
    exponentials of the default, no spill. Masks and packed sequences are refused."""
    cfg = policy.default_for("sm_90a", head_dim, False)
    (alone, ops), (paired, cluster_ops) = (spill_free_sass(config, head_dim, artifact_dir)
                                           for config in (cfg, cfg.replace(cluster_m=2)))
    tma_loads = ops["UTMALDG"]
    assert "MULTICAST" not in alone and "UCGABAR" not in alone
    assert cluster_ops["UTMALDG"] == tma_loads
    # Q's loads are the local ones: one per 64 columns of its rows.
    assert paired.count("UTMALDG.4D.MULTICAST") == tma_loads - head_dim // 64
    assert cluster_ops["UCGABAR_ARV"] == cluster_ops["UCGABAR_WAIT"] == 1
    assert ".RED" not in "".join(line for line in alone.splitlines() if "SYNCS.ARRIVE" in line)
    assert any("SYNCS.ARRIVE" in line and ".RED" in line for line in paired.splitlines())
    for opcode in ("HGMMA", "MUFU", "FFMA"):
        assert cluster_ops[opcode] == ops[opcode], opcode
    for windowed, varlen in ((True, False), (False, True)):
        with pytest.raises(ConfigError, match="cluster_m"):
            compile_config(cfg.replace(cluster_m=2), "sm_90a", head_dim=head_dim,
                           windowed=windowed, varlen=varlen, out_dir=artifact_dir)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_split_tail_adds_only_the_pieces_epilogues(head_dim, artifact_dir):
    """``split_tail`` on the unmasked default: the MMAs and loads unchanged, no spill, a few
    exponentials more (the merge's); the finisher's wait is an acquire load
    (``LDG.E.STRONG.GPU``), the donor's flag a release after a GPU-wide fence. Under a mask or
    on packed sequences it has no effect (the same SASS)."""
    cfg = policy.default_for("sm_90a", head_dim, False)
    (plain, ops), (split, split_ops) = (spill_free_sass(cfg.replace(split_tail=on), head_dim,
                                                        artifact_dir) for on in (False, True))
    for opcode in ("HGMMA", "UTMALDG", "UTMASTG"):
        assert split_ops[opcode] == ops[opcode], opcode
    assert 0 < split_ops["MUFU"] - ops["MUFU"] <= 16
    assert "LDG.E.STRONG.GPU" not in plain and "LDG.E.STRONG.GPU" in split
    assert "MEMBAR.ALL.GPU" not in plain and "MEMBAR.ALL.GPU" in split
    for windowed, varlen in ((True, False), (False, True)):
        builds = [[(ins.predicate, ins.opcode, ins.operands) for ins in parse(spill_free_sass(
            cfg.replace(split_tail=on), head_dim, artifact_dir, windowed=windowed,
            varlen=varlen)[0])] for on in (False, True)]
        assert builds[0] == builds[1]


def spills_between_mmas(instructions) -> list:
    """The local-memory loads and stores between a kernel's first and last HGMMA."""
    mmas = [i for i, ins in enumerate(instructions) if ins.opcode.startswith("HGMMA")]
    return [ins for ins in instructions[mmas[0]:mmas[-1]]
            if ins.opcode.split(".")[0] in ("STL", "LDL")]


def test_wgmma_is_refused_where_it_cannot_run(artifact_dir):
    cfg = ladder.HOPPER_STEPS["wgmma"]
    with pytest.raises(ConfigError, match="needs sm_90a"):
        compile_config(cfg, "sm_80", head_dim=128, out_dir=artifact_dir)
    for bad in ({"tma_kv_loads": False}, {"block_m": 128, "num_warps": 4},
                {"reverse_kv": True}, {"static_strides": True}, {"kv_stages": 5}):
        with pytest.raises(ConfigError):
            cfg.replace(**bad)
    assert not policy.default_for("sm_90", 128).wgmma
    assert ladder.BASES["wgmma"] == "interleave_softmax"
    assert "wgmma" not in ladder.named_for("sm_80")
    with pytest.raises(ConfigError, match="interleave_softmax"):
        cfg.replace(interleave_softmax=True)


def test_tma_kv_loads_are_refused_where_they_cannot_run(artifact_dir):
    cfg = ladder.k16.replace(tma_kv_loads=True)
    with pytest.raises(ConfigError, match="TMA unit of sm_90"):
        compile_config(cfg, "sm_80", head_dim=128, out_dir=artifact_dir)
    with pytest.raises(ConfigError, match="packed .varlen. sequences"):
        compile_config(cfg, "sm_90a", head_dim=128, varlen=True, out_dir=artifact_dir)


@pytest.mark.parametrize("windowed,varlen", [(True, False), (False, True)])
def test_variants_keep_one_main_loop(windowed, varlen, artifact_dir):
    """Causal/window and varlen are compile-time variants of the same kernel: the window adds
    one masked phase (its left edge), and plain attention's binary is not the variant's."""
    cfg = ladder.k06
    plain = compile_config(cfg, "sm_80", head_dim=64, out_dir=artifact_dir)
    variant = compile_config(cfg, "sm_80", head_dim=64, windowed=windowed, varlen=varlen,
                             out_dir=artifact_dir)
    assert variant.cubin != plain.cubin
    ops = histogram(parse(disassemble(variant.cubin)))
    assert ops["HMMA"] == expected_hmma(cfg, 64, windowed)


@pytest.mark.parametrize(("head_dim", "windowed", "dtype"), sorted(
    key for key, knobs in policy.SM90_DEFAULT_KNOBS.items()
    if knobs.get("row_sum_chains", 1) > 1 and not knobs.get("interleave_softmax")))
def test_row_sum_chains_of_the_default(head_dim, windowed, dtype, artifact_dir):
    """The defaults with several row-sum chains add each row's terms once: one FADD fewer per
    row and loop body than ``reduce``'s chain, which starts from 0.0; MMAs unchanged."""
    cfg = policy.mma_sync_default_for("sm_90a", head_dim, windowed, dtype)
    assert cfg.row_sum_chains > 1

    def ops(config):
        art = compile_config(config, "sm_90a", dtype=dtype, head_dim=head_dim,
                             windowed=windowed, out_dir=artifact_dir)
        return histogram(parse(disassemble(art.cubin)))

    chained, single = ops(cfg), ops(cfg.replace(row_sum_chains=1))
    rows = cfg.block_m // cfg.num_warps // 8  # rows of S per thread
    bodies = 3 if windowed else 2
    assert chained["HMMA"] == single["HMMA"] == expected_hmma(cfg, head_dim, windowed)
    assert chained["FADD"] == single["FADD"] - rows * bodies


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("windowed", [False, True], ids=["plain", "windowed"])
def test_wgmma_overlap_and_pingpong_schedules(head_dim, windowed, artifact_dir):
    """``intra_wg_overlap`` runs the first block's S and the last block's P V outside the
    loop bodies (one more copy of each GEMM), with no spill at the default's tile (two or three
    consumer warpgroups); ``pingpong`` adds only named-barrier turns (a sync and an arrive per
    loop body, one arrive to start)."""
    base = policy.default_for("sm_90a", head_dim, windowed).replace(
        intra_wg_overlap=False, pingpong=False, rescale_o_before_pv=False, lazy_rescale=False,
        correction_first=False)
    bodies = 3 if windowed else 2
    k_steps_s, k_steps_pv = head_dim // 16, base.block_n // 16

    def build(**knobs):
        art = compile_config(base.replace(**knobs), "sm_90a", head_dim=head_dim,
                             windowed=windowed, out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        return histogram(parse(sass_text)), read_resources(art.cubin, sass_text)

    plain, _ = build()
    overlap, resources = build(intra_wg_overlap=True)
    assert plain["HGMMA"] == bodies * (k_steps_s + k_steps_pv)
    assert overlap["HGMMA"] == (bodies + 1) * (k_steps_s + k_steps_pv)
    assert not resources.spills, resources
    for knobs in ({}, {"intra_wg_overlap": True}):
        without, _ = build(**knobs)
        with_turns, _ = build(pingpong=True, **knobs)
        assert with_turns["HGMMA"] == without["HGMMA"]
        assert with_turns["BAR"] == without["BAR"] + 2 * bodies + 1


def test_overlap_and_pingpong_are_wgmma_knobs():
    for knob in ("intra_wg_overlap", "pingpong", "fence_p", "rescale_o_before_pv",
                 "lazy_rescale", "correction_first", "try_wait_first"):
        with pytest.raises(ConfigError, match="need wgmma"):
            ladder.k07.replace(**{knob: True})
    with pytest.raises(ConfigError, match="need wgmma"):
        ladder.LAB_VARIANTS["persistent"].replace(dynamic_tiles=True)
    with pytest.raises(ConfigError, match="needs persistent"):
        policy.default_for("sm_90a", 128).replace(persistent=False, dynamic_tiles=True)
    with pytest.raises(ConfigError, match="needs intra_wg_overlap"):
        policy.default_for("sm_90a", 128).replace(intra_wg_overlap=False,
                                                  rescale_o_before_pv=True)
    with pytest.raises(ConfigError, match="needs intra_wg_overlap"):
        policy.default_for("sm_90a", 128).replace(intra_wg_overlap=False, lazy_rescale=True)
    with pytest.raises(ConfigError, match="needs intra_wg_overlap"):
        policy.default_for("sm_90a", 128).replace(intra_wg_overlap=False,
                                                  correction_first=True)
    with pytest.raises(ConfigError, match="needs two or three"):
        policy.default_for("sm_90a", 128).replace(block_m=64, num_warps=4, pingpong=True)
    name = policy.default_for("sm_90a", 128).replace(intra_wg_overlap=True,
                                                     pingpong=True).short_name()
    assert "+intra_wg_overlap+pingpong" in name and "+persistent" in name


@pytest.mark.parametrize("head_dim,block_n", [(192, 112), (256, 80), (192, 96)])
@pytest.mark.parametrize("windowed", [False, True], ids=["plain", "windowed"])
def test_fence_p_issues_each_p_v_gemm_as_one_group(head_dim, block_n, windowed, artifact_dir):
    """At a B_c that is not a power of two ptxas sinks P's conversion in between the P V MMAs
    and opens a warpgroup group (WARPGROUP.ARRIVE) per 16-key k-step; ``fence_p`` pins P
    first, so every GEMM is one group, as at B_c = 64 or 128: the same HGMMAs, the PRMTs of
    the conversion back to the power-of-two count, and no spill (hd256 B_c = 80 masked
    spills without it)."""
    base = policy.default_for("sm_90a", head_dim, windowed).replace(block_n=block_n)
    copies = (3 if windowed else 2) + 1  # the mask phases' bodies and the overlap's prologue
    ops = {}
    for fenced in (False, True):
        art = compile_config(base.replace(fence_p=fenced), "sm_90a", head_dim=head_dim,
                             windowed=windowed, out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        ops[fenced] = histogram(parse(sass_text))
        if fenced:
            assert not read_resources(art.cubin, sass_text).spills
    assert ops[True]["HGMMA"] == ops[False]["HGMMA"] == copies * (head_dim + block_n) // 16
    assert ops[True]["WARPGROUP"] == 2 * 2 * copies  # an ARRIVE and a DEPBAR per GEMM
    assert ops[False]["WARPGROUP"] > ops[True]["WARPGROUP"]
    assert ops[True]["PRMT"] < ops[False]["PRMT"]


@pytest.mark.parametrize(("head_dim", "windowed", "seqlen", "tries"),
                         [(64, False, 4096, True), (128, True, 2048, True),
                          (64, False, 16384, False), (128, True, 16384, False)],
                         ids=["hd64", "hd128_masked", "hd64_long", "hd128_masked_long"])
def test_fp16_defaults_keep_the_waits_retry_out_of_the_kv_loop(head_dim, windowed, seqlen,
                                                                tries, artifact_dir):
    """No K/V loop of an fp16 default holds the ring stage's waiting retry (its sleep), as none
    of the bf16 builds' does. On the static persistent walk with Q in two buffers ptxas lays
    that retry out inside the fp16 K/V loops (fifty-fourth session), so those defaults try a
    stage once before they wait (``try_wait_first``); the others (hd64 unmasked from 8k, hd128
    masked from 8k) keep the retry out without it, and there the try measured slower
    (fifty-fifth session)."""
    config = policy.default_for("sm_90a", head_dim, windowed, "float16", seqlen=seqlen)
    assert config.try_wait_first == tries
    assert not policy.default_for("sm_90a", head_dim, windowed, seqlen=seqlen).try_wait_first
    for try_first in (True, False) if tries else (False,):
        art = compile_config(config.replace(try_wait_first=try_first), "sm_90a",
                             dtype="float16", head_dim=head_dim, windowed=windowed,
                             out_dir=artifact_dir)
        text = disassemble(art.cubin)
        assert not read_resources(art.cubin, text).spills
        loops = kv_loops(text)
        assert len(loops) == (3 if windowed else 2)
        sleeps = [sum(i.base == "NANOSLEEP" for i in body) for body in loops]
        assert sleeps == [0] * len(loops) if try_first == tries else min(sleeps) > 0, sleeps


@pytest.mark.parametrize("head_dim", [128, 256])
def test_rescale_o_before_pv_moves_the_rescale_under_q_k(head_dim, artifact_dir):
    """``rescale_o_before_pv``: O's rescale is issued before each P V instead of after it, so
    the loop bodies keep one rescale each and the last block's P V after the loop gains one:
    D / 2 more FMULs per thread (a warpgroup's 64 x D accumulator over 128 threads; ptxas
    may add a stray one), the same HGMMAs and warpgroup groups, no spill."""
    base = policy.default_for("sm_90a", head_dim)
    ops = {}
    for before in (False, True):
        art = compile_config(base.replace(rescale_o_before_pv=before), "sm_90a",
                             head_dim=head_dim, out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        ops[before] = histogram(parse(sass_text))
        assert not read_resources(art.cubin, sass_text).spills
    assert 0 <= ops[True]["FMUL"] - ops[False]["FMUL"] - head_dim // 2 <= 2
    assert ops[True]["HGMMA"] == ops[False]["HGMMA"]
    assert ops[True]["WARPGROUP"] == ops[False]["WARPGROUP"]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("rescale_first", [False, True], ids=["after_pv", "before_pv"])
def test_lazy_rescale_branches_around_the_o_rescale(head_dim, rescale_first, artifact_dir):
    """``lazy_rescale``: each loop body votes once whether any row of the warp moved its
    maximum and branches around O's D / 2 multiplies (a real branch: no multiply is left
    predicated, so a warp that skips them issues none); the same HGMMAs and exponentials as
    the build without it, no spill."""
    base = policy.default_for("sm_90a", head_dim).replace(rescale_o_before_pv=rescale_first)
    ops = {}
    for lazy in (False, True):
        art = compile_config(base.replace(lazy_rescale=lazy), "sm_90a", head_dim=head_dim,
                             out_dir=artifact_dir)
        sass_text = disassemble(art.cubin)
        ops[lazy] = histogram(parse(sass_text))
        assert not read_resources(art.cubin, sass_text).spills
        if lazy:
            assert not re.search(r"@!?U?P\d+\s+FMUL", sass_text)
    bodies = 2
    assert ops[True]["VOTE"] - ops[False]["VOTE"] == bodies + rescale_first
    assert ops[True]["BRA"] > ops[False]["BRA"]
    assert ops[True]["HGMMA"] == ops[False]["HGMMA"]
    assert ops[True]["MUFU"] == ops[False]["MUFU"]
