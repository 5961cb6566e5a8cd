"""Shape dispatch: the tile, split count and grid of one GEMM (the lab's Observation FF).

The lab's dispatcher was a threshold on M x N (split-K below 1024^2 cells, 8 or 4 slices by
K). Here the same decision comes from the reason behind it: a GEMM whose output tiles do not
fill the GPU leaves SMs idle for its whole K loop, and slicing K puts them to work at the cost
of a second pass over fp32 partials. The model counts time in K-tile steps of one CTA (a
128 x 256 step is 1; smaller tiles cost their share of it, no less than ``MIN_STEP``):

    waves(tiles x splits) x ceil(k_tiles / splits) x step  +  REDUCE_STEPS[mode]  (if split)

over the candidates: the 128 x 256 tile unsplit, and the 128 x 128 and 64 x 128 tiles with
every split count (their fp32 partials fit shared memory beside a deep ring) when their tiles
do not fill the GPU;
the cheapest wins (the larger tile, then the fewest slices, on a tie). A shape with M <= 64 (a
decoding step's few tokens) takes 64-row tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.gemm_config import GemmConfig

#: Split counts the model considers.
SPLIT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)
#: The slices' meeting in K-tile steps (0.3-0.6 us each): the serial fix-up's partials round
#: trip through L2 (about 1 us); a second kernel's launch and pass, or the accumulator's
#: zeroing and conversion (about 4 us).
REDUCE_STEPS = {"serial": 2, "workspace": 8, "atomic": 8}
#: The cheapest K-tile step the model counts (small tiles are bound by memory, not MMAs).
MIN_STEP = 0.3
#: Fewest K tiles a slice should keep (the ring's prologue and the epilogue amortised).
MIN_K_TILES_PER_SPLIT = 2


@dataclass(frozen=True)
class Plan:
    """How one GEMM runs: the config (its tile), the K slices and the grid."""

    config: GemmConfig
    splits: int
    num_ctas: int

    @property
    def split(self) -> str:
        """The spec's ``split``: ``"none"``, or the config's ``split_mode``."""
        return "none" if self.splits == 1 else self.config.split_mode


def default_config(m: int, n: int, k: int) -> GemmConfig:
    """The tile a shape starts from without a config: 128 x 256, or 64 x 256 for M <= 64;
    the split count chosen per shape."""
    return GemmConfig(block_m=64 if m <= 64 else 128, split_k=0)


def step_cost(config: GemmConfig) -> float:
    """One K-tile step of ``config``'s tile, in 128 x 256 steps."""
    return max(MIN_STEP, config.block_m * config.block_n / (128 * 256))


def cost(config: GemmConfig, splits: int, m: int, n: int, k: int, multiprocessors: int
         ) -> float:
    """The model's time of ``config`` with ``splits`` slices (module docstring)."""
    tiles = math.ceil(m / config.block_m) * math.ceil(n / config.block_n)
    k_tiles = math.ceil(k / config.block_k)
    waves = math.ceil(tiles * splits / multiprocessors)
    return (waves * math.ceil(k_tiles / splits) * step_cost(config)
            + (REDUCE_STEPS[config.split_mode] if splits > 1 else 0))


def candidates(m: int, n: int, k: int, multiprocessors: int,
               config: GemmConfig | None) -> list[tuple[GemmConfig, int]]:
    """``(config, splits)`` pairs the model weighs (the caller's config with every split
    count, or the default tiles as the module docstring says)."""
    k_tiles = math.ceil(k / (config or GemmConfig()).block_k)
    counts = [s for s in SPLIT_CANDIDATES
              if s == 1 or k_tiles >= s * MIN_K_TILES_PER_SPLIT]
    if config is not None:
        return [(config, s) for s in counts]
    wide = default_config(m, n, k)
    narrow = wide.replace(block_n=128)
    pairs = [(wide, 1), (narrow, 1)]
    for small in {narrow, narrow.replace(block_m=64)}:
        if math.ceil(m / small.block_m) * math.ceil(n / small.block_n) < multiprocessors:
            pairs += [(small, s) for s in counts if s > 1]
    return pairs


def plan(m: int, n: int, k: int, multiprocessors: int,
         config: GemmConfig | None = None) -> Plan:
    """The plan of an ``m x n x k`` GEMM on a GPU of ``multiprocessors`` SMs. ``config``:
    the caller's (its ``split_k`` 0 means "choose the split"), else the default tiles."""
    if config is not None and config.split_k:
        cfg, splits = config, config.split_k
    else:
        pairs = candidates(m, n, k, multiprocessors, config)
        cfg, splits = min(pairs, key=lambda p: cost(*p, m, n, k, multiprocessors))
    k_tiles = math.ceil(k / cfg.block_k)
    splits = max(1, min(splits, k_tiles))
    # Every slice gets at least one K tile: 10 tiles in 6 slices would leave the sixth empty.
    splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))
    tiles = math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)
    items = tiles * splits
    num_ctas = min(items, multiprocessors) if cfg.persistent else items
    return Plan(cfg.replace(split_k=splits), splits, num_ctas)
