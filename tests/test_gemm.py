"""The GEMM family without a GPU: config rules, the tile walk, dispatch, operand layouts,
input validation, and each default kernel cross-compiled for sm_90a (resources and SASS)."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.gemm import GemmConfig
from attnlab.gemm.api import _check, operand_major
from attnlab.gemm.dispatch import plan
from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec, binary_config
from attnlab.kernels.gemm.tiles import k_tiles_per_split, tile_coords


@pytest.mark.parametrize("bad", [dict(block_m=256), dict(block_n=264), dict(block_n=24 + 1),
                                 dict(block_k=48), dict(stages=1), dict(split_mode="tree"),
                                 dict(block_m=192, block_n=256)])
def test_config_refuses(bad):
    with pytest.raises(ConfigError):
        GemmConfig(**bad)


def test_ring_stages_fill_shared_memory():
    assert GemmConfig().ring_stages("sm_90a", "bfloat16") == 3  # 48 KiB stages + 64 KiB C
    assert GemmConfig(block_n=128).ring_stages("sm_90a", "float32") == 5
    with pytest.raises(ConfigError, match="fit"):
        GemmConfig(stages=5).ring_stages("sm_90a", "bfloat16")


@pytest.mark.parametrize("m_tiles,n_tiles,splits,group", [(5, 7, 1, 3), (8, 2, 3, 8),
                                                          (1, 9, 4, 1), (13, 1, 2, 4)])
def test_tile_walk_covers_every_item_once(m_tiles, n_tiles, splits, group):
    items = [tile_coords(i, m_tiles, n_tiles, group) for i in range(m_tiles * n_tiles * splits)]
    assert len(set(items)) == len(items)
    assert set(items) == {(m, n, s) for m in range(m_tiles) for n in range(n_tiles)
                          for s in range(splits)}
    if group > 1 and m_tiles >= group:
        # Within a raster group, consecutive items walk M first.
        assert [x[0] for x in items[:group]] == list(range(group))


def test_dispatch_weighs_host_and_device_time():
    square, skinny = plan(4096, 4096, 4096, 132), plan(256, 256, 4096, 132)
    assert square.splits == 1 and square.config.block_n == 256
    # Host-bound: the 64-row tile, split only where the split costs no host time (a cluster's
    # meeting, in the kernel; the serial split's workspace and counters cost 3 us a call).
    assert skinny.config.block_m == 64
    assert skinny.splits == 1 or skinny.config.split_mode == "cluster"
    assert plan(8192, 8192, 8192, 132).splits == 1
    long_k = plan(128, 128, 65536, 132)
    assert long_k.splits > 1 and long_k.config.split_mode == "serial"
    # Long K in the skinny set: the slices meet in a cluster (one launch, no workspace: an
    # unsplit call's host cost), four of them at 256 x 256 and eight at 128 x 128, where the
    # fastest measured (H100, docs/gemm.md); one CTA a slice, side by side.
    for m, splits in ((256, 4), (128, 8)):
        p = plan(m, m, 8192, 132)
        assert (p.splits, p.config.split_mode, p.config.block_m) == (splits, "cluster", 64)
        assert p.num_ctas == (m // 64) ** 2 * splits
    skinniest = plan(512, 512, 4096, 132)
    assert skinniest.splits == 1 and skinniest.config.block_k == 128


@pytest.mark.parametrize("m", [1, 16, 64])
def test_decoding_sized_gemms_split_where_their_ctas_stream_b(m):
    """Up to 64 rows a GEMM is one row of tiles, bound by how fast each CTA streams its part
    of B from DRAM: 64 CTAs of 64 x 64 at 4096 x 4096 gain from a cluster of two slices
    (measured, docs/gemm.md); 112 CTAs of 64 x 128 at 14336 x 4096 fill the GPU unsplit."""
    half_wave = plan(m, 4096, 4096, 132)
    assert (half_wave.config.block_m, half_wave.config.block_n, half_wave.config.block_k,
            half_wave.splits, half_wave.split) == (64, 64, 128, 2, "cluster")
    full = plan(m, 14336, 4096, 132)
    assert (full.config.block_m, full.config.block_n, full.splits) == (64, 128, 1)
    # Two rows of tiles re-read B from L2: the model's step costs again (no split).
    assert plan(128, 4096, 4096, 132).splits == 1


@pytest.mark.parametrize("k,splits", [(640, 6), (64, 16), (4096, 7), (72, 3)])
def test_split_counts_leave_no_slice_empty(k, splits):
    p = plan(128, 128, k, 132, GemmConfig(block_n=128, split_k=splits))
    k_tiles = math.ceil(k / 64)
    per = k_tiles_per_split(k_tiles, p.splits)
    assert (p.splits - 1) * per < k_tiles <= p.splits * per


def test_operand_major_and_restriding():
    w = torch.zeros(48, 64, dtype=torch.bfloat16)
    assert operand_major("b", w.t(), ("k", "n"))[0] == "k"
    assert operand_major("b", w, ("k", "n"))[0] == "n"
    row = torch.zeros(1, 20, dtype=torch.bfloat16)[:, :13]  # one row: its stride is free
    label, view = operand_major("a", row, ("m", "k"))
    assert label == "k" and view.stride() == (16, 1)
    with pytest.raises(ValueError, match="multiple of 8 elements"):
        operand_major("a", torch.zeros(4, 13, dtype=torch.float16), ("m", "k"))


@pytest.mark.parametrize("args,error,match", [
    ((torch.zeros(4, 8), torch.zeros(8, 8)), TypeError, "float32"),
    ((torch.zeros(4, 8, dtype=torch.half), torch.zeros(8, 8, dtype=torch.bfloat16)),
     TypeError, "share one dtype"),
    ((torch.zeros(4, 8, dtype=torch.half), torch.zeros(16, 8, dtype=torch.half)), ValueError,
     "columns to match"),
    ((torch.zeros(2, 4, 8, dtype=torch.half), torch.zeros(8, 8, dtype=torch.half)),
     ValueError, "2-D"),
    ((torch.zeros(4, 8, dtype=torch.half), torch.zeros(8, 8, dtype=torch.half)), ValueError,
     "CUDA"),
    (([1], torch.zeros(8, 8)), TypeError, "torch.Tensor"),
])
def test_validation_messages(args, error, match):
    with pytest.raises(error, match=match):
        _check(*args, torch.float16, None)


def test_int8_plans_one_slice_of_128_byte_k_steps():
    p = plan(4096, 4096, 4096, 132, block_k=128, allow_split=False)
    assert p.splits == 1 and p.config.block_k == 128
    assert plan(64, 64, 1 << 17, 132, block_k=128, allow_split=False).splits == 1
    assert GemmConfig(block_k=128).ring_stages("sm_90a", "bfloat16", "int8") == 3
    # An fp32 C tile of 128 x 256 would leave two stages: the 128-column tile instead.
    wide = plan(4096, 4096, 4096, 132, block_k=128, allow_split=False, in_dtype="int8",
                out_dtype="float32")
    assert wide.config.block_n == 128


def test_spec_round_trips_and_ignores_launch_knobs():
    from attnlab.kernels.abi import spec_from_dict

    spec = GemmSpec(binary_config(GemmConfig(split_k=4, persistent=False)), "sm_90a",
                    "float16", "float32", "m", "k", "workspace")
    assert spec.config == GemmConfig()
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec_from_dict(ReduceSpec("sm_90a", "bfloat16").to_dict()).out_dtype == "bfloat16"


def _sass_counts(spec) -> tuple[str, collections.Counter]:
    import subprocess
    import tempfile

    from attnlab.analysis import sass
    from attnlab.analysis.tools import find_tool
    from attnlab.jit import compile_spec, dumped_binary

    with tempfile.TemporaryDirectory() as folder:
        compile_spec(spec, folder)
        cubin, _ = dumped_binary(folder)
        usage = subprocess.run([str(find_tool("cuobjdump")), "--dump-resource-usage",
                                str(cubin)], capture_output=True, text=True, check=True).stdout
        ops = sass.histogram(sass.parse(sass.disassemble(cubin)))
    return usage, ops


@pytest.mark.parametrize("spec", [
    GemmSpec(GemmConfig(), "sm_90a", "bfloat16", "bfloat16"),
    GemmSpec(GemmConfig(block_m=64, block_n=128), "sm_90a", "float16", "float32", "k", "k",
             "workspace"),
    GemmSpec(GemmConfig(block_n=128), "sm_90a", "bfloat16", "float32", "m", "n", "atomic"),
    GemmSpec(GemmConfig(block_m=64, block_n=128), "sm_90a", "bfloat16", "bfloat16", "k", "n",
             "serial"),
    GemmSpec(GemmConfig(block_k=128), "sm_90a", "int8", "bfloat16", "k", "k", "none",
             "scale_zero"),
    GemmSpec(GemmConfig(block_n=128, block_k=32), "sm_90a", "int8", "float16", "k", "k",
             "none", "scale_zero"),
], ids=lambda s: s.label + s.variant())
def test_kernels_cross_compile_without_spills(spec):
    usage, ops = _sass_counts(spec)
    assert "LOCAL:0" in usage, usage
    int8 = spec.dtype == "int8"
    mma_steps = spec.config.block_k // (32 if int8 else 16)
    # One stage's k-steps, at the loop's two issue points (the peeled first K tile).
    assert ops["IGMMA" if int8 else "HGMMA"] == 2 * mma_steps, ops
    assert ops["UTMALDG"] >= 2
    # Programmatic dependent launch (GemmConfig.pdl): one early trigger, one wait.
    assert ops["PREEXIT"] == 1 and ops["ACQBULK"] == 1, ops
    store = "UTMAREDG" if spec.split == "atomic" else "UTMASTG"
    assert ops[store] >= 1, ops
    if int8:
        # Each of a thread's 2 rows loads its scale and each of its block_n / 4 columns its
        # scale and zero point once (not once per element); the rows' sums come from A's
        # tiles in shared memory: per stage and row, a quarter of the row's bytes in 16-byte
        # loads (one 8-byte load at block_k 32) and a dp4a per 4 bytes, then two shuffles
        # per row over its four lanes (all at the loop's two issue points).
        quarter = spec.config.block_k // 4
        assert ops["LDG"] == 2 + 2 * (spec.config.block_n // 4), ops
        assert ops["LDS"] == 2 * 2 * max(1, quarter // 16), ops
        assert ops["IDP"] == 2 * 2 * quarter // 4 and ops["SHFL"] == 4, ops
    elif spec.split == "serial":
        # The partials leave and return as column pairs: one 8-byte access per pair; they
        # return by the two-slice path (one slice's), the loop unrolled by four and its
        # remainder (one slice's): six slices' loads in the binary.
        pairs = spec.config.block_n // 4
        assert ops["STG"] == pairs + 1 and ops["LDG"] == 6 * pairs and ops["ATOMG"] == 1, ops
    else:
        assert ops["LDG"] == 0, ops


@pytest.mark.parametrize("tile_splits", [(64, 64, 8), (64, 128, 4), (128, 128, 2)])
def test_cluster_split_compiles_its_meeting_without_spills(tile_splits):
    """The cluster split: the partials into shared memory as column pairs, every peer's band
    loaded by one 16-byte distributed-shared-memory load per slice, all issued before the
    sums (unrolled: the cluster's size is compiled in), two cluster barriers, no workspace
    traffic and no TMA store."""
    block_m, block_n, splits = tile_splits
    cfg = GemmConfig(block_m=block_m, block_n=block_n, split_k=splits, split_mode="cluster")
    spec = GemmSpec(binary_config(cfg), "sm_90a", "bfloat16", "bfloat16", "k", "n", "cluster")
    assert spec.config.split_k == splits
    usage, ops = _sass_counts(spec)
    assert "LOCAL:0" in usage, usage
    threads = 128 * cfg.num_consumers
    vectors = block_m * block_n // splits // (4 * threads)
    assert ops["STS"] == block_n // 4, ops
    assert ops["LD"] == vectors * splits and ops["LDG"] == 0 and ops["ATOMG"] == 0, ops
    assert ops["UCGABAR_ARV"] == 2 * 2 and ops["UTMASTG"] == 0, ops
    assert ops["STG"] == vectors, ops


def test_cluster_split_configs_and_specs_refuse_what_cannot_meet():
    with pytest.raises(ConfigError, match="cluster of 3"):
        GemmConfig(block_m=64, block_n=64, split_k=3, split_mode="cluster")
    with pytest.raises(ConfigError, match="cluster of 16"):
        GemmConfig(block_m=64, block_n=64, split_k=16, split_mode="cluster")
    assert not GemmConfig(block_m=64, block_n=64).cluster_splits_ok(1)
    with pytest.raises(ConfigError, match="split_mode"):
        GemmSpec(GemmConfig(block_m=64, block_n=64), "sm_90a", "bfloat16", "bfloat16", "k",
                 "n", "cluster")
    with pytest.raises(ConfigError, match="bias"):
        GemmSpec(GemmConfig(block_m=64, block_n=64), "sm_90a", "bfloat16", "float32", "k",
                 "n", "workspace", bias=True)
    with pytest.raises(ConfigError, match="partial tile"):
        GemmConfig(block_n=256, split_k=8, split_mode="cluster").ring_stages(
            "sm_90a", "bfloat16", cluster=True)
    assert GemmConfig(block_m=64, block_n=64).can_split(3, "serial")
    assert not GemmConfig(block_m=64, block_n=64).can_split(3, "cluster")
    # A sweep's names: each tile once unsplit, then every count in each mode it can meet in.
    from attnlab.gemm.tune import split_configs

    names = split_configs(((64, 64),), (1, 3, 4), ("serial", "cluster"))
    assert list(names) == ["64x64 s1", "64x64 s3 s", "64x64 s4 s", "64x64 s4 c"]
    assert names["64x64 s4 c"].split_mode == "cluster"
    # Fewer K tiles than a cluster's slices: a count the tile shares out, never below one.
    p = plan(256, 256, 3 * 64, 132, GemmConfig(block_m=64, block_n=64, split_k=4,
                                                split_mode="cluster"))
    assert p.splits == 2 and p.split == "cluster"
    # Other split modes still share one binary across split counts.
    assert binary_config(GemmConfig(split_k=4, split_mode="serial")).split_k == 1
    assert GemmConfig(block_m=64, block_n=64, split_k=4,
                      split_mode="cluster").label().endswith("grid split4-cluster")


def test_reduce_kernel_vectorises():
    _, ops = _sass_counts(ReduceSpec("sm_90a", "bfloat16"))
    assert ops["LDG"] == 1 and ops["STG"] == 1 and ops["FADD"] == 4, ops


# ---- the mma.sync ladder (g01..g09) -------------------------------------------------------
def _ladder_sass(name: str):
    from attnlab.gemm.ladder import GEMM_STEPS
    from attnlab.gemm_config import MmaGemmConfig

    config = GEMM_STEPS[name][0]
    ladder = isinstance(config, MmaGemmConfig)
    spec = GemmSpec(config, "sm_80" if ladder else "sm_90a", "bfloat16", "bfloat16", "k",
                    "k" if ladder else "n")
    return config, *_sass_counts(spec)


@pytest.mark.parametrize("name", ["g01", "g02", "g03", "g04", "g05", "g06", "g07", "g07x",
                                  "g08", "g09"])
def test_ladder_steps_compile_without_spills(name):
    config, usage, ops = _ladder_sass(name)
    assert "LOCAL:0" in usage, usage
    assert ops["HMMA"] or ops["HGMMA"], ops


def test_ladder_steps_show_their_knob_in_sass():
    """Each step's SASS carries the change it names (static evidence, as the attention
    ladder's): global fragments, then shared loads, ldmatrix, cp.async, the staged C."""
    ops = {name: _ladder_sass(name)[2] for name in ("g01", "g02", "g03", "g04", "g05", "g06",
                                                    "g08")}
    assert ops["g01"]["LDG"] > 0 and ops["g01"]["LDS"] + ops["g01"]["LDSM"] == 0
    assert ops["g02"]["LDS"] > 0 and ops["g02"]["LDSM"] == 0 and ops["g02"]["STS"] > 0
    assert ops["g03"]["LDSM"] > 0 and ops["g03"]["LDS"] == 0
    assert ops["g04"]["LDGSTS"] > 0 and ops["g04"]["STS"] == 0
    # 16 warps on 128 x 128 halve each warp's tile; 128 x 256 doubles it back.
    assert ops["g05"]["HMMA"] * 2 == ops["g04"]["HMMA"] == ops["g06"]["HMMA"]
    assert ops["g08"]["STS"] > 0 and ops["g08"]["STG"] < ops["g06"]["STG"]


def test_ladder_configs_refuse_knob_mixes():
    from attnlab.gemm_config import MmaGemmConfig

    for bad in (dict(smem=False), dict(stages=2, async_copy=False),
                dict(block_m=96), dict(block_k=16), dict(warps_m=1, warps_n=2)):
        with pytest.raises(ConfigError):
            MmaGemmConfig(**bad)


# ---- tuning ----------------------------------------------------------------------------------
def test_tune_space_starts_with_the_model_and_fits():
    from attnlab.gemm.tune import gemm_space

    space = gemm_space(256, 256, 8192, 132)
    assert space[0] == plan(256, 256, 8192, 132).config
    assert len(set(space)) == len(space) > 10
    for cfg in space:
        cfg.ring_stages("sm_90a", "float32" if cfg.split_k > 1 else "bfloat16")
    assert any(cfg.split_k > 1 and cfg.split_mode == "serial" for cfg in space)
    # The 64 x 64 tile at both K steps: the model's 128 and the 16-bit default's 64.
    assert {cfg.block_k for cfg in space if (cfg.block_m, cfg.block_n) == (64, 64)} == {64, 128}
    square = gemm_space(8192, 8192, 8192, 132)
    assert all(cfg.split_k == 1 for cfg in square)  # 2048 tiles fill the GPU
    assert all(cfg.block_k == 128 for cfg in gemm_space(4096, 4096, 4096, 132, "int8"))


def test_tuning_cache_round_trips_a_gemm_entry(tmp_path, monkeypatch):
    from attnlab.device import DeviceInfo
    from attnlab.gemm.tune import gemm_key, record, tune_shape, tuned_config
    from attnlab.tune.cache import TuneCache

    gpu = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), "sm_90a", 132, 50 << 20)
    fast = GemmConfig(block_m=64, block_n=64, split_k=1)
    model = GemmConfig(split_k=1)
    best, timings = tune_shape([model, fast, GemmConfig(stages=3)],
                               {model: 0.02, fast: 0.01}.get)
    assert best == fast and len(timings) == 2
    cache = TuneCache(tmp_path / "tune.json")
    key = gemm_key(gpu, "bfloat16", "bfloat16", 256, 256, 8192)
    record(cache, key, best, timings)
    cache.save()
    again = TuneCache(tmp_path / "tune.json")
    assert tuned_config(again, key) == fast
    assert again.entries[key]["default_ms"] == 0.02
    assert tuned_config(again, key.replace("8192", "4096")) is None


def test_inputs_that_require_grad_are_refused():
    from attnlab.gemm import matmul

    a = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(16, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="no backward"):
        matmul(a, b)
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA"):
        matmul(a, b)  # past the autograd rule, refused for the device


def test_analysis_artifacts_of_gemm_specs(tmp_path):
    """The analysis tools' compilation (``compile.compile_spec``) takes GEMM specs too."""
    from attnlab.compile import compile_spec

    reduce = compile_spec(ReduceSpec("sm_90a", "float16"), tmp_path)
    gemm = compile_spec(GemmSpec(GemmConfig(), "sm_90a", "bfloat16", "bfloat16"), tmp_path)
    assert reduce.cubin.exists() and reduce.dtype == "float16" and reduce.head_dim == 0
    assert gemm.cubin.exists() and gemm.config == GemmConfig()


def test_default_specs_cover_every_plan_of_the_lab_shapes():
    """``attnlab cache --warm`` compiles ``default_specs``: every kernel the dispatch picks at
    the lab's and the LLM shapes is among them (so a warmed machine compiles nothing)."""
    from attnlab.bench.gemm import LAB_SHAPES, LLM_SHAPES
    from attnlab.gemm.dispatch import default_specs

    specs = set(default_specs("sm_90a"))
    assert len(specs) == len(default_specs("sm_90a")) and default_specs("sm_80") == []
    for m, n, k in LAB_SHAPES + LLM_SHAPES:
        p = plan(m, n, k, 132)
        b_major = "k" if (m, n, k) in LLM_SHAPES else "n"
        spec = GemmSpec(binary_config(p.config), "sm_90a", "bfloat16",
                        "float32" if p.split == "workspace" else "bfloat16", "k", b_major,
                        p.split)
        assert spec in specs or p.split in ("serial", "workspace"), (m, n, k)


def test_gemm_bench_parses_its_options_before_needing_a_gpu():
    from typer.testing import CliRunner

    from attnlab.cli import app

    result = CliRunner().invoke(app, ["bench", "--family", "gemm", "--dtypes", "fp8"])
    assert result.exit_code == 2 and "int8" in result.output
    result = CliRunner().invoke(app, ["bench", "--family", "gemm", "--shapes", "4096x4096"])
    assert result.exit_code == 2 and "MxNxK" in result.output


def test_a_candidate_sweep_summary_ranks_end_to_end_against_the_peer():
    from attnlab.bench.gemm import GemmPoint, GemmResult, best_lines
    from attnlab.bench.timing import summarize

    point = GemmPoint(256, 256, 4096)

    def result(impl, ms, device_ms):
        return GemmResult(point, impl, summarize([ms]), summarize([device_ms]))

    results = [result("cublas", 0.02, 0.01), result("a", 0.01, 0.02),
               result("b", 0.04, 0.005), GemmResult(point, "broken", None, error="boom")]
    (line,) = best_lines(results, [point], "cublas", top=2, also="b")
    # a is twice as fast end to end (half as fast on the device); b ranks third, shown last.
    assert line.startswith("256x256x4096 cublas")
    assert "a 2.00x (0.50) | cublas 1.00x (1.00) | b 0.50x" in line
    assert "broken" not in line



def test_c_rows_the_tma_unit_cannot_write_are_refused_with_the_fix():
    from attnlab.gemm.api import check_c_rows

    check_c_rows(8, "bfloat16")
    check_c_rows(4, "float32")
    with pytest.raises(ValueError, match="pad N"):
        check_c_rows(3, "bfloat16")
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        check_c_rows(6, "float16")
