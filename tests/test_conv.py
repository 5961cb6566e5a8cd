"""The convolution family without a GPU: im2col against torch's convolution (fp64), and
every input rule of ``attnlab.conv.conv2d`` (issue 23)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.conv import conv2d, im2col
from attnlab.conv.api import check_conv_inputs, output_size


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), c=st.sampled_from([1, 3, 8]), h=st.integers(3, 9),
       w=st.integers(3, 9), k=st.integers(1, 4), r=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), padding=st.integers(0, 1))
def test_im2col_times_the_filters_is_the_convolution(n, c, h, w, k, r, stride, padding):
    gen = torch.Generator().manual_seed(n * 1000 + c * 100 + h * 10 + w)
    x = torch.randn(n, c, h, w, dtype=torch.float64, generator=gen)
    filters = torch.randn(k, c, r, r, dtype=torch.float64, generator=gen)
    if output_size(h, r, stride, padding) < 1 or output_size(w, r, stride, padding) < 1:
        return
    cols = im2col(x.permute(0, 2, 3, 1), (r, r), (stride, stride), (padding, padding))
    out = cols @ filters.permute(0, 2, 3, 1).reshape(k, -1).t()
    ref = F.conv2d(x, filters, stride=stride, padding=padding)
    p, q = ref.shape[2:]
    torch.testing.assert_close(out.view(n, p, q, k).permute(0, 3, 1, 2), ref)


def _inputs(c=8, k=8, dtype=torch.bfloat16, channels_last=True):
    x = torch.randn(1, c, 8, 8, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x, torch.randn(k, c, 3, 3, dtype=dtype)


@pytest.mark.parametrize("change,error,match", [
    (dict(dtype=torch.float32), TypeError, "float32"),
    (dict(channels_last=False), ValueError, "channels-last"),
    (dict(c=12), ValueError, "input channels must be a multiple of 8"),
    (dict(k=12), ValueError, "output channels must be a multiple of 8"),
])
def test_conv_input_rules(change, error, match):
    x, w = _inputs(**change)
    with pytest.raises(error, match=match):
        check_conv_inputs(x, w, None, (1, 1), (1, 1))


def test_conv_refuses_mismatches_and_empty_outputs():
    x, w = _inputs()
    with pytest.raises(ValueError, match="input channels, x has"):
        check_conv_inputs(x, torch.randn(8, 16, 3, 3, dtype=torch.bfloat16), None, (1, 1),
                          (1, 1))
    with pytest.raises(ValueError, match="no output"):
        check_conv_inputs(x, torch.randn(8, 8, 11, 11, dtype=torch.bfloat16), None, (1, 1),
                          (0, 0))
    with pytest.raises(ValueError, match="bias"):
        check_conv_inputs(x, w, torch.zeros(4), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="one device"):
        check_conv_inputs(x, w, torch.zeros(8, device="meta"), (1, 1), (1, 1))
    with pytest.raises(TypeError, match="GemmConfig or MmaGemmConfig"):
        conv2d(x, w, config="128x128")
    with pytest.raises(TypeError, match="pair of ints"):
        conv2d(x, w, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="algorithm"):
        conv2d(x, w, algorithm="winograd")
    with pytest.raises(RuntimeError, match="no backward"):
        conv2d(x, w.requires_grad_())


def test_plan_label_says_which_step_runs_a_call():
    from attnlab.conv.api import plan_label

    x, w = _inputs()
    # No GPU here: the implicit GEMM is refused, auto falls back to im2col.
    assert plan_label(x, w) == plan_label(x, w, algorithm="im2col") == "im2col"
    with pytest.raises(ValueError, match="CUDA device"):
        plan_label(x, w, algorithm="implicit")


@pytest.mark.parametrize("n, c, hw, splits, block_m", [
    (1, 640, 32, 2, 64), (4, 640, 16, 2, 64), (1, 640, 16, 4, 64), (1, 320, 64, 1, 64),
    (4, 640, 32, 1, 128), (4, 320, 64, 1, 128), (1, 64, 64, 1, 64)])
def test_conv_dispatch_splits_only_the_levels_that_leave_sms_idle(n, c, hw, splits, block_m):
    """The SD-UNet levels with 256-1024 output rows split K over 64-row tiles, the slices
    meeting in a cluster (measured best of one to eight slices, serial or clustered); the
    large levels and the small channel counts take one."""
    from attnlab.conv.api import _conv_plan

    p = _conv_plan(n * hw * hw, c, 9 * c, 132, None, "bfloat16")
    assert (p.splits, p.config.block_m) == (splits, block_m)
    assert splits == 1 or (p.split == "cluster" and p.num_ctas % splits == 0)


def test_conv2d_composes_im2col_the_gemm_and_the_bias(monkeypatch):
    """The whole call on the CPU, torch's product standing in for the GPU GEMM: shape,
    channels-last result, bias, stride 2."""
    import attnlab.conv.api as api

    monkeypatch.setattr(api, "matmul", lambda a, b: (a.float() @ b.float()).to(a.dtype))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 9, 9, generator=gen).to(torch.bfloat16,
                                                   memory_format=torch.channels_last)
    w = torch.randn(24, 16, 3, 3, generator=gen).to(torch.bfloat16)
    bias = torch.randn(24, generator=gen).to(torch.bfloat16)
    out = conv2d(x, w, bias, stride=2, padding=1)
    ref = F.conv2d(x.float(), w.float(), bias.float(), stride=2, padding=1)
    assert out.shape == ref.shape == (2, 24, 5, 5)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert ((out.float() - ref).norm() / ref.norm()).item() < 8e-3


def _kernel_ops(spec):
    import tempfile

    from attnlab.analysis import sass
    from attnlab.jit import compile_spec, dumped_binary

    with tempfile.TemporaryDirectory() as folder:
        compile_spec(spec, folder)
        return sass.histogram(sass.parse(sass.disassemble(dumped_binary(folder)[0])))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_conv_family_kernels_cross_compile(arch):
    from attnlab.kernels.conv.abi import DirectConvSpec, GroupNormSiluSpec

    ops = _kernel_ops(GroupNormSiluSpec(arch, "bfloat16", 10, "stats"))
    # Two passes over a chunk, a group row of ten channels unrolled (two pixels a trip):
    # warp-shuffle sums, one store of the chunk's pair, no local memory.
    assert ops["LDG"] >= 2 * 10 and ops["SHFL"] > 0 and ops["STG"] <= 2, ops
    assert ops["STL"] == ops["LDL"] == 0, ops
    ops = _kernel_ops(GroupNormSiluSpec(arch, "bfloat16", 10, "apply"))
    # The merge's loads, then a loaded, normalised, activated and stored value per channel.
    assert ops["LDG"] >= 10 and ops["STG"] >= 10 and ops["MUFU"] >= 10, ops
    assert ops["STL"] == ops["LDL"] == 0, ops
    ops = _kernel_ops(DirectConvSpec(arch, "float16"))
    # The FFMA baseline: scalar loads of x and w per product, one store per output.
    assert ops["FFMA"] >= 4 and ops["STG"] == 1 and ops["HMMA"] == 0, ops
    assert ops["STL"] == ops["LDL"] == 0, ops


def test_group_norm_silu_input_rules():
    from attnlab.conv.norm import check_norm_inputs, image_rows

    x = torch.randn(1, 64, 4, 4, dtype=torch.float16).to(memory_format=torch.channels_last)
    weight, bias = torch.ones(64), torch.zeros(64)
    check_norm_inputs(x, 32, weight, bias)
    assert image_rows(x).shape == (1, 16, 64) and image_rows(x).data_ptr() == x.data_ptr()
    with pytest.raises(ValueError, match="divide"):
        check_norm_inputs(x, 24, weight, bias)
    with pytest.raises(ValueError, match="channels-last"):
        check_norm_inputs(x.contiguous(), 32, weight, bias)
    with pytest.raises(ValueError, match="weight"):
        check_norm_inputs(x, 32, torch.ones(32), bias)
    wide = torch.randn(1, 128, 2, 2, dtype=torch.float16).to(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="at most 64 channels"):
        check_norm_inputs(wide, 1, torch.ones(128), torch.zeros(128))
    with pytest.raises(TypeError, match="float32"):
        check_norm_inputs(x.float(), 32, weight, bias)


def test_group_chunks_fill_the_gpu_without_starving_a_cta():
    from attnlab.conv.norm import group_chunk_pixels

    # One SD-UNet image of 32 groups at 64^2 on 132 SMs: 17 chunks of 241 pixels.
    assert group_chunk_pixels(32, 4096, 132) == 241
    # At 16^2 a chunk keeps one pixel per thread: two chunks of 128.
    assert group_chunk_pixels(32, 256, 132) == 128
    assert group_chunk_pixels(128, 4096, 132) == 820


def test_bench_points_count_the_convolutions_flops():
    from attnlab.bench.conv import ConvPoint, ResBlockPoint, sd_unet_points

    assert ConvPoint(1, 320, 64, 320).flops == 2 * 64 * 64 * 320 * 320 * 9
    assert ConvPoint(1, 8, 9, 8, stride=2).out_hw == 5
    assert ResBlockPoint(1, 320, 64).flops == 2 * ConvPoint(1, 320, 64, 320).flops
    assert len(sd_unet_points()) == 14 and len({p.label() for p in sd_unet_points()}) == 14


def test_conv_bench_refuses_int8_before_needing_a_gpu():
    from typer.testing import CliRunner

    from attnlab.cli import app

    result = CliRunner().invoke(app, ["bench", "--family", "conv", "--dtypes", "int8"])
    assert result.exit_code == 2 and "bf16 and/or fp16" in result.output


def _instructions(spec):
    import tempfile

    from attnlab.analysis import sass
    from attnlab.jit import compile_spec, dumped_binary

    with tempfile.TemporaryDirectory() as folder:
        compile_spec(spec, folder)
        return sass.parse(sass.disassemble(dumped_binary(folder)[0]))


@pytest.mark.parametrize("split,bias", [("none", True), ("serial", False)])
def test_implicit_conv_loads_its_a_tiles_with_the_tma_im2col_mode(split, bias):
    from attnlab.gemm_config import GemmConfig
    from attnlab.kernels.conv.abi import ImplicitConvSpec

    spec = ImplicitConvSpec(GemmConfig(block_m=128, block_n=128), "sm_90a", "bfloat16",
                            split=split, bias=bias)
    opcodes = [i.opcode for i in _instructions(spec)]
    # A through the im2col mode of the 4-D NHWC image, B and C as 2-D tiles.
    assert opcodes.count("UTMALDG.4D.IM2COL") == 1 and opcodes.count("UTMALDG.2D") == 1
    assert any(op.startswith("HGMMA") for op in opcodes)
    assert not any(op.startswith(("STL", "LDL")) for op in opcodes)
    # The bias: per-column loads in the epilogue; none without it (serial split: the
    # partials' loads instead).
    loads = sum(op.startswith("LDG") for op in opcodes)
    assert loads > 0 if bias or split == "serial" else loads == 0


def test_implicit_conv_spec_round_trips_and_refuses_a_second_pass():
    from attnlab.config import ConfigError
    from attnlab.gemm_config import GemmConfig
    from attnlab.kernels.abi import spec_from_dict
    from attnlab.kernels.conv.abi import ImplicitConvSpec
    from attnlab.kernels.gemm.abi import GemmSpec

    spec = ImplicitConvSpec(GemmConfig(block_n=160), "sm_90a", "float16", 1, 1, 2, 2, 0, 0,
                            "serial", True)
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec.variant() == "_r1s1_u2v2_p0q0_serial_bias"
    with pytest.raises(ConfigError, match="one kernel"):
        ImplicitConvSpec(GemmConfig(), "sm_90a", "float16", split="workspace")
    # The GEMM's bias is the epilogue's: refused with split-K's second pass.
    with pytest.raises(ConfigError, match="bias"):
        GemmSpec(GemmConfig(), "sm_90a", "float16", "float32", split="atomic", bias=True)


def test_conv_ladder_steps_each_change_one_thing_from_their_base():
    from attnlab.conv.api import ALGORITHMS
    from attnlab.conv.ladder import CONV_BASES, CONV_STEPS
    from attnlab.gemm_config import GemmConfig, MmaGemmConfig

    assert list(CONV_STEPS) == sorted(CONV_STEPS)
    for name, base in CONV_BASES.items():
        assert name in CONV_STEPS and base in CONV_STEPS and base < name
    for options, what in CONV_STEPS.values():
        assert options["algorithm"] in ALGORITHMS and what
    implicit = [opts["config"] for opts, _ in CONV_STEPS.values()
                if opts["algorithm"] == "implicit"]
    # The coordinate tables on mma.sync first, then the Hopper steps, which differ in their
    # tile only.
    assert isinstance(implicit[0], MmaGemmConfig)
    hopper = implicit[1:]
    assert all(isinstance(c, GemmConfig) for c in hopper)
    assert len({(c.block_m, c.block_n) for c in hopper}) == len(hopper)
    assert len({c.replace(block_m=64, block_n=64) for c in hopper}) == 1
