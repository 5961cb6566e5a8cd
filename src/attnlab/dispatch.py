"""Which kernel configuration serves a problem on a GPU.

The tuning cache's entry for (GPU, capability, dtype, head dim, mask, seqlen bucket) when
``attnlab tune`` wrote one; otherwise the built-in default of the GPU's architecture
(``attnlab.policy``). The choice depends only on that key, so it is made once per key and
process (``reload_tune_cache`` forgets the choices with the cache).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.config import FlashConfig
from attnlab.device import DeviceInfo, arch_of
from attnlab.memo import remember
from attnlab.policy import (
    MAX_IMBALANCE,
    SHORT_KV_SEQLEN,
    default_for,
    masked_lookup_seqlen,
    packed_walk,
    paired_row_blocks,
    row_blocks_pair,
)

if TYPE_CHECKING:
    from attnlab.tune.cache import TuneCache, TuneKey
    from attnlab.validation import Problem

__all__ = ["arch_of", "choose", "config_for", "reload_tune_cache", "tune_cache", "tune_key"]

_cache: TuneCache | None = None
_chosen: dict[tuple, FlashConfig] = {}


def tune_key(gpu: DeviceInfo, dtype: str, head_dim: int, seqlen_q: int,
             causal: bool = False) -> TuneKey:
    """The tuning-cache key of a problem on a GPU."""
    from attnlab.tune.cache import TuneKey, seqlen_bucket

    major, minor = gpu.capability
    return TuneKey(gpu.name, f"{major}{minor}", dtype, head_dim, causal,
                   seqlen_bucket(seqlen_q))


def tune_cache() -> TuneCache:
    """The tuning cache, read once per process (``attnlab tune`` refreshes it via ``reload``)."""
    global _cache
    if _cache is None:
        from attnlab.tune.cache import TuneCache

        _cache = TuneCache()
    return _cache


def reload_tune_cache() -> None:
    """Read the tuning cache again at the next call, and choose every config again."""
    global _cache
    _cache = None
    _chosen.clear()


def config_for(gpu: DeviceInfo, problem: Problem) -> FlashConfig:
    """The configuration ``attention()`` uses on ``gpu`` when the caller gives none."""
    from attnlab.tune.cache import seqlen_bucket

    seqlen = problem.seqlen_q if problem.varlen else masked_lookup_seqlen(
        problem.head_dim, problem.seqlen_q, problem.window)
    bucket = seqlen_bucket(seqlen)
    short_kv = problem.seqlen_k <= SHORT_KV_SEQLEN
    key = (gpu.index, problem.dtype, problem.head_dim, problem.windowed, problem.varlen, bucket,
           short_kv)
    if problem.windowed:
        # A masked call's grid depends on how its tiles balance (``_balanced``).
        key += (problem.batch * problem.num_heads, problem.seqlen_q, problem.seqlen_k,
                problem.window)
    else:
        # An unmasked one's on whether its row blocks pair up (``paired_row_blocks``).
        key += (problem.seqlen_q,)
    config = _chosen.get(key)
    if config is None:
        config = choose(gpu, problem, bucket, short_kv)
        # Keys hold exact lengths, which a server may see without bound.
        remember(_chosen, key, config)
    return config


def choose(gpu: DeviceInfo, problem: Problem, bucket: int, short_kv: bool) -> FlashConfig:
    """The choice for ``problem``, whose query length (a dense sliding window's:
    ``policy.masked_lookup_seqlen``) falls in ``bucket`` (the choice is memoised by bucket, so
    the default is looked up by it too) and whose keys number at most
    ``policy.SHORT_KV_SEQLEN`` when ``short_kv``."""
    dtype = problem.dtype_name
    # A masked call runs the windowed kernel: an entry tuned on plain attention does not
    # speak for it (their best knobs differ, docs/ladder.md). A band takes the entry of the
    # length it is looked up by, as it takes that length's default.
    tuned = tune_cache().get(tune_key(gpu, dtype, problem.head_dim, bucket,
                                      causal=problem.windowed))
    # The mma.sync kernel's TMA ring cannot serve packed sequences (FlashConfig.tma_kv_loads;
    # the wgmma kernel's boxes start at each sequence): such an entry gives way to the
    # varlen default.
    if tuned is not None and not (problem.varlen and tuned.tma_kv_loads and not tuned.wgmma):
        # The plain entry serves packed sequences too, whose row blocks no cluster shares and
        # whose tiles the host cannot weigh, and every length of its bucket, whose row blocks
        # may not pair.
        if problem.varlen:
            return packed_walk(tuned.replace(cluster_m=1), problem.head_dim, problem.windowed,
                               bucket)
        if not row_blocks_pair(tuned, problem.seqlen_q):
            return tuned.replace(cluster_m=1)
        return tuned
    config = default_for(gpu.arch, problem.head_dim, problem.windowed, dtype, problem.varlen,
                         bucket, short_kv)
    if problem.varlen:
        return config
    if config.persistent and problem.windowed:
        if not config.dynamic_tiles and not _balanced(config, problem, gpu):
            config = config.replace(dynamic_tiles=True)
    elif not (problem.windowed or short_kv):
        config = paired_row_blocks(config, problem.head_dim, problem.seqlen_q)
    return config


def _balanced(config: FlashConfig, problem: Problem, gpu: DeviceInfo) -> bool:
    """Whether a persistent grid (one CTA per SM) walks a masked problem's tiles, in the
    static order, with its busiest CTA within ``MAX_IMBALANCE`` of the average (dense
    batches: ``tile_order``, the kernels' arithmetic without importing the DSL)."""
    from attnlab.kernels.abi import encode_window
    from attnlab.kernels.common.tile_order import (
        heads_per_section,
        kv_block_range,
        snake_imbalance,
    )

    left, right = encode_window(problem.window)
    section = None
    if config.lpt:
        section = heads_per_section(problem.seqlen_k,
                                    2 * problem.head_dim * problem.dtype.itemsize,
                                    problem.num_heads // problem.num_heads_kv,
                                    config.l2_section_mb << 20)

    def blocks(m_block: int) -> int:
        n_min, n_max = kv_block_range(m_block * config.block_m, problem.seqlen_q,
                                      problem.seqlen_k, left, right, config.block_m,
                                      config.block_n, True)
        return n_max - n_min

    m_blocks = -(-problem.seqlen_q // config.block_m)
    return snake_imbalance(m_blocks, problem.batch, problem.num_heads, True, section,
                           gpu.multiprocessors, blocks) <= MAX_IMBALANCE
