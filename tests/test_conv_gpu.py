"""``attnlab.conv.conv2d`` on the GPU (issue 23): against torch's fp32 convolution at the
lab's SD-UNet shapes, odd sizes and stride 2, with and without bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.conv import conv2d

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,c,hw,k,r,stride,padding", [
    (1, 320, 32, 320, 3, 1, 1), (4, 64, 64, 64, 3, 1, 1), (1, 640, 16, 640, 1, 1, 0),
    (2, 128, 33, 256, 3, 2, 1), (1, 8, 7, 16, 3, 1, 0)])
def test_conv2d_matches_torch(n, c, hw, k, r, stride, padding, dtype):
    gen = torch.Generator(device="cuda").manual_seed(c + k)
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype, generator=gen).to(
        memory_format=torch.channels_last)
    w = torch.randn(k, c, r, r, device="cuda", dtype=dtype, generator=gen) / (c * r * r) ** 0.5
    bias = torch.randn(k, device="cuda", dtype=dtype, generator=gen)
    out = conv2d(x, w, bias, stride=stride, padding=padding)
    ref = F.conv2d(x.float(), w.float(), bias.float(), stride=stride, padding=padding)
    assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.isfinite(out).all()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < (8e-3 if dtype == torch.bfloat16 else 1.5e-3), err
