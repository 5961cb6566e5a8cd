"""The backward pass on CPU: its config, spec and launch ABI, and every default kernel
cross-compiled for sm_80 and sm_90a within its register budget (issue 20's CPU tests; the
autograd wiring is in tests/test_ops.py, the numbers in tests/test_backward_gpu.py)."""

from __future__ import annotations

import inspect

import pytest

from attnlab.analysis.resources import read_resources
from attnlab.analysis.sass import disassemble, histogram, parse
from attnlab.backward_config import (
    BackwardConfig,
    backward_head_dims,
    default_backward,
    mma_sync_backward_for,
)
from attnlab.compile import compile_spec
from attnlab.config import ConfigError
from attnlab.kernels.abi import BackwardArgs, BackwardSpec, spec_from_dict
from attnlab.kernels.common.backward_walk import BackwardKernel


@pytest.mark.parametrize("knobs, message", [
    ({"block_n": 96}, "16 \\* num_warps"),
    ({"num_warps": 2, "block_n": 32}, "num_warps must be 4 or 8"),
    ({"block_m": 24}, "multiple of 16"),
    ({"q_stages": 3}, "q_stages"),
    ({"dq_warps_m": 3}, "dq_warps_m"),
    ({"wgmma": True, "block_m": 32}, "wgmma needs"),
    ({"wgmma": True, "dq_warps_m": 4}, "wgmma needs"),
    ({"wgmma": True, "block_n": 64, "block_m": 128}, "wgmma needs"),
    ({"producer_warp": True}, "producer_warp needs wgmma"),
    ({"kv_warps_n": 3}, "kv_warps_n must be"),
    ({"kv_warps_n": 2, "wgmma": True}, "kv_warps_n is the mma.sync"),
    ({"kv_warps_n": 2, "block_m": 16}, "must split into 2 warps"),
    ({"dq_first": True, "wgmma": True}, "dq_first orders the mma.sync"),
])
def test_bad_configs_say_why(knobs, message):
    with pytest.raises(ConfigError, match=message):
        BackwardConfig(**knobs)


def test_problems_a_config_cannot_serve():
    with pytest.raises(ConfigError, match="backward serves head dims"):
        BackwardConfig().check_problem(80)
    for config in (BackwardConfig(), BackwardConfig(wgmma=True)):
        with pytest.raises(ConfigError, match="the warps must split the head dim"):
            config.check_problem(256, "sm_90a")
    with pytest.raises(ConfigError, match="no backward tile at head_dim=256 fits"):
        default_backward(256, "sm_86")
    with pytest.raises(ConfigError, match="wgmma needs sm_90a"):
        BackwardConfig(wgmma=True).check_problem(128, "sm_80")
    with pytest.raises(ConfigError, match="shared memory"):
        BackwardConfig(wgmma=True, block_m=128).check_problem(128, "sm_90a")


def test_defaults_per_arch():
    for arch in ("sm_80", "sm_86", "sm_90a"):
        for head_dim in backward_head_dims(arch):
            config = default_backward(head_dim, arch)
            assert config.wgmma == (arch == "sm_90a")
            # Above hd128 the warps split the head dim (dK and dV would not fit); on sm_80 at
            # hd64 and hd128, FA2's two-dimensional layout does (packed: not).
            assert config.split_head_dim == (head_dim > 128 or (
                arch == "sm_80" and head_dim in (64, 128))), (arch, head_dim)
            assert not default_backward(head_dim, arch, varlen=True).kv_warps_n
            assert not default_backward(head_dim, arch, deterministic=True).kv_warps_n
            config.check_problem(head_dim, arch)
    assert backward_head_dims("sm_80") == backward_head_dims("sm_90a") == (
        32, 64, 96, 128, 192, 256)
    assert backward_head_dims("sm_86") == (32, 64, 96, 128, 192)
    # hd256: one ring stage, or dQ's fp32 staging would not fit beside two.
    assert (default_backward(192, "sm_90a").q_stages, default_backward(256, "sm_90a").q_stages
            ) == (2, 1)
    assert default_backward(64, "sm_90a").block_m == 128
    assert default_backward(128, "sm_90a").block_m == 64
    assert default_backward(128, "sm_90a").producer_warp
    # hd128's mma.sync tile: -O1 where a mask adds its registers, -O3 without (step 19).
    assert (default_backward(128, "sm_80").ptxas_opt_level,
            default_backward(128, "sm_80", windowed=True).ptxas_opt_level) == (3, 1)
    # Longest first under a mask on either kernel (step 19 for mma.sync).
    assert all(default_backward(hd, arch).lpt for hd in (64, 128, 192)
               for arch in ("sm_80", "sm_86", "sm_90a"))


def test_producer_warp_adds_a_warpgroup_and_a_second_ds_tile():
    plain = BackwardConfig(wgmma=True)
    fed = plain.replace(producer_warp=True)
    assert (plain.launch_threads, fed.launch_threads) == (256, 384)
    assert (plain.ds_stages, fed.ds_stages) == (1, 2)
    # A second dS^T tile (128 x 64 x 2 bytes), L and D stages of 96 floats, the barriers.
    assert fed.smem_bytes(128) - plain.smem_bytes(128) == 16384 + 2 * 4 * 32 * 2 + 32
    assert "producer_warp" in fed.short_name()


def test_spec_round_trips_and_names_its_variant():
    spec = BackwardSpec(BackwardConfig(wgmma=True), "sm_90a", "bfloat16", 128, True, True, True)
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec.variant() == "_win_varlen_det"
    assert "wgmma" in spec.config.short_name()


def test_launch_abi_is_spelled_out_once():
    params = list(inspect.signature(BackwardKernel.__call__).parameters)
    assert params == ["self", *BackwardArgs._fields, "stream"]


# (arch, head dim, windowed, varlen, deterministic): each default kernel, plain, and its
# masked packed variants at the largest head dim (the most registers).
COMPILED = [(arch, hd, False, False, False) for arch in ("sm_80", "sm_90a")
            for hd in backward_head_dims(arch)]
COMPILED += [(arch, 128, True, True, det) for arch in ("sm_80", "sm_90a") for det in (0, 1)]
# B_r = 128 with a mask: the most live registers of the producer-warp kernel, and with
# packed sequences or the deterministic turn beside it.
COMPILED += [("sm_90a", 64, True, False, False), ("sm_90a", 64, False, False, True)]
COMPILED += [("sm_90a", 64, True, True, det) for det in (0, 1)]
# The warpgroups split the head dim: masked, packed and deterministic at the largest.
COMPILED += [("sm_90a", 256, True, True, det) for det in (0, 1)]


@pytest.mark.parametrize("arch, head_dim, windowed, varlen, deterministic", COMPILED)
def test_default_kernels_cross_compile_within_their_registers(arch, head_dim, windowed, varlen,
                                                      deterministic, tmp_path):
    config = default_backward(head_dim, arch, varlen, bool(deterministic), windowed)
    spec = BackwardSpec(config, arch, "bfloat16", head_dim, windowed, varlen,
                        bool(deterministic))
    art = compile_spec(spec, tmp_path)
    text = disassemble(art.cubin)
    ops = histogram(parse(text))
    bodies = 3 if windowed else 2
    if config.producer_warp:
        # Q, dO, L and D by TMA; no cp.async on the ring (K and V only).
        assert ops["UTMALDG"] >= 4
    if config.wgmma:
        # Per loop body: S^T and dP^T (D / 16 k-steps each), dV and dK (B_r / 16), dQ
        # (B_c / 16), per warpgroup; dQ leaves by TMA reduce-adds (a box or two per warp).
        per_body = 2 * head_dim // 16 + 2 * config.block_m // 16 + config.block_n // 16
        assert ops["HGMMA"] == per_body * bodies
        assert ops["UTMAREDG"] >= bodies and ops["LDSM"] == 0 and ops["RED"] == 0
        # dS^T (and P^T when it goes to shared memory too) by stmatrix (step 17).
        assert ops["STSM"] >= bodies
        # 9-10 warpgroup fences and waits per body; where ptxas serializes a wgmma (P^T
        # converted value by value, step 18) 64 per body.
        assert ops["WARPGROUP"] <= 10 * bodies, ops["WARPGROUP"]
    else:
        assert ops["HMMA"] > 0 and ops["LDSM"] > 0 and ops["RED"] > 0
    res = read_resources(art.cubin, text)
    assert 0 < res.registers <= 255
    if config.producer_warp:
        # The MMA warpgroups get 240 registers each (setmaxnreg; the producer keeps 24).
        assert res.registers == 168, res
    # Spill-free since step 18 (before: B_r = 128 kept 1 value plain, 17 masked).
    assert not res.spills, res


@pytest.mark.parametrize("head_dim, deterministic", [(64, False), (128, False), (128, True)])
def test_sm80_defaults_in_fp16_spill_nothing(head_dim, deterministic, tmp_path):
    """The sm_80 defaults in fp16 (their bf16 builds are above), at 255 registers: the
    two-dimensional tiles spilled 1-8 values before step 18 (hd128's masked builds now at
    -O1, ``FULL_TILE_OPT_LEVEL``; its plain ones at -O3); hd128's deterministic turn spilled
    5-17 at B_r = 64 and takes B_r = 32."""
    for windowed in (False, True):
        config = default_backward(head_dim, "sm_80", deterministic=deterministic,
                                  windowed=windowed)
        assert (config.kv_warps_n == 2) != deterministic
        art = compile_spec(BackwardSpec(config, "sm_80", "float16", head_dim, windowed, False,
                                        deterministic), tmp_path)
        assert not read_resources(art.cubin, disassemble(art.cubin)).spills


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_two_dimensional_warp_layout_reads_less_shared_memory(arch, tmp_path):
    """The hd128 default's ``kv_warps_n=2`` (FA2's warp layout: pairs of warps share 32 key
    rows and split B_r and D): within sm_80's shared memory, no spills, and fewer
    ``ldmatrix`` than the one-dimensional layout, whose every warp reads all of Q_i and
    dO_i."""
    loads = {}
    for config in (default_backward(128, "sm_80"), BackwardConfig(kv_warps_n=1)):
        config.check_problem(128, arch)
        art = compile_spec(BackwardSpec(config, arch, "bfloat16", 128, False, False, False),
                           tmp_path)
        text = disassemble(art.cubin)
        assert not read_resources(art.cubin, text).spills
        loads[config.split_head_dim] = histogram(parse(text))["LDSM"]
    assert loads[True] <= 0.85 * loads[False], loads


def test_mma_sync_kernel_on_sm90_adds_dq_in_column_pairs(tmp_path):
    """The mma.sync kernel built for sm_90a adds dQ by ``red.global.add.v2.f32``: one
    reduce per pair of neighbouring columns (half the L2 operations of scalar reduces,
    docs/backward.md step 15); for sm_80, which has no vector reduce, one per value."""
    config = default_backward(128, "sm_80")
    values = config.block_m * 128 // config.num_threads
    for arch, opcode, per_value in (("sm_90a", "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU", 2),
                                    ("sm_80", "RED.E.ADD.F32.FTZ.RN.STRONG.GPU", 1)):
        spec = BackwardSpec(config, arch, "bfloat16", 128, False, False, False)
        ops = [i.opcode for i in parse(disassemble(compile_spec(spec, tmp_path).cubin))]
        reduces = [op for op in ops if op.startswith("RED")]
        # Two loop bodies (blocks with and without a mask).
        assert reduces == [opcode] * (2 * values // per_value), (arch, sorted(set(reduces)))


@pytest.mark.parametrize("arch, head_dim, varlen, with_dlse", [
    ("sm_80", 128, True, False), ("sm_90a", 64, False, True), ("sm_90a", 96, False, False)])
def test_preprocess_kernel_shares_rows_between_lanes(arch, head_dim, varlen, with_dlse,
                                                     tmp_path):
    """A row split over ``lanes_per_row`` threads: per thread one 16-byte load of dO and of O
    and two 16-byte zero stores to dq_accum per 16-byte chunk it owns, the lanes' partial
    sums added by butterfly shuffles, and one lane's two fp32 stores (D and L)."""
    from attnlab.kernels.abi import PreprocessSpec
    from attnlab.kernels.common.bwd_preprocess import CHUNK, lanes_per_row

    spec = PreprocessSpec(arch, "bfloat16", head_dim, varlen, with_dlse)
    assert spec_from_dict(spec.to_dict()) == spec
    lanes = lanes_per_row(head_dim)
    chunks = head_dim // CHUNK // lanes
    assert lanes * chunks * CHUNK == head_dim and lanes & (lanes - 1) == 0
    ops = [i.opcode for i in parse(disassemble(compile_spec(spec, tmp_path).cubin))]
    assert ops.count("LDG.E.128") == 2 * chunks
    assert ops.count("STG.E.128") == 2 * chunks
    assert ops.count("STG.E") == 2
    assert ops.count("SHFL.BFLY") == lanes.bit_length() - 1


def test_preprocess_lanes_per_row():
    from attnlab.kernels.common.bwd_preprocess import lanes_per_row

    assert {hd: lanes_per_row(hd) for hd in (32, 64, 96, 128, 192, 256)} == {
        32: 4, 64: 8, 96: 4, 128: 16, 192: 8, 256: 16}


def test_warm_covers_every_default_backward_kernel():
    """``attnlab cache --warm`` compiles what a training step runs by default."""
    from attnlab.kernels.abi import PreprocessSpec
    from attnlab.policy import default_backward_specs

    for arch in ("sm_80", "sm_90a"):
        specs = default_backward_specs(arch)
        assert len(specs) == len(set(specs))
        backward = [s for s in specs if isinstance(s, BackwardSpec)]
        assert {(s.head_dim, s.dtype, s.windowed, s.varlen) for s in backward} == {
            (hd, dt, w, v) for hd in backward_head_dims(arch) for dt in ("float16", "bfloat16")
            for w in (False, True) for v in (False, True)}
        assert all(s.config == default_backward(s.head_dim, arch, s.varlen, windowed=s.windowed)
                   for s in backward)
        assert sum(isinstance(s, PreprocessSpec) for s in specs) == len(backward)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mma_sync_backward_on_hopper_takes_fa2s_gemm_order(dtype):
    """The sm80 path of an H100 adds dQ before dK (``dq_first``) at hd64 and at hd128 in
    bf16 without a mask (where it measured faster); sm_80 keeps its measured default."""
    for head_dim in (64, 128):
        for windowed in (False, True):
            hopper = mma_sync_backward_for("sm_90a", head_dim, windowed, dtype)
            ampere = mma_sync_backward_for("sm_80", head_dim, windowed, dtype)
            assert ampere == default_backward(head_dim, "sm_80", windowed=windowed)
            expected = head_dim == 64 or (dtype == "bfloat16" and not windowed)
            assert hopper.dq_first == expected
            assert hopper.replace(dq_first=False) == ampere


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dq_first_interleaves_dqs_adds_with_dks_mmas(head_dim, tmp_path):
    """With ``dq_first`` the unmasked body's dQ reduce-adds (no row check: its query blocks
    lie inside the sequence) are issued between dK's HMMAs; in the other order they all
    follow the body's last HMMA. Both build without spills in bf16."""
    tails = {}
    for dq_first in (False, True):
        config = mma_sync_backward_for("sm_90a", head_dim).replace(dq_first=dq_first)
        art = compile_spec(BackwardSpec(config, "sm_90a", "bfloat16", head_dim, False, False,
                                        False), tmp_path)
        text = disassemble(art.cubin)
        assert not read_resources(art.cubin, text).spills
        ops = [i.opcode for i in parse(text)]
        first_red = next(i for i, op in enumerate(ops) if op.startswith("RED"))
        # MMAs of the body between its first reduce-add and the next body.
        last_red = max(i for i, op in enumerate(ops[:first_red + 400]) if op.startswith("RED"))
        tails[dq_first] = sum(op.startswith("HMMA") for op in ops[first_red:last_red])
    assert tails[False] == 0 and tails[True] > 0, tails
