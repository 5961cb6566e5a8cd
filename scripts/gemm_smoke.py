"""Small GEMMs, each in a child process with a time limit: which plan fails or hangs first
(``python3 scripts/gemm_smoke.py``)."""

import subprocess
import sys

#: (m, n, k, B as a transposed weight, config expression)
CASES = [(256, 256, 256, False, "GemmConfig(split_k=1)"),
         (128, 256, 64, False, "GemmConfig(split_k=1)"),
         (128, 128, 128, False, "GemmConfig(block_m=64, block_n=128, split_k=1)"),
         (512, 512, 4096, True, "None"),
         (4096, 4096, 4096, False, "None")]
BODY = """
import torch, traceback, time
from attnlab.gemm import GemmConfig, matmul
m, n, k, weight, cfg = {case}
a = torch.randn(m, k, device='cuda', dtype=torch.bfloat16)
b = torch.randn(k, n, device='cuda', dtype=torch.bfloat16)
if weight:
    b = b.t().contiguous().t()
try:
    c = matmul(a, b, config=cfg)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    print('rel err', ((c.double() - ref).norm() / ref.norm()).item(), c.flatten()[:4].tolist())
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20):
        matmul(a, b, config=cfg)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / 20 * 1e3
    print(f'{ms:.3f} ms  {2 * m * n * k / ms / 1e9:.0f} TFLOP/s')
except Exception:
    traceback.print_exc()
"""
for m, n, k, weight, cfg in CASES:
    print("==", m, n, k, weight, cfg, flush=True)
    case = f"{m}, {n}, {k}, {weight}, {cfg}"
    try:
        out = subprocess.run([sys.executable, "-c", BODY.replace("{case}", case)],
                             capture_output=True, text=True, timeout=60)
        print(out.stdout[-1500:], out.stderr[-2500:], flush=True)
    except subprocess.TimeoutExpired:
        print("TIMEOUT (hang)", flush=True)
