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




@pytest.mark.parametrize("dynamic", [False, True])
def test_stream_reader_keeps_its_rounds_in_flight(dynamic, tmp_path):
    """The read-ceiling study's reader: a round is UNROLL 16-byte ``cp.async`` copies a
    thread, then one commit and a wait that leaves STAGES - 1 rounds outstanding; the dynamic
    reader takes its chunks by one atomic add, the static one has none; no local memory."""
    from attnlab.kernels.common.stream_read import STAGES, UNROLL, compile_stream_read

    compile_stream_read("sm_90a", 256 << 10, dynamic, dump_dir=tmp_path)
    cubin, _ = dumped_binary(tmp_path)
    sass = disassemble(cubin)
    ops = histogram(parse(sass))
    assert ops["LDGSTS"] == UNROLL and ops["LDGDEPBAR"] == 1
    assert f"DEPBAR.LE SB0, 0x{STAGES - 1:x}" in sass
    assert ops.get("ATOMG", 0) == int(dynamic)
    assert not {"LDL", "STL"} & set(ops)


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_stream_reader_hands_out_every_chunk_once(dynamic):
    """A call's counter moves by exactly the buffer's chunk count (the next call's ``base``),
    and every CTA stamps a start before its end."""
    import torch

    from attnlab import device
    from attnlab.kernels.common.stream_read import THREADS, compile_stream_read

    chunk, grid = 64 << 10, 16
    reader = compile_stream_read(device.info().arch, chunk, dynamic)
    buf = torch.randint(-2**31, 2**31 - 1, (48 * chunk // 4,), device="cuda", dtype=torch.int32)
    counter = torch.full((1,), 5, device="cuda", dtype=torch.int32)
    sink = torch.empty(grid * THREADS, device="cuda", dtype=torch.int32)
    for call in range(2):
        stamps = torch.zeros(2 * grid, device="cuda", dtype=torch.int64)
        reader(buf, counter, stamps, sink, 5 + call * 48)
        torch.cuda.synchronize()
        assert counter.item() == 5 + (call + 1) * 48 * dynamic
        clock = stamps.view(grid, 2)
        assert bool((clock[:, 0] > 0).all()) and bool((clock[:, 1] > clock[:, 0]).all())
