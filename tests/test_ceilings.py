"""The mma.sync ceiling: the probe kernel is HMMAs and nothing else (CPU, cross-compiled), it
runs at least as fast as the attention kernel built on the same instruction (GPU), and the
roofline draws it."""

from __future__ import annotations

import pytest

from attnlab.analysis.resources import read_resources
from attnlab.analysis.sass import disassemble, histogram, parse
from attnlab.jit import compile_kernel, dumped_binary


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_mma_sync_probe_is_a_loop_of_independent_hmma(arch, tmp_path):
    import cutlass

    from attnlab.kernels.sm80.mma_rate import MmaSyncRate

    probe = MmaSyncRate(cutlass.BFloat16, chains=8)
    compile_kernel(probe, probe.fake_args(), arch=arch, dump_dir=tmp_path)
    cubin, _ = dumped_binary(tmp_path)
    sass = disassemble(cubin)
    ops = histogram(parse(sass))
    # The loop is unrolled 8 times, each step one MMA per chain; nothing touches memory but
    # the final store of each thread's sum.
    assert ops["HMMA"] == 8 * probe.chains
    assert not {"LDG", "LDS", "LDSM", "STS", "LDL", "STL"} & set(ops)
    assert ops["STG"] == 1
    accumulators = {line.split()[2] for line in sass.splitlines() if "HMMA" in line}
    assert len(accumulators) == probe.chains  # independent: one destination per chain
    resources = read_resources(cubin, sass)
    assert resources.stack_bytes == 0 and resources.spill_stores == 0


def test_roofline_draws_the_mma_sync_roof(tmp_path):
    from attnlab.analysis.roofline import RooflinePoint, plot_roofline

    point = RooflinePoint("k16", 1e12, 3e-3, 1e9, 4e9)
    plain = plot_roofline([point], 3e12, 8e12, 7e14, tmp_path / "plain.png")
    both = plot_roofline([point], 3e12, 8e12, 7e14, tmp_path / "both.png",
                         mma_sync_flops_per_s=4e14)
    assert plain.stat().st_size > 0 and both.stat().st_size > 0
    assert plain.read_bytes() != both.read_bytes()


@pytest.mark.gpu
def test_mma_sync_rate_bounds_the_attention_kernel():
    """The probe must beat the attention kernel that uses its instruction (else it measures
    too little), and stay under the GPU's best bf16 GEMM (wgmma on Hopper, HMMA before).
    The attention kernel is the mma.sync default, which ``attention()`` would not pick on
    Hopper (it runs wgmma there)."""
    import torch

    from attnlab.api import attention
    from attnlab.bench.ceilings import matmul_rate, mma_sync_rate
    from attnlab.bench.timing import attention_flops, time_calls
    from attnlab.device import arch_of
    from attnlab.policy import mma_sync_default_for

    rate = mma_sync_rate(runs=10)
    q, k, v = (torch.randn(1, 4096, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    config = mma_sync_default_for(arch_of(), 128)
    kernel = time_calls(lambda i: attention(q, k, v, config=config), warmup=3, runs=10)
    attention_rate = attention_flops(1, 16, 4096, 4096, 128) / (kernel.median_ms * 1e-3)
    assert attention_rate < rate < 1.1 * matmul_rate(runs=10)
