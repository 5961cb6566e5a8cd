"""One ragged batch of packed sequences, timed like a dense point: the Hopper table's varlen
row (``scripts/hopper_table.py``) and the varlen candidates (``scripts/sm90_candidates.py``).

SDPA takes no packed sequences, so FA4's ``flash_attn_varlen_func`` is the only peer.
TFLOP/s count each sequence's own FLOPs (a causal sequence half of its square).
"""

from __future__ import annotations

import torch

from attnlab import device, dispatch
from attnlab.api import attention_varlen
from attnlab.bench.runner import AttentionFn, Point, Result, measure_point
from attnlab.bench.timing import attention_flops
from attnlab.config import FlashConfig
from attnlab.validation import check_varlen_inputs

#: 16 sequences, 32768 tokens, from 256 to 4096 each.
RAGGED_SEQLENS = (4096, 256, 3072, 1024, 2048, 512, 4096, 1536, 2560, 768, 3584, 1280, 2304,
                  1792, 3328, 512)
HEADS = 16
INPUT_SETS = 4


class RaggedBatch:
    """The packed batch at one head dim and dtype: offsets, rotating q/k/v sets (one tensor
    is 128 MiB at hd128, far past L2) and the FLOPs of a call."""

    def __init__(self, head_dim: int, dtype: str, seqlens: tuple[int, ...] = RAGGED_SEQLENS,
                 heads: int = HEADS):
        self.seqlens, self.heads, self.head_dim, self.dtype = seqlens, heads, head_dim, dtype
        self.cu = torch.tensor([0, *seqlens]).cumsum(0).to(torch.int32).cuda()
        self.total, self.longest = int(self.cu[-1]), max(seqlens)
        gen = torch.Generator(device="cuda").manual_seed(7)
        dt = getattr(torch, dtype)
        self.sets = [tuple(torch.randn(self.total, heads, head_dim, device="cuda", dtype=dt,
                                       generator=gen) for _ in range(3))
                     for _ in range(INPUT_SETS)]

    def flops(self, causal: bool) -> float:
        return sum(attention_flops(1, self.heads, s, s, self.head_dim, causal)
                   for s in self.seqlens)

    def label(self, causal: bool) -> str:
        return (f"{self.dtype} varlen hd{self.head_dim} H={self.heads} {len(self.seqlens)} "
                f"seqs {self.total} tokens{' causal' if causal else ''}")

    def default_config(self, causal: bool) -> FlashConfig:
        """What ``attention_varlen`` runs on this batch without a config."""
        q, k, _ = self.sets[0]
        problem = check_varlen_inputs(q, k, k, self.cu, self.cu, self.longest, self.longest,
                                      causal=causal)
        return dispatch.config_for(device.info(q.device), problem)

    def attnlab(self, config: FlashConfig | None = None) -> AttentionFn:
        """attnlab's varlen call (``config``: None for the one ``attention_varlen`` picks)."""
        def fn(q, k, v, scale, causal):
            return attention_varlen(q, k, v, self.cu, self.cu, self.longest, self.longest,
                                    softmax_scale=scale, causal=causal, config=config)
        return fn

    def fa4(self) -> AttentionFn | None:
        """FA4's varlen call, or None where ``flash_attn.cute`` does not import."""
        try:
            from flash_attn.cute import flash_attn_varlen_func
        except ImportError:
            return None

        def fn(q, k, v, scale, causal):
            return flash_attn_varlen_func(q, k, v, cu_seqlens_q=self.cu, cu_seqlens_k=self.cu,
                                          max_seqlen_q=self.longest, max_seqlen_k=self.longest,
                                          softmax_scale=scale, causal=causal)[0]
        return fn

    def measure(self, impls: dict[str, AttentionFn], causal: bool, runs: int) -> dict:
        """A table row: ``{"point": label, impl: [TFLOP/s end to end, device only, error]}``."""
        # A stand-in point for the timing: only its dtype, head dim and mask are read.
        point = Point(1, self.total, self.total, self.heads, self.head_dim, self.dtype, causal)
        results: list[Result] = measure_point(point, impls, runs=runs, sets=self.sets)
        flops = self.flops(causal)
        row: dict = {"point": self.label(causal)}
        for r in results:
            row[r.impl] = ([flops / r.timing.median_ms / 1e9,
                            flops / r.device_timing.median_ms / 1e9, None]
                           if r.timing else [None, None, r.error])
        return row
