"""ncu on the implicit-GEMM convolution at one SD-UNet shape (the 16^2 levels that miss cuDNN):
``ncu ... python3 scripts/conv_profile.py N C HW [BMxBN]`` runs 12 calls after a warm-up; profile
the last with ``--launch-skip 11 --launch-count 1``."""

import sys

import torch

from attnlab.conv import conv2d
from attnlab.gemm import GemmConfig

n, c, hw = (int(v) for v in sys.argv[1:4])
config = None
if len(sys.argv) > 4:
    bm, bn = (int(v) for v in sys.argv[4].split("x"))
    config = GemmConfig(block_m=bm, block_n=bn)
x = torch.randn(n, c, hw, hw, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
w = torch.randn(c, c, 3, 3, device="cuda").to(torch.bfloat16, memory_format=torch.channels_last)
b = torch.randn(c, device="cuda").to(torch.bfloat16)
for _ in range(12):
    conv2d(x, w, b, algorithm="implicit", config=config)
torch.cuda.synchronize()
