"""``attnlab.conv.conv2d`` on the GPU (issue 23): against torch's fp32 convolution at the
lab's SD-UNet shapes, odd sizes and stride 2, with and without bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.conv import conv2d

pytestmark = pytest.mark.gpu


def _case(n, c, hw, k, r, dtype):
    """Random channels-last ``x``, filters scaled to unit-variance outputs, and a bias."""
    gen = torch.Generator(device="cuda").manual_seed(c + k)
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype, generator=gen).to(
        memory_format=torch.channels_last)
    w = torch.randn(k, c, r, r, device="cuda", dtype=dtype, generator=gen) / (c * r * r) ** 0.5
    return x, w, torch.randn(k, device="cuda", dtype=dtype, generator=gen)


def _assert_matches(out, x, w, bias, stride, padding):
    """Against ``F.conv2d`` in fp32: shape, channels-last, finite, relative error within the
    16-bit type's bound."""
    ref = F.conv2d(x.float(), w.float(), bias.float(), stride=stride, padding=padding)
    assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.isfinite(out).all()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < (8e-3 if x.dtype == torch.bfloat16 else 1.5e-3), err


def _poison_allocator(dev: str = "cuda") -> None:
    """Leave NaNs in the blocks torch's caching allocator hands out next, so an output the
    kernel fails to write shows up as NaN instead of an old, plausible value."""
    torch.full((64 << 20,), float("nan"), device=dev, dtype=torch.float32)


@pytest.mark.parametrize("algorithm", ["implicit", "im2col", "direct"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,c,hw,k,r,stride,padding", [
    (1, 320, 32, 320, 3, 1, 1), (4, 64, 64, 64, 3, 1, 1), (1, 640, 16, 640, 1, 1, 0),
    (2, 128, 33, 256, 3, 2, 1), (1, 8, 7, 16, 3, 1, 0), (3, 64, 13, 72, 3, 1, 1),
    (2, 192, 20, 64, 3, 2, 1), (1, 128, 9, 136, 1, 2, 0)])
def test_conv2d_matches_torch(n, c, hw, k, r, stride, padding, dtype, algorithm):
    if algorithm == "implicit" and c % 64:
        pytest.skip("the implicit GEMM takes channels in multiples of 64 (auto: im2col)")
    x, w, bias = _case(n, c, hw, k, r, dtype)
    _poison_allocator()
    out = conv2d(x, w, bias, stride=stride, padding=padding, algorithm=algorithm)
    _assert_matches(out, x, w, bias, stride, padding)


@pytest.mark.parametrize("mode,splits", [("serial", 2), ("cluster", 2), ("cluster", 4),
                                         ("cluster", 8)])
def test_implicit_conv_split_k_adds_the_bias_once(mode, splits):
    """K split in slices that meet serially or in a cluster: the bias added once, by the
    slice (or band) that writes the output, at an odd-sized level."""
    from attnlab.gemm import GemmConfig

    x, w, bias = _case(1, 640, 13, 320, 3, torch.bfloat16)
    cfg = GemmConfig(block_m=64, block_n=64, split_k=splits, split_mode=mode)
    _poison_allocator()
    out = conv2d(x, w, bias, padding=1, algorithm="implicit", config=cfg)
    _assert_matches(out, x, w, bias, 1, 1)


def test_conv2d_auto_picks_implicit_where_it_runs_and_refuses_it_with_the_reason():
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1, 32, 8, 8, device="cuda", generator=gen).to(
        torch.bfloat16, memory_format=torch.channels_last)
    w = torch.randn(16, 32, 3, 3, device="cuda", generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 64"):
        conv2d(x, w, algorithm="implicit")
    ref = F.conv2d(x.float(), w.float(), padding=1)
    out = conv2d(x, w)  # auto: im2col here
    assert ((out.float() - ref).norm() / ref.norm()).item() < 8e-3
    from attnlab.conv.api import plan_label

    assert plan_label(x, w) == "im2col"
    big, filters, _ = _case(4, 320, 64, 320, 3, torch.bfloat16)
    assert plan_label(big, filters) == "implicit 128x160x64 s1"  # the conv dispatch's tile
    small, filters, _ = _case(1, 640, 32, 640, 3, torch.bfloat16)
    assert plan_label(small, filters) == "implicit 64x160x64 s2 cluster"  # split, clustered


def _image(n, c, hw, dtype, seed, scale=1.0, shift=0.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=torch.float32, generator=gen)
    return (x * scale + shift).to(dtype).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,c,hw,groups,shift", [(1, 320, 64, 32, 0.0), (4, 640, 16, 32, 0.0),
                                                 (2, 64, 33, 32, 3.0), (1, 128, 8, 4, 0.0),
                                                 (3, 96, 40, 3, -2.0)])
def test_group_norm_silu_matches_torch(n, c, hw, groups, shift, dtype):
    from attnlab.conv import group_norm_silu

    x = _image(n, c, hw, dtype, c + hw, shift=shift)
    gen = torch.Generator(device="cuda").manual_seed(1)
    weight = 1 + 0.1 * torch.randn(c, device="cuda", generator=gen)
    bias = 0.1 * torch.randn(c, device="cuda", generator=gen)
    y = group_norm_silu(x, groups, weight, bias)
    ref = F.silu(F.group_norm(x.float(), groups, weight, bias, 1e-5))
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
    assert torch.isfinite(y).all()
    err = ((y.float() - ref).norm() / ref.norm()).item()
    assert err < (8e-3 if dtype == torch.bfloat16 else 1.5e-3), err


def test_resblock_matches_torch():
    from attnlab.conv import resblock

    c, dtype = 320, torch.bfloat16
    x = _image(1, c, 32, dtype, 7)
    gen = torch.Generator(device="cuda").manual_seed(2)

    def params():
        return (1 + 0.1 * torch.randn(c, device="cuda", generator=gen),
                0.1 * torch.randn(c, device="cuda", generator=gen))

    def conv():
        w = torch.randn(c, c, 3, 3, device="cuda", generator=gen) / (9 * c) ** 0.5
        return w.to(dtype), (0.1 * torch.randn(c, device="cuda", generator=gen)).to(dtype)

    norm1, conv1, norm2, conv2 = params(), conv(), params(), conv()
    out = resblock(x, norm1, conv1, norm2, conv2)

    def ref_chain(t):
        h = F.conv2d(F.silu(F.group_norm(t, 32, *norm1)), conv1[0].float(), conv1[1].float(),
                     padding=1)
        h = F.conv2d(F.silu(F.group_norm(h, 32, *norm2)), conv2[0].float(), conv2[1].float(),
                     padding=1)
        return t + h

    ref = ref_chain(x.float())
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert torch.isfinite(out).all() and err < 2e-2, err


@pytest.mark.parametrize("step", ["c01", "c02", "c03", "c04", "c05", "c06"])
def test_every_conv_ladder_step_matches_torch(step):
    from attnlab.conv.ladder import step_conv

    gen = torch.Generator(device="cuda").manual_seed(11)
    # Whole tiles of the mma.sync step (512 pixels, 192 output channels).
    x = torch.randn(2, 128, 16, 16, device="cuda", generator=gen).to(
        torch.bfloat16, memory_format=torch.channels_last)
    w = (torch.randn(192, 128, 3, 3, device="cuda", generator=gen) / 34).to(torch.bfloat16)
    bias = torch.randn(192, device="cuda", generator=gen).to(torch.bfloat16)
    _poison_allocator()
    out = step_conv(step)(x, w, bias, 1, 1)
    ref = F.conv2d(x.float(), w.float(), bias.float(), padding=1)
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 8e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,c,hw,k,r,stride,padding", [
    (2, 64, 16, 64, 3, 2, 1), (1, 96, 32, 128, 3, 1, 1), (2, 32, 8, 64, 1, 1, 0)])
def test_the_mma_sync_implicit_gemm_with_coordinate_tables_matches_torch(
        n, c, hw, k, r, stride, padding, dtype):
    """The lab's Insight 9 kernel: every window's rows gathered by cp.async (zeros in the
    padding), stride 2, 1 x 1, both dtypes; and its whole-tile rule refused with the reason."""
    from attnlab.gemm_config import MmaGemmConfig

    config = MmaGemmConfig(block_n=64, warps_n=2, swizzle="xor")
    x, w, bias = _case(n, c, hw, k, r, dtype)
    _poison_allocator()
    out = conv2d(x, w, bias, stride=stride, padding=padding, algorithm="implicit",
                 config=config)
    _assert_matches(out, x, w, bias, stride, padding)
    with pytest.raises(ValueError, match="whole tiles"):
        conv2d(x, w[:8], stride=stride, padding=padding, algorithm="implicit", config=config)
