"""FlashConfig: every construction rule rejects, valid configs build, problem checks."""

from __future__ import annotations

import dataclasses

import pytest

from attnlab import ladder, policy
from attnlab.config import SMEM_CAPACITY, ConfigError, FlashConfig

#: The plainest config the rules allow: kernel 1 of the ladder with every later knob off.
PLAIN = dict(
    async_copy=False,
    swizzle="none",
    eager_kv_loads=False,
    q_frags_per_load=0,
    k_frags_per_load=0,
    v_frags_per_load=0,
    double_buffer_smem_to_rf=False,
    fused_softmax=False,
)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"block_m": 64.0}, "block_m must be a positive int"),
        ({"block_m": True}, "block_m must be a positive int"),
        ({"block_m": 0}, "block_m must be a positive int"),
        ({"block_n": -16}, "block_n must be a positive int"),
        ({"num_warps": "4"}, "num_warps must be a positive int"),
        ({"num_warps": 3}, "num_warps must be one of 1, 2, 4, 8"),
        ({"num_warps": 16, "block_m": 256}, "num_warps must be one of 1, 2, 4, 8"),
        ({"block_m": 48}, r"block_m=48 must be a multiple of 16 \* num_warps = 64"),
        ({"block_m": 64, "num_warps": 8}, r"multiple of 16 \* num_warps = 128"),
        ({"block_n": 24}, "block_n must be a multiple of 16 up to 256, got 24"),
        ({"block_n": 272}, "block_n must be a multiple of 16 up to 256, got 272"),
        ({"block_m": 320}, "block_m must be at most 256, got 320"),
        ({"swizzle": "diagonal"}, "swizzle must be one of"),
        ({"q_frags_per_load": 1}, "q_frags_per_load must be 0"),
        ({"k_frags_per_load": -2}, "k_frags_per_load must be 0"),
        ({"v_frags_per_load": 2.0}, "v_frags_per_load must be 0"),
        ({"v_frags_per_load": 6}, r"v_frags_per_load=6 must divide block_n / 8 = 8"),
        ({"v_frags_per_load": 4, "block_n": 48}, r"must divide block_n / 8 = 6"),
        ({"async_copy": False}, "eager_kv_loads needs async_copy"),
        ({"d_head_tile": 24}, "d_head_tile must be 0 .* or a positive multiple of 16"),
        ({"d_head_tile": -16}, "d_head_tile must be 0"),
        ({"d_head_tile": True}, "d_head_tile must be 0"),
        ({"ptxas_opt_level": 4}, "ptxas_opt_level must be 0, 1, 2 or 3, got 4"),
        ({"ptxas_opt_level": True}, "ptxas_opt_level must be 0, 1, 2 or 3"),
        ({"row_sum_chains": 0}, r"row_sum_chains must be an int from 1 to block_n / 4 = 16"),
        ({"row_sum_chains": 17}, "row_sum_chains must be an int from 1 .* got 17"),
        ({"row_sum_chains": 8, "block_n": 16}, r"from 1 to block_n / 4 = 4 .*got 8"),
        ({"row_sum_chains": 2.0}, "row_sum_chains must be an int"),
        ({"row_sum_chains": True}, "row_sum_chains must be an int"),
        ({"tma_kv_loads": True, "eager_kv_loads": False}, "tma_kv_loads needs eager_kv_loads"),
        ({"tma_kv_loads": True, "swizzle": "pad8"}, "tma_kv_loads needs .* the xor swizzle"),
        ({"cluster_m": 2}, "cluster_m .* need wgmma"),
        (
            {"q_frags_per_load": 0, "k_frags_per_load": 0, "v_frags_per_load": 0},
            "double_buffer_smem_to_rf needs at least one sub-tiled operand",
        ),
    ],
)
def test_invalid_config_rejected(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FlashConfig(**changes)


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        PLAIN,
        {**PLAIN, "block_m": 128, "num_warps": 8},
        {**PLAIN, "block_m": 16, "block_n": 16, "num_warps": 1},
        {"block_m": 128, "block_n": 32, "swizzle": "pad8", "v_frags_per_load": 4},
        {"block_m": 256, "block_n": 256, "k_frags_per_load": 8, "v_frags_per_load": 32},
        {**PLAIN, "async_copy": True, "eager_kv_loads": True},
    ],
)
def test_valid_config_builds(kwargs: dict[str, object]) -> None:
    config = FlashConfig(**kwargs)
    for name, value in kwargs.items():
        assert getattr(config, name) == value
    assert config.num_threads == 32 * config.num_warps


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        FlashConfig().block_m = 128  # type: ignore[misc]


def test_replace_validates_and_keeps_the_rest() -> None:
    config = FlashConfig(block_m=128)
    assert config.replace(block_n=32) == FlashConfig(block_m=128, block_n=32)
    with pytest.raises(ConfigError, match="eager_kv_loads needs async_copy"):
        config.replace(async_copy=False)


def test_short_name_default() -> None:
    assert FlashConfig().short_name() == (
        "(64, 64, 4): async+eager+swizzled+load_0_2_2_fragments+buffer+opt_softmax"
    )


def test_short_name_plain_and_pad8() -> None:
    assert FlashConfig(**PLAIN, block_m=128, num_warps=8).short_name() == (
        "(128, 64, 8): load_0_0_0_fragments"
    )
    padded = FlashConfig(**{**PLAIN, "swizzle": "pad8", "k_frags_per_load": 4})
    assert padded.short_name() == "(64, 64, 4): pad8+load_0_4_0_fragments"


@pytest.mark.parametrize("kwargs", [{}, PLAIN, {"block_m": 128, "swizzle": "pad8"}])
def test_dict_round_trip(kwargs: dict[str, object]) -> None:
    config = FlashConfig(**kwargs)
    data = config.to_dict()
    assert set(data) == {f.name for f in dataclasses.fields(FlashConfig)}
    assert FlashConfig.from_dict(data) == config


def test_from_dict_rejects_unknown_keys() -> None:
    data = {**FlashConfig().to_dict(), "block_k": 32}
    with pytest.raises(ConfigError, match=r"unknown config keys: \['block_k'\]"):
        FlashConfig.from_dict(data)


def test_from_dict_validates_values() -> None:
    data = {**FlashConfig().to_dict(), "num_warps": 3}
    with pytest.raises(ConfigError, match="num_warps must be one of"):
        FlashConfig.from_dict(data)


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("arch", sorted(SMEM_CAPACITY))
def test_default_config_serves_supported_problems(head_dim: int, arch: str) -> None:
    FlashConfig().check_problem(head_dim, arch)


@pytest.mark.parametrize("head_dim", [16, 40, 80, 136, 264])
def test_check_problem_rejects_unsupported_head_dim(head_dim: int) -> None:
    with pytest.raises(ConfigError, match=rf"head_dim={head_dim} is not supported.*"
                                          r"\(32, 64, 96, 128, 192, 256\)"):
        FlashConfig().check_problem(head_dim)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
def test_check_problem_accepts_supported_head_dims(head_dim: int) -> None:
    FlashConfig(block_m=64, block_n=64).check_problem(head_dim)


def test_d_head_tile_must_divide_head_dim() -> None:
    config = FlashConfig(d_head_tile=64)
    config.check_problem(128)
    with pytest.raises(ConfigError, match="d_head_tile=64 must divide head_dim=96"):
        config.check_problem(96)


def test_check_problem_rejects_smem_overflow() -> None:
    config = FlashConfig(block_m=256, block_n=256)
    # (256 + 2 * 256) rows * 128 halves * 2 bytes = 196608 > 163 KiB.
    assert config.smem_bytes(128) == 196608
    with pytest.raises(ConfigError, match=r"needs 196608 bytes .* sm_80 allows 166912"):
        config.check_problem(128, "sm_80")
    config.check_problem(128, "sm_90a")  # 227 KiB is enough
    config.check_problem(64, "sm_80")  # and so is half the head dim


def test_smem_capacity_depends_on_arch() -> None:
    # 128 + 2 * 128 rows * 128 halves * 2 bytes = 98304: fits sm_86 (99 KiB) ...
    FlashConfig(block_m=128, block_n=128).check_problem(128, "sm_86")
    # ... but pad8 rows of 136 halves (104448 bytes) do not, while sm_80 still has room.
    padded = FlashConfig(block_m=128, block_n=128, swizzle="pad8")
    assert padded.smem_bytes(128) == 104448
    with pytest.raises(ConfigError, match="sm_86 allows 101376"):
        padded.check_problem(128, "sm_86")
    padded.check_problem(128, "sm_80")


@pytest.mark.parametrize(
    ("changes", "head_dim", "match"),
    [
        ({"k_frags_per_load": 6}, 64, r"k_frags_per_load=6 must divide head_dim / 8 = 8"),
        ({"k_frags_per_load": 6}, 128, r"k_frags_per_load=6 must divide head_dim / 8 = 16"),
        ({"k_frags_per_load": 16}, 64, r"k_frags_per_load=16 must divide head_dim / 8 = 8"),
        ({"q_frags_per_load": 12}, 128, r"q_frags_per_load=12 must divide head_dim / 8 = 16"),
    ],
)
def test_check_problem_rejects_frags_not_dividing_head_dim(
    changes: dict[str, object], head_dim: int, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        FlashConfig(**changes).check_problem(head_dim)


def test_frags_that_divide_head_dim_pass() -> None:
    # 16 fragments is the whole 128-wide head dim in one load, but too many for 64.
    FlashConfig(k_frags_per_load=16, q_frags_per_load=4).check_problem(128)


def test_check_problem_rejects_unknown_arch() -> None:
    with pytest.raises(ConfigError, match=r"unknown arch 'sm_75'"):
        FlashConfig().check_problem(64, "sm_75")


def test_tma_kv_loads_needs_sm90() -> None:
    config = FlashConfig(tma_kv_loads=True)
    config.check_problem(128, "sm_90a")
    config.check_problem(128, None)  # the kernel object's target-free check
    with pytest.raises(ConfigError, match="tma_kv_loads needs the TMA unit of sm_90"):
        config.check_problem(128, "sm_80")
    assert config.short_name().endswith("+tma_kv")


def test_l2_section_mb_sizes_only_the_longest_first_order():
    assert FlashConfig(lpt=True, l2_section_mb=16).short_name().endswith("+lpt_l2_16mb")
    assert FlashConfig(lpt=True).short_name().endswith("+lpt")
    assert FlashConfig(lpt=True, l2_section_mb=1024).short_name().endswith("+lpt_l2_1024mb")
    with pytest.raises(ConfigError, match="needs lpt"):
        FlashConfig(l2_section_mb=16)
    for bad in (0, 1025, True, 8.0):
        with pytest.raises(ConfigError, match="l2_section_mb must be"):
            FlashConfig(lpt=True, l2_section_mb=bad)


def test_cluster_m_pairs_the_static_persistent_walk():
    base = policy.default_for("sm_90a", 128)
    assert base.static_persistent_walk
    assert not base.replace(dynamic_tiles=True).static_persistent_walk
    assert not base.replace(persistent=False, q_stages=1).static_persistent_walk
    assert not ladder.k16.static_persistent_walk
    assert "+cluster_2" in base.replace(cluster_m=2).short_name()
    for bad in ({"cluster_m": 4}, {"cluster_m": 0},
                {"cluster_m": 2, "persistent": False, "q_stages": 1},
                {"cluster_m": 2, "dynamic_tiles": True}):
        with pytest.raises(ConfigError, match="cluster_m"):
            base.replace(**bad)


def test_q_stages_double_buffer_the_persistent_walks_q():
    two = policy.default_for("sm_90a", 64, True, seqlen=1024)
    base = two.replace(q_stages=1)
    assert two.short_name().endswith("+q_stages_2") and "q_stages" not in base.short_name()
    assert two.smem_bytes(64) == base.smem_bytes(64) + 128 * 64 * 2
    two.check_problem(64, "sm_90a")
    # The policy's: the short masked hd64 tile, hd128's persistent tiles and hd64 plain
    # below 8k take two; hd64 plain from 8k and one CTA per tile (hd128 causal) one.
    for head_dim, windowed, seqlen, stages in ((64, False, 4096, 2), (64, False, 8192, 1),
                                               (64, False, None, 1), (128, False, None, 2),
                                               (128, True, 4096, 2), (128, True, 16384, 1),
                                               (64, True, 4096, 1), (256, False, None, 1)):
        config = policy.default_for("sm_90a", head_dim, windowed, seqlen=seqlen)
        assert config.q_stages == stages, (head_dim, windowed, seqlen)
    for bad in ({"q_stages": 3}, {"q_stages": 0}, {"q_stages": 2, "persistent": False,
                                                   "dynamic_tiles": False}):
        with pytest.raises(ConfigError, match="q_stages"):
            base.replace(**bad)
    with pytest.raises(ConfigError, match="q_stages .*need wgmma"):
        ladder.k16.replace(q_stages=2)
    # hd256's two K/V stages leave no room for O's own tile beside two Q tiles.
    with pytest.raises(ConfigError, match="O staged in a tile of its own"):
        policy.default_for("sm_90a", 256).replace(q_stages=2).check_problem(256, "sm_90a")
