"""Autotuning: a search space of kernel configs, pruning by static facts, timing, a cache.

``space`` lists candidates, ``prune`` drops the ones that cannot win (compile errors, spills,
shared memory, occupancy) from their cross-compiled artifacts, ``search`` times the rest
against the default, and ``cache`` keeps the winner per (GPU, dtype, head dim, causal, seqlen
bucket) for ``attention()``.
"""
