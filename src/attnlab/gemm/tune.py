"""Tuning the GEMM on this GPU: time candidate configs per shape, keep the best in the tuning
cache (``attnlab tune --family gemm``), which ``matmul`` reads before the dispatch model.

A GEMM entry is keyed by the GPU, the dtypes and the exact shape (``gemm|...``): a model's
projections are a handful of shapes called millions of times, so each is worth its own
search. The candidates are the tiles the dispatch model weighs, each with the ring depth and
raster order varied, and the split counts its model would consider, so the model's choice is
always among them and the entry can only be as fast or faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from attnlab.config import ConfigError
from attnlab.device import DeviceInfo
from attnlab.gemm.dispatch import TILES, deep_enough, plan
from attnlab.gemm_config import MAX_STAGES, GemmConfig
from attnlab.tune.cache import TuneCache

#: Split counts the search times for shapes whose tiles leave SMs idle.
SPLITS = (2, 4, 8)


def gemm_key(gpu: DeviceInfo, dtype: str, out_dtype: str, m: int, n: int, k: int) -> str:
    """The tuning-cache key of a GEMM on ``gpu``."""
    major, minor = gpu.capability
    return f"gemm|{gpu.name}|sm{major}{minor}|{dtype}->{out_dtype}|{m}x{n}x{k}"


def gemm_space(m: int, n: int, k: int, multiprocessors: int, dtype: str = "bfloat16",
               out_dtype: str = "bfloat16") -> list[GemmConfig]:
    """Candidates for an ``m x n x k`` GEMM: the dispatch model's choice first, then every
    tile (at the 16-bit K step of 64 and at the tile's own, ``dispatch.TILES``) x ring depth
    (as many as fit, or 3 / 4) x raster order (1, 8), and for tiles that leave SMs idle the
    ``SPLITS`` in the three split modes (a cluster where the tile shares out)."""
    int8 = dtype == "int8"
    block_k = 128 if int8 else 64
    first = plan(m, n, k, multiprocessors, block_k=block_k, allow_split=not int8,
                 in_dtype=dtype, out_dtype=out_dtype).config
    space = [first]
    for block_m, block_n, *own_k in TILES:
        for depth in sorted({block_k, *([] if int8 else own_k)}):
            space += [cfg for cfg in _tile_space(m, n, k, multiprocessors, dtype, out_dtype,
                                                 GemmConfig(block_m, block_n, depth))
                      if cfg not in space]
    return [cfg for cfg in space if cfg.stages <= MAX_STAGES]


def _tile_space(m: int, n: int, k: int, multiprocessors: int, dtype: str, out_dtype: str,
                tile: GemmConfig) -> list[GemmConfig]:
    """``gemm_space``'s candidates of one tile and K step."""
    space = []
    for stages in (0, 3, 4):
        for group in (1, 8):
            try:
                cfg = tile.replace(stages=stages, raster_group=group, split_k=1)
                cfg.ring_stages("sm_90a", out_dtype, dtype)
            except ConfigError:
                continue
            if deep_enough(cfg, dtype, out_dtype) and cfg not in space:
                space.append(cfg)
    tiles = math.ceil(m / tile.block_m) * math.ceil(n / tile.block_n)
    if dtype == "int8" or tile.block_n > 128 or tiles >= multiprocessors:
        return space
    for splits in SPLITS:
        if math.ceil(k / tile.block_k) >= 2 * splits:
            space += [tile.replace(split_k=splits, split_mode=mode)
                      for mode in ("workspace", "serial", "cluster")
                      if tile.can_split(splits, mode)]
    return space


def split_configs(tiles: tuple[tuple[int, ...], ...], counts: tuple[int, ...],
                  modes: tuple[str, ...]) -> dict[str, GemmConfig]:
    """Named candidates for a sweep (``scripts/gemm_candidates.py``, ``conv_candidates.py``):
    each tile of ``tiles`` (``(block_m, block_n)``, or with a third ``block_k``) unsplit
    (``"64x64 s1"``, ``"64x32x128 s1"``) and with each count of ``counts`` in each of
    ``modes`` where the tile can meet so (``"64x64 s4 c"``: the mode's initial)."""
    named = {"x".join(map(str, tile)): GemmConfig(*tile) for tile in tiles}
    return {f"{name} s{s}" + ("" if s == 1 else f" {mode[0]}"):
            tile.replace(split_k=s, split_mode=mode)
            for name, tile in named.items() for s in counts for mode in modes
            if (s == 1 and mode == modes[0]) or (s > 1 and tile.can_split(s, mode))}


def best_of(timings: dict[GemmConfig, float]) -> GemmConfig:
    """The fastest config (the earlier one on a tie: the model's choice comes first)."""
    return min(timings, key=lambda cfg: timings[cfg])


def tune_shape(space: list[GemmConfig], time_ms: Callable[[GemmConfig], float | None]
               ) -> tuple[GemmConfig, dict[GemmConfig, float]]:
    """Time every candidate (``time_ms`` returns None for one that failed) and return the
    fastest with every timing."""
    timings = {}
    for cfg in space:
        ms = time_ms(cfg)
        if ms is not None:
            timings[cfg] = ms
    if not timings:
        raise RuntimeError("no GEMM candidate ran")
    return best_of(timings), timings


def record(cache: TuneCache, key: str, best: GemmConfig, timings: dict[GemmConfig, float]
           ) -> None:
    """Store ``best`` for ``key`` with its time and the model's (the first candidate's)."""
    model = next(iter(timings))
    cache.entries[key] = {"config": best.to_dict(), "best_ms": timings[best],
                          "default_ms": timings[model]}


def tuned_config(cache: TuneCache, key: str) -> GemmConfig | None:
    """The cache's config for ``key``, or None (none, or written by another version)."""
    entry = cache.entries.get(key)
    if entry is None:
        return None
    try:
        return GemmConfig(**entry["config"])  # type: ignore[arg-type]
    except (ConfigError, TypeError):
        return None
