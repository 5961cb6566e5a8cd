"""The launch path on the GPU: 64-bit batch and sequence offsets, and a fresh process that
runs a kernel from the disk cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import attnlab
from attnlab import policy, reference
from attnlab.device import arch_of

pytestmark = pytest.mark.gpu


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(x.double() - ref) / torch.linalg.vector_norm(ref)).item()


@pytest.mark.large_memory
@pytest.mark.parametrize("kernel", ["default", "mma_sync"])
def test_a_cache_past_2_31_elements(kernel):
    """B=64 x 32k keys x 8 heads x hd128: k and v span 2**31 elements each (the serving cache
    the issue names); batch elements past the 32-bit range must read their own keys."""
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim = 64, 16, 32768, 32, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(64)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
    v = torch.randn_like(k)
    assert k.numel() >= 2**31
    config = None if kernel == "default" else policy.mma_sync_default_for(arch_of(), head_dim)
    out = torch.full_like(q, float("nan"))
    attnlab.attention(q, k, v, out=out, config=config)
    assert not out.isnan().any()
    for b in (0, 40, batch - 1):  # batch 40 on starts past 2**31 elements of k
        ref = reference.attention(q[b:b + 1], k[b:b + 1], v[b:b + 1],
                                  compute_dtype=torch.float64)
        assert rel_l2(out[b:b + 1], ref) < 1e-2, b
    del k, v
    torch.cuda.empty_cache()


@pytest.mark.large_memory
def test_a_packed_batch_past_2_31_elements():
    """Packed keys of 2.1M rows x 8 heads x hd128: the last sequence starts past 2**31."""
    heads, heads_kv, head_dim = 16, 8, 128
    seqlens_q, seqlens_k = [16, 16, 16], [1 << 20, 1 << 20, 50000]
    gen = torch.Generator(device="cuda").manual_seed(65)
    q = torch.randn(sum(seqlens_q), heads, head_dim, device="cuda", dtype=torch.float16,
                    generator=gen)
    k = torch.randn(sum(seqlens_k), heads_kv, head_dim, device="cuda", dtype=torch.float16,
                    generator=gen)
    v = torch.randn_like(k)
    assert k.numel() >= 2**31

    def offsets(lengths):
        return torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)

    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    out = attnlab.attention_varlen(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k))
    start = sum(seqlens_k[:2])
    ref = reference.attention(q[None, 32:], k[None, start:], v[None, start:],
                              compute_dtype=torch.float64)
    assert rel_l2(out[None, 32:], ref) < 1e-2
    del k, v
    torch.cuda.empty_cache()


_FRESH = """
import json, sys, time, torch
import attnlab
gen = torch.Generator(device="cuda").manual_seed(3)
q, k, v = (torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
           for _ in range(3))
torch.cuda.synchronize()
start = time.perf_counter()
out = attnlab.attention(q, k, v, causal=True)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
ref = attnlab.reference.attention(q, k, v, causal=True, compute_dtype=torch.float64)
err = ((out.double() - ref).norm() / ref.norm()).item()
print(json.dumps({"seconds": seconds, "err": err, "cutlass": "cutlass" in sys.modules}))
"""


def test_a_fresh_process_runs_a_kernel_from_the_disk_cache(tmp_path):
    env = {**os.environ, "ATTNLAB_CACHE_DIR": str(tmp_path), "ATTNLAB_DISK_CACHE": "1"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _FRESH], env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-4000:]
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    cold, warm = runs
    assert cold["err"] < 1e-2 and warm["err"] < 1e-2
    assert cold["cutlass"]  # the first process compiled
    linked = any(p.suffix == ".so" for p in tmp_path.rglob("*"))
    assert warm["cutlass"] == (not linked)  # a linked kernel loads without the CuTe DSL
    assert warm["seconds"] < cold["seconds"]
