"""An ncu target: ``attention_with_kvcache`` at one decoding point, five calls (the last ones
profiled), e.g. ``ncu --metrics gpu__time_duration.sum --launch-skip 6 --launch-count 2
python scripts/decode_ncu_target.py BATCH CACHE_LEN HEADS_Q HEADS_KV`` (bf16, hd128): the
decoding kernel's and the combine's durations apart from the gaps between launches
(``docs/decode.md``)."""
import sys

import torch

import attnlab

batch, cache, heads_q, heads_kv = (int(a) for a in sys.argv[1:5])
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(batch, 1, heads_q, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(batch, cache, heads_kv, 128, device="cuda", dtype=torch.bfloat16,
                    generator=gen) for _ in range(2))
for _ in range(5):
    attnlab.attention_with_kvcache(q, k, v)
torch.cuda.synchronize()
