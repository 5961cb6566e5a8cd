"""An ncu target: the default backward alone, three times, at one point (bf16, 16k tokens,
hidden 2048), e.g. ``ncu --set full -k regex:Backward --launch-skip 2 --launch-count 1
python scripts/bwd_ncu_target.py HEAD_DIM SEQLEN CAUSAL(0|1)`` (docs/backward.md's profiles).
"""
import math
import sys

import torch

import attnlab
from attnlab import backward

hd, s, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
B, H = 16384 // s, 2048 // hd
q, k, v, do = (torch.randn(B, s, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(4))
out, lse = attnlab.attention(q, k, v, causal=causal, return_lse=True)
for _ in range(3):
    backward.attention_backward(do, q, k, v, out, lse, None, None, None, None, None,
                                1 / math.sqrt(hd), (-1, 0) if causal else (-1, -1))
torch.cuda.synchronize()
