"""The two ceilings of a roofline, measured on the GPU at hand (datasheet rates are leads)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from attnlab.bench.timing import time_calls


@dataclass(frozen=True)
class Ceilings:
    """Bytes/s of a device-to-device copy (read + write) and of an L2-resident copy, and the
    bf16 matrix rate (FLOP/s) of a large GEMM on random data."""

    dram_bytes_per_s: float
    l2_bytes_per_s: float
    matmul_flops_per_s: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _copy_rate(nbytes: int, runs: int) -> float:
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    timing = time_calls(lambda i: dst.copy_(src), warmup=3, runs=runs)
    return 2 * nbytes / (timing.median_ms * 1e-3)


def measure_ceilings(runs: int = 20) -> Ceilings:
    """Copy 2 GiB (DRAM), copy 8 MiB over and over (fits in L2), multiply 8192^3 in bf16."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    gemm = time_calls(lambda i: a @ b, warmup=3, runs=runs)
    return Ceilings(_copy_rate(2 << 30, runs), _copy_rate(8 << 20, runs * 5),
                    2 * n**3 / (gemm.median_ms * 1e-3))
