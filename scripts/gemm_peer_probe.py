"""What cuBLAS runs at one GEMM shape beside ours: kernel names and launch shapes from the
torch profiler (``python3 scripts/gemm_peer_probe.py --shape 512,512,4096``); run under
``ncu`` with ``--calls`` to count one launch of each."""

import argparse

import torch

from attnlab.gemm import matmul


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="512,512,4096")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split(","))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        torch.matmul(a, b)
        matmul(a, b)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            torch.matmul(a, b)
            matmul(a, b)
        torch.cuda.synchronize()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            print(f"{event.device_time:8.2f} us  {event.name[:200]}")


if __name__ == "__main__":
    main()
