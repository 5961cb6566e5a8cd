"""The online FP16 -> INT8 GEMM (``attnlab.gemm.online``, issue 22) without a GPU: the torch
reference of its arithmetic, the call's refusals, and the kernel cross-compiled for sm_80 and
sm_90a (s8 MMAs by inline PTX on the 16-bit tiled MMA's fragments)."""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ConfigError
from attnlab.gemm import online_int8_matmul
from attnlab.gemm.online import ONLINE_CONFIG, online_int8_reference
from attnlab.gemm_config import MmaGemmConfig
from attnlab.kernels.gemm.abi import GemmSpec


def test_reference_quantizes_each_k_tile_against_its_own_rows():
    """A K tile whose rows are integers up to 127 comes through exactly, and so does a row
    of 0.5 beside a tile of 1000s (the scale is per row and tile: a huge value in one tile
    costs the other tiles nothing); the error on Gaussian operands is the 8-bit rounding of
    both (about 0.8 %, not K-dependent)."""
    a = torch.zeros(2, 128, dtype=torch.float16)
    a[0, :64] = torch.arange(64) - 63.0
    a[0, 1] = 127
    a[1, :64] = 0.5
    a[1, 64:] = 1000.0 * (torch.arange(64) % 3 - 1)
    b = torch.eye(128, dtype=torch.float16)[:, :8]
    torch.testing.assert_close(online_int8_reference(a, b), a[:, :8].double(), rtol=1e-12,
                               atol=0)
    torch.manual_seed(0)
    for k in (64, 1000, 4096):
        a, b = torch.randn(64, k).half(), torch.randn(k, 64).half()
        exact = a.double() @ b.double()
        err = ((online_int8_reference(a, b) - exact).norm() / exact.norm()).item()
        assert 0.005 < err < 0.012, (k, err)


def test_online_int8_refuses_bad_calls():
    a, b = torch.randn(8, 32, dtype=torch.float16), torch.randn(32, 8, dtype=torch.float16)
    with pytest.raises(TypeError, match="fp16 or bf16"):
        online_int8_matmul(a.float(), b.float())
    with pytest.raises(TypeError, match="share one dtype"):
        online_int8_matmul(a, b.bfloat16())
    with pytest.raises(ValueError, match="a's 32 columns"):
        online_int8_matmul(a, b[:16])
    with pytest.raises(ValueError, match="CUDA device"):
        online_int8_matmul(a, b)
    with pytest.raises(RuntimeError, match="no backward"):
        online_int8_matmul(a.requires_grad_(), b)


def test_the_online_spec_takes_the_mma_sync_kernel_at_k_step_64():
    for config in (MmaGemmConfig(), ONLINE_CONFIG.replace(ldmatrix=False)):
        with pytest.raises(ConfigError, match="online INT8"):
            GemmSpec(config, "sm_80", "float16", "float16", "k", "k", online_int8=True)
    with pytest.raises(ConfigError, match="separate kernels"):
        GemmSpec(ONLINE_CONFIG, "sm_80", "float16", "float16", "k", "k", online_int8=True,
                 sparse=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_online_kernel_quantizes_in_shared_memory_and_runs_s8_mmas(arch, dtype, tmp_path):
    """Per K tile of 64 a thread of the default tile (8 warps of 64 x 32 on 128 x 128): 32
    ``IMMA.16832.S8.S8`` (4 x 4 output blocks, two 32-deep steps) and no HMMA; the quantizing
    pass: 8 rows (4 of A, 4 of B) of 8 values each, 3 shuffles a row (24 ``SHFL``), one
    reciprocal a row (8 ``MUFU.RCP``, no division's slow-path call) and no ``F2I`` (the
    rounding is an FFMA against 1.5 * 2**23); one ``I2F`` per accumulator (64) to scale the
    tile's sums; two barriers (the ring's, then quantized tiles before the MMAs read them); no
    spill."""
    from attnlab.analysis.resources import read_resources
    from attnlab.analysis.sass import disassemble, histogram, parse
    from attnlab.jit import compile_spec, dumped_binary

    compile_spec(GemmSpec(ONLINE_CONFIG, arch, dtype, dtype, "k", "k", online_int8=True),
                 tmp_path)
    cubin = dumped_binary(tmp_path)[0]
    sass = disassemble(cubin)
    ops = histogram(parse(sass))
    mmas = {i.opcode for i in parse(sass) if i.base.endswith("MMA")}
    assert mmas == {"IMMA.16832.S8.S8"} and ops["IMMA"] == 32
    # sm_90 converts int32 to fp32 with I2FP, sm_80 with I2F.
    converts = ops.get("I2F", 0) + ops.get("I2FP", 0)
    assert "F2I" not in ops and "CALL" not in ops and ops["MUFU"] == 8
    assert ops["SHFL"] == 24 and converts == 64 and ops["BAR"] == 2
    assert not read_resources(cubin, sass).spills
