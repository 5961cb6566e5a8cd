"""The two ceilings of a roofline, measured on the GPU at hand (datasheet rates are leads)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnlab.bench.timing import time_calls


@dataclass(frozen=True)
class Ceilings:
    """Bytes/s of a device-to-device copy (read + write), bytes/s read from an L2-resident
    buffer, the bf16 matrix rate (FLOP/s) of a large GEMM on random data (the library's best
    tensor-core path), and the bf16 rate of ``mma.sync`` alone (the instruction of attnlab's
    ``mma.sync`` kernel: ``kernels/sm80/mma_rate.py``)."""

    dram_bytes_per_s: float
    l2_bytes_per_s: float
    matmul_flops_per_s: float
    mma_sync_flops_per_s: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _copy_rate(nbytes: int, runs: int) -> float:
    """Bytes/s (read + write) of copying ``nbytes`` device to device."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    timing = time_calls(lambda i: dst.copy_(src), warmup=3, runs=runs)
    return 2 * nbytes / (timing.median_ms * 1e-3)


def dram_read_rate(nbytes: int = 2 << 30, runs: int = 10) -> float:
    """Bytes/s read from DRAM: one reduction over a buffer far larger than L2 (the roof of
    a kernel that only reads, as decoding does)."""
    buffer = torch.randn(nbytes // 4, device="cuda", dtype=torch.float32)
    total = torch.empty((), device="cuda", dtype=torch.float32)
    timing = time_calls(lambda i: torch.sum(buffer, dim=0, out=total), warmup=3, runs=runs)
    return nbytes / (timing.median_ms * 1e-3)


def _l2_read_rate(nbytes: int, runs: int, passes: int = 64) -> float:
    """Bytes/s read from an L2-resident buffer: one reduction kernel sums ``passes`` rows that
    are all the same buffer (a stride-0 view), so each launch reads ``passes x nbytes`` from
    L2 and launch overhead cannot dominate; reads only, so nothing evicts the buffer."""
    buffer = torch.randn(nbytes // 4, device="cuda", dtype=torch.float32)
    rows = buffer.unsqueeze(0).expand(passes, -1)
    sums = torch.empty(passes, device="cuda", dtype=torch.float32)
    timing = time_calls(lambda i: torch.sum(rows, dim=1, out=sums), warmup=3, runs=runs)
    return nbytes * passes / (timing.median_ms * 1e-3)


def matmul_rate(runs: int = 20, n: int = 8192) -> float:
    """FLOP/s of one ``n``^3 bf16 GEMM (torch, i.e. cuBLAS) on random data."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    gemm = time_calls(lambda i: a @ b, warmup=3, runs=runs)
    return 2 * n**3 / (gemm.median_ms * 1e-3)


def mma_sync_rate(runs: int = 20, ctas_per_sm: int = 4) -> float:
    """FLOP/s of bf16 ``mma.sync`` m16n8k16 from registers, ``ctas_per_sm`` CTAs of 8 warps
    per SM (8 warps per sub-partition: far more than its tensor pipe needs)."""
    import cutlass

    from attnlab import device
    from attnlab.jit import compile_kernel
    from attnlab.kernels.sm80.mma_rate import MmaSyncRate

    probe = MmaSyncRate(cutlass.BFloat16)
    gpu = device.info()
    num_ctas = gpu.multiprocessors * ctas_per_sm
    out = torch.empty(num_ctas * 32 * probe.num_warps, device="cuda", dtype=torch.float32)
    kernel = compile_kernel(probe, probe.fake_args(), arch=gpu.arch)
    timing = time_calls(lambda i: kernel(out, num_ctas), warmup=3, runs=runs)
    if not torch.isfinite(out).all():
        raise RuntimeError("the mma.sync probe produced non-finite sums")
    return probe.flops(num_ctas) / (timing.median_ms * 1e-3)


def measure_ceilings(runs: int = 20) -> Ceilings:
    """Copy 2 GiB (DRAM), read half of the L2 over and over, multiply 8192^3 in bf16, and
    run the ``mma.sync`` probe."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return Ceilings(_copy_rate(2 << 30, runs), _l2_read_rate(l2 // 2, runs),
                    matmul_rate(runs), mma_sync_rate(runs))
