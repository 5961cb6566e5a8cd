"""Shape dispatch: the tile, split count and grid of one GEMM (the lab's Observation FF).

The lab's dispatcher was a threshold on M x N (split-K below 1024^2 cells, 8 or 4 slices by
K). Here the decision comes from what a call costs end to end, as an eager caller sees it: the
later of its host side (``HOST_US``: one launch, or split-K's launches and workspace) and its
device side. The device side counts K-tile steps of one CTA (a 128 x 256 x 64 step is 1,
smaller tiles cost ``STEP_FIXED + (1 - STEP_FIXED) x`` their share of its area: they are bound
by loads, not MMAs; a deeper step counts as the 64-deep steps it replaces):

    device = max(waves(tiles x splits) x ceil(k_tiles / splits) x step x STEP_US,
                 waves x B's bytes per CTA / STREAM_BYTES_PER_US  (M <= STREAM_ROWS only))
             + SPLIT_US x (1 + splits) (if split: the slices' meeting, each slice's partial
               read back by the last; a cluster: CLUSTER_US + CLUSTER_CTA_US x CTAs x
               the tile's area in 64 x 64 blocks, and clusters of 8 fill 7/8 of the SMs)

The second term is the decoding-sized GEMM's: with one row of tiles each CTA streams its
columns of B from DRAM once, at a rate per CTA the step count does not see.

Candidates: the 128 x 256, 128 x 128, 64 x 128 and 64 x 64 (128 deep) tiles unsplit, and the
three smaller ones (a caller's up to 160 columns wide) with every split count, serial or
through a workspace, when their tiles do not fill the GPU, and the 64-row ones with every
split count a cluster can hold, meeting in it (one launch like an unsplit call's, nothing
allocated); up to ``STREAM_ROWS`` rows the cluster only. The cheapest wins (then the shorter
device time, the less MMA work, the larger tile, the fewer slices). A split pays where the
unsplit device time is above the host's: in the lab's skinny set at long K (four slices of
64 x 64 in clusters at 256 x 256 x 8192, eight at 128 x 128 x 8192, ``docs/gemm.md``) and at
decoding's 1-64 x 4096 x 4096 (two slices); 512 x 512 x 4096 runs unsplit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.config import SMEM_CAPACITY
from attnlab.gemm_config import BARRIER_BYTES, GemmConfig, element_bytes

#: Split counts the model considers.
SPLIT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)
#: Microseconds of one 128 x 256 x 64 K-tile step (about 90% of the H100's MMA rate).
STEP_US = 0.6
#: The share of a step that does not shrink with the tile (loads, barriers): a 64 x 64 step
#: measured 0.16 us (256 x 256 x 8192 unsplit, 20.4 us on an H200).
STEP_FIXED = 0.16
#: Host microseconds of a call (an H100's host, docs/gemm.md; the split modes scaled by their
#: ratio to an unsplit call on an H200's host, twenty-second session: serial 1.2x with its
#: partials kept per stream, workspace 1.42x, atomic 2.28x).
HOST_US = {"none": 14.0, "serial": 17.0, "workspace": 20.0, "atomic": 32.0,
           "cluster": 14.0}
#: Device microseconds per slice of the slices' meeting (each partial's round trip through
#: L2): with it four slices beat eight at 256 x 256 x 8192, as measured.
SPLIT_US = 0.9
#: Device microseconds a cluster split adds: a fixed part and a part per CTA and 64 x 64 of
#: its tile (each CTA's ring filled from cold, its barriers, its share of the meeting's
#: distributed-shared-memory reads; ``kernels/gemm/cluster_split.py``), fitted to the
#: skinny set on an H100 (16 to 512 CTAs, clusters of 4 and 8, docs/gemm.md).
CLUSTER_US = 5.0
CLUSTER_CTA_US = 0.04
#: The tile height of the clusters the model weighs: one consumer warpgroup, whose meeting
#: is cheaper (128-row clusters measured 0.7-0.85x the 64-row ones at the skinny GEMMs and
#: the conv levels, H100).
CLUSTER_BLOCK_M = 64
#: The share of the SMs clusters of 8 CTAs fill at once: a cluster lives in one GPC, whose
#: SM count is not a multiple of 8 (measured: 128 CTAs in clusters of 8 ran as two waves).
CLUSTER8_SHARE = 7 / 8
#: Fewest ring stages a default tile keeps (two leave the TMA latency exposed).
MIN_STAGES = 3
#: Fewest K tiles a slice should keep (the ring's prologue and the epilogue amortised).
MIN_K_TILES_PER_SPLIT = 2
#: The split modes the model weighs (atomic's zeroed accumulator costs the most host time).
SPLIT_MODES_WEIGHED = ("serial", "workspace", "cluster")
#: The tiles the model weighs, (block_m, block_n) or with a third the tile's own K step
#: (``block_k``), largest first. The 64 x 64 tile steps 128 deep: half the steps' barriers
#: and waits per K (thirty-seventh session, H100, device only: 512 x 512 x 4096 unsplit
#: 14.4 -> 13.1 us, 256 x 256 x 8192 in clusters of four 11.7 -> 11.1 us, 256 x 256 x 4096
#: 9.5 -> 9.3 us).
TILES: tuple[tuple[int, ...], ...] = ((128, 256), (128, 128), (64, 128), (64, 64, 128))
#: Bytes a microsecond one CTA streams from DRAM where a GEMM has one row of tiles (M up to
#: a tile's height: decoding's projections), whatever its tile: an H100, thirty-seventh
#: session, 1 x 4096 x 4096 on 64 CTAs of 64 x 64 (512 KB each, 22.8-23.2 us) and 1 x 14336
#: x 4096 on 112 of 64 x 128 (1 MB each, 47 us).
STREAM_BYTES_PER_US = 22_500
#: Rows up to which a GEMM is one row of every tile the model weighs. There the model weighs
#: only the cluster split: its slices met faster than the serial split's at 1 and 16 x 4096 x
#: 4096 (two slices, both H100 runs of the thirty-seventh session, 0.5-1.6 us device only).
STREAM_ROWS = 64


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
    """The tile a shape runs without a config when the model is not asked: 128 x 256, or
    64 x 128 for M <= 64."""
    return GemmConfig(block_m=64, block_n=128) if m <= 64 else GemmConfig()


def step_cost(config: GemmConfig) -> float:
    """One K-tile step of ``config``'s tile, in 128 x 256 steps."""
    return STEP_FIXED + (1 - STEP_FIXED) * config.block_m * config.block_n / (128 * 256)


def depth_scale(config: GemmConfig, block_k: int) -> float:
    """What one of ``config``'s K steps costs against a ``block_k``-deep step of its tile,
    as the model counts it: the steps it replaces (the model's costs were fitted on
    ``block_k``-deep steps; the deeper step's measured gain, ``TILES``, is not credited)."""
    return config.block_k / block_k


def device_us(config: GemmConfig, splits: int, m: int, n: int, k: int,
              multiprocessors: int, step_scale: float = 1.0,
              cluster_us: tuple[float, float] = (CLUSTER_US, CLUSTER_CTA_US),
              in_bytes: int = 2, stream: bool = True) -> float:
    """The model's device time of ``config`` with ``splits`` slices (module docstring), its
    steps ``step_scale`` times a GEMM's (the convolution's im2col loads are slower);
    ``cluster_us``: a cluster split's fixed and per-CTA costs (``CLUSTER_US``,
    ``CLUSTER_CTA_US``); ``in_bytes``: bytes of an operand's element; ``stream``: at most
    ``STREAM_ROWS`` rows, no faster than each CTA streams its part of B."""
    tiles = math.ceil(m / config.block_m) * math.ceil(n / config.block_n)
    k_tiles = math.ceil(k / config.block_k)
    clustered = splits > 1 and config.split_mode == "cluster"
    room = int(multiprocessors * CLUSTER8_SHARE) if clustered and splits > 4 else multiprocessors
    waves = math.ceil(tiles * splits / room)
    meeting = 0.0
    if clustered:
        area = config.block_m * config.block_n / (64 * 64)
        fixed, per_cta = cluster_us
        meeting = fixed + per_cta * area * tiles * splits
    elif splits > 1:
        meeting = SPLIT_US * (1 + splits)
    steps = waves * math.ceil(k_tiles / splits) * step_cost(config) * STEP_US * step_scale
    if stream and m <= STREAM_ROWS:
        # One row of tiles: every byte of B comes from DRAM once, at a CTA's streaming rate.
        bytes_per_cta = math.ceil(k / splits) * config.block_n * in_bytes
        steps = max(steps, waves * bytes_per_cta / STREAM_BYTES_PER_US)
    return steps + meeting


def end_to_end_us(config: GemmConfig, splits: int, m: int, n: int, k: int,
                  multiprocessors: int, step_scale: float = 1.0,
                  cluster_us: tuple[float, float] = (CLUSTER_US, CLUSTER_CTA_US),
                  in_bytes: int = 2) -> float:
    """The later of the call's host and device sides."""
    host = HOST_US["none" if splits == 1 else config.split_mode]
    return max(host, device_us(config, splits, m, n, k, multiprocessors, step_scale,
                               cluster_us, in_bytes))


def deep_enough(config: GemmConfig, in_dtype: str, out_dtype: str) -> bool:
    """Whether ``config``'s tile leaves room for ``MIN_STAGES`` ring stages beside its
    epilogue tile (an fp32 C tile of 128 x 256 leaves two)."""
    room = SMEM_CAPACITY["sm_90a"] - BARRIER_BYTES - config.epilogue_bytes(out_dtype)
    return room // config.stage_bytes(in_dtype) >= MIN_STAGES


def candidates(m: int, n: int, k: int, multiprocessors: int, config: GemmConfig | None,
               block_k: int = 64, allow_split: bool = True, in_dtype: str = "bfloat16",
               out_dtype: str = "bfloat16", tiles: tuple[tuple[int, ...], ...] = TILES,
               split_counts: tuple[int, ...] = SPLIT_CANDIDATES,
               split_modes: tuple[str, ...] = SPLIT_MODES_WEIGHED
               ) -> list[tuple[GemmConfig, int]]:
    """``(config, splits)`` pairs the model weighs: the caller's config with every split
    count of ``split_counts``, or every tile of ``tiles`` with K step ``block_k`` (or the
    tile's own) that is ``deep_enough`` for its dtypes (module docstring), split in each of
    ``split_modes`` (a cluster only where its tile shares out among the slices); one slice
    only without ``allow_split``."""

    def counts(step: int) -> list[int]:
        k_tiles = math.ceil(k / step)
        return [s for s in split_counts
                if s == 1 or (allow_split and k_tiles >= s * MIN_K_TILES_PER_SPLIT)]

    if config is not None:
        return [(config, s) for s in counts(config.block_k)]
    pairs = []
    for block_m, block_n, *own_k in tiles:
        cfg = GemmConfig(block_m=block_m, block_n=block_n, block_k=own_k[0] if own_k else block_k)
        if not deep_enough(cfg, in_dtype, out_dtype):
            continue
        pairs.append((cfg, 1))
        tiles_mn = math.ceil(m / block_m) * math.ceil(n / block_n)
        if block_n <= 160 and tiles_mn < multiprocessors:
            pairs += [(cfg.replace(split_mode=mode), s) for s in counts(cfg.block_k) if s > 1
                      for mode in split_modes
                      if cfg.can_split(s, mode)
                      and (mode != "cluster" or block_m == CLUSTER_BLOCK_M)]
    return pairs


def plan(m: int, n: int, k: int, multiprocessors: int, config: GemmConfig | None = None,
         *, block_k: int = 64, allow_split: bool = True, in_dtype: str = "bfloat16",
         out_dtype: str = "bfloat16", tiles: tuple[tuple[int, ...], ...] = TILES,
         step_scale: float = 1.0, split_counts: tuple[int, ...] = SPLIT_CANDIDATES,
         split_modes: tuple[str, ...] = SPLIT_MODES_WEIGHED,
         cluster_us: tuple[float, float] = (CLUSTER_US, CLUSTER_CTA_US)) -> Plan:
    """The plan of an ``m x n x k`` GEMM on a GPU of ``multiprocessors`` SMs. ``config``:
    the caller's (its ``split_k`` 0 means "choose the split"), else the model's tile with K
    step ``block_k`` (or the tile's own) for ``in_dtype`` operands and an ``out_dtype`` C;
    ``allow_split=False``: one slice (INT8, whose int32 sums the split-K paths do not carry).
    ``tiles``: the (block_m, block_n[, block_k]) tiles weighed, largest first;
    ``step_scale`` and ``split_counts``: a caller whose K steps cost more (the convolution)
    and the split counts and modes it weighs, and its clusters' costs (``device_us``)."""
    if config is not None and (config.split_k or not allow_split):
        cfg, splits = config, config.split_k if allow_split else 1
    else:
        if m <= STREAM_ROWS and "cluster" in split_modes:
            split_modes = ("cluster",)
        pairs = candidates(m, n, k, multiprocessors, config, block_k, allow_split, in_dtype,
                           out_dtype, tiles, split_counts, split_modes)
        order = {tuple(tile[:2]): i for i, tile in enumerate(tiles)}
        in_bytes = element_bytes(in_dtype)

        def rank(pair: tuple[GemmConfig, int]) -> tuple:
            cfg, s = pair
            scale = step_scale * depth_scale(cfg, block_k)
            costs = (cfg, s, m, n, k, multiprocessors, scale, cluster_us, in_bytes)
            # Streaming-bound plans tie on time: the one with less MMA work goes first.
            return (round(end_to_end_us(*costs), 1), round(device_us(*costs), 1),
                    round(device_us(*costs, stream=False), 1),
                    order.get((cfg.block_m, cfg.block_n), 0), s)

        cfg, splits = min(pairs, key=rank)
    k_tiles = math.ceil(k / cfg.block_k)
    splits = max(1, min(splits, k_tiles))
    # Every slice gets at least one K tile: 10 tiles in 6 slices would leave the sixth empty.
    splits = math.ceil(k_tiles / math.ceil(k_tiles / splits))
    if cfg.split_mode == "cluster" and splits > 1:
        # Fewer K tiles than slices may leave a count the tile cannot share out.
        while splits > 1 and not cfg.cluster_splits_ok(splits):
            splits -= 1
    tiles = math.ceil(m / cfg.block_m) * math.ceil(n / cfg.block_n)
    items = tiles * splits
    # A cluster's slices are side by side in the grid, one item a CTA.
    persistent = cfg.persistent and not (cfg.split_mode == "cluster" and splits > 1)
    num_ctas = min(items, multiprocessors) if persistent else items
    return Plan(cfg.replace(split_k=splits), splits, num_ctas)


def default_specs(arch: str) -> list:
    """Every GEMM kernel the dispatch may build on ``arch`` (the audit's and the cache
    warm-up's list): on sm_90a each model tile in fp16 and bf16, the split forms of the split
    tiles (in a cluster: bf16, every cluster size the 64-row tiles share out), INT8's tiles
    with both epilogues and the split-K reduction; none elsewhere."""
    from attnlab.gemm.int8 import INT8_BLOCK_K
    from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec, binary_config

    if arch != "sm_90a":
        return []
    specs: list = []
    for block_m, block_n, *own_k in TILES:
        tile = GemmConfig(block_m, block_n, *own_k)
        cfg = binary_config(tile)
        specs += [GemmSpec(cfg, arch, dtype, dtype, "k", b_major)
                  for dtype in ("bfloat16", "float16") for b_major in ("n", "k")]
        if block_n <= 128:
            specs += [GemmSpec(cfg, arch, "bfloat16", "float32" if split == "workspace"
                               else "bfloat16", "k", "k", split)
                      for split in ("workspace", "serial")]
            clustered = tile.replace(split_mode="cluster")
            specs += [GemmSpec(clustered.replace(split_k=s), arch, "bfloat16", "bfloat16", "k",
                               b_major, "cluster")
                      for s in SPLIT_CANDIDATES for b_major in ("n", "k")
                      if block_m == CLUSTER_BLOCK_M and clustered.cluster_splits_ok(s)]
        int8 = binary_config(GemmConfig(block_m=block_m, block_n=block_n,
                                        block_k=INT8_BLOCK_K))
        specs += [GemmSpec(int8, arch, "int8", "bfloat16", "k", "k", "none", dequant)
                  for dequant in ("scale", "scale_zero")]
    return specs + [ReduceSpec(arch, dtype) for dtype in ("bfloat16", "float16", "float32")]
