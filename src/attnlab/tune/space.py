"""The configurations the autotuner considers."""

from __future__ import annotations

import itertools

from attnlab.config import L2_SECTION_MB, ConfigError, FlashConfig
from attnlab.ladder import HOPPER_STEPS, INTERLEAVED_SOFTMAX, TMA_RING, family

#: The wgmma kernel's search: consumer warpgroups (B_r = 64 each), B_c, ring stages.
WGMMA_CONSUMERS = (1, 2, 3)
WGMMA_BLOCK_N = (64, 80, 96, 128, 192)
WGMMA_STAGES = (2, 3, 4)
#: The consumer warpgroups' schedules: FA3's intra-warpgroup overlap and ping-pong, each on
#: or off, and with the overlap O rescaled under the next S = Q K^T, with or without the
#: turns (hd256's default without, masked hd64's and plain hd96's with; thirty-fourth
#: session), or rescaled after P V with the epilogue's addresses built after the loop (plain
#: hd64's default; thirty-seventh session).
_OVERLAP_ORDERS = ({"rescale_o_before_pv": True, "late_o_addresses": False},
                   {"rescale_o_before_pv": False, "late_o_addresses": True})
WGMMA_SCHEDULES = (
    *({"intra_wg_overlap": overlap, "pingpong": pingpong, "rescale_o_before_pv": False,
       "late_o_addresses": False}
      for overlap, pingpong in itertools.product((False, True), (False, True))),
    *({"intra_wg_overlap": True, "pingpong": pingpong, **order}
      for order in _OVERLAP_ORDERS for pingpong in (False, True)))
#: L2 section sizes (MiB of K/V) the refinement tries with the longest-first order.
LPT_SECTION_MB = (L2_SECTION_MB, 16)


def search_space(wide: bool = False, arch: str = "sm_80") -> list[FlashConfig]:
    """Valid configs over block shapes, warps, sub-tiling and double buffering; on sm_90a
    also the warpgroup-MMA kernel's (``wgmma_space``).

    Kernels 3 and 6 (eager loads, fused softmax), cp.async and the unpredicated full tiles
    are always on: the seeds' tuning (kernel 7) kept the first three fixed, and the last helps
    every config. ``wide`` also varies the K and V sub-tiles separately and tries
    the +8 padding instead of the XOR swizzle.
    """
    frags = (0, 2)
    kv_frags = list(itertools.product(frags, frags)) if wide else [(f, f) for f in frags]
    swizzles = ("xor", "pad8") if wide else ("xor",)
    configs = []
    for block_m, block_n, warps, q, (k, v), buffer, swizzle in itertools.product(
            (64, 128), (32, 64, 128), (4, 8), frags, kv_frags, (False, True), swizzles):
        try:
            configs.append(FlashConfig(
                block_m=block_m, block_n=block_n, num_warps=warps, async_copy=True,
                swizzle=swizzle, eager_kv_loads=True, q_frags_per_load=q, k_frags_per_load=k,
                v_frags_per_load=v, double_buffer_smem_to_rf=buffer, fused_softmax=True,
                unpredicated_full_tiles=True, static_strides=True))
        except ConfigError:
            continue  # e.g. 8 warps cannot split 64 rows into 16-row MMA tiles
    return configs + (wgmma_space() if arch == "sm_90a" else [])


def wgmma_space() -> list[FlashConfig]:
    """The warpgroup-MMA kernel's tiles (one to three consumer warpgroups, B_c, ring stages),
    each on every schedule (``WGMMA_SCHEDULES``; ping-pong needs two warpgroups or more); P
    pinned (``fence_p``) where B_c is not a power of two, where it measured up to 2x faster.
    Shared memory and spills are pruned per head dim after compiling; the tile order (``lpt``)
    and the grid (``persistent``) are the refinement's (``knob_neighbours``)."""
    configs = []
    for consumers, block_n, stages, schedule in itertools.product(
            WGMMA_CONSUMERS, WGMMA_BLOCK_N, WGMMA_STAGES, WGMMA_SCHEDULES):
        try:
            configs.append(HOPPER_STEPS["wgmma"].replace(
                block_m=64 * consumers, num_warps=4 * consumers, block_n=block_n,
                kv_stages=stages, fence_p=bool(block_n & (block_n - 1)), **schedule))
        except ConfigError:
            continue  # ping-pong with one warpgroup
    return configs


#: Row-sum chain counts the refinement tries (capped at a full tree, ``block_n / 4``).
ROW_SUM_CHAINS = (1, 2, 4, 8, 16)


def knob_neighbours(config: FlashConfig, arch: str = "sm_80",
                    head_dim: int | None = None, windowed: bool = False) -> list[FlashConfig]:
    """``config`` with each row-sum chain count, each K/V walk direction (kernel 13) and, on
    sm_90, each way of loading K/V: ``cp.async`` eagerly, or the TMA ring (``TMA_RING``)
    where its second stage fits in shared memory at ``head_dim``, with the whole-tile or the
    sliced softmax (``INTERLEAVED_SOFTMAX``, at ptxas -O1). A wgmma tile's neighbours are its
    ring depths, schedules and, under a mask (``windowed``), tile orders instead
    (``_wgmma_neighbours``).

    These knobs change no tile and no occupancy (the ring's second stage aside), only how
    ptxas schedules and allocates the loop, and their best value moved with the head dim,
    dtype and mask on an H200 (docs/ladder.md): they are timed around the best tile, not
    pruned statically.
    """
    if config.wgmma:
        return _wgmma_neighbours(config, arch, head_dim, windowed)
    whole_tile = {"interleave_softmax": False, "ptxas_opt_level": 3}
    loads = [{"tma_kv_loads": False, "kv_stages": 1, **whole_tile}]
    if family(arch) == "sm_90":
        loads += [{**TMA_RING, **whole_tile}, {**TMA_RING, **INTERLEAVED_SOFTMAX}]
    chains = [c for c in ROW_SUM_CHAINS if c <= config.block_n // 4]
    around = []
    for load, c, r in itertools.product(loads, chains, (False, True)):
        try:
            candidate = config.replace(row_sum_chains=c, reverse_kv=r, **load)
            if head_dim is not None:
                candidate.check_problem(head_dim, arch)
        except ConfigError:
            continue  # e.g. the ring's second stage does not fit
        around.append(candidate)
    return around


def _wgmma_neighbours(config: FlashConfig, arch: str, head_dim: int | None,
                      windowed: bool) -> list[FlashConfig]:
    """A wgmma tile with each ring depth that fits and each schedule (``WGMMA_SCHEDULES``),
    on each grid (one CTA per tile, or persistent; under a mask also persistent with
    ``dynamic_tiles``, without one also persistent in clusters of two, ``cluster_m``); where
    B_c is not a power of two, with and
    without P pinned (``fence_p``: it changes how ptxas issues the P V GEMM only at those
    widths); under a mask, in each tile order (per head, or ``lpt`` with sections of
    ``LPT_SECTION_MB``: it helped at some head dims, hurt at hd128, and its best section size
    moved with the head dim). The tile itself is also tried with the other lazy-rescale
    setting (``lazy_rescale``: +1-2 % device only at causal 4k, -1 to -2 % at plain hd128 on
    an H100, thirty-eighth session) and with the other row-sum order (``correction_first``:
    -3.5 to +5.8 % by head dim and mask, forty-seventh session), and on its persistent grid
    with the other count of Q buffers (``q_stages``: +1 to +7 % by head dim and length, -3 %
    at hd64's three-warpgroup masked tiles, forty-ninth session); one CTA per tile takes one.
    And with the other way to wait for a stage (``try_wait_first``: +1-1.5 % in fp16 where the
    build lays the wait's retry out in the K/V loop, -1.5 % in bf16 at hd64 and -1.5 to -4.5 %
    in fp16 where it does not, fifty-fourth and fifty-fifth sessions). Unmasked, a persistent
    static walk also with the other tail (``split_tail``: up to +2.5 % device only from 8k at
    hd128 and hd256, -0.2 to -1.9 % end to end at 2k, sixtieth session)."""
    fences = (False, True) if config.block_n & (config.block_n - 1) else (config.fence_p,)
    orders = ([(False, L2_SECTION_MB)] + [(True, mb) for mb in LPT_SECTION_MB]) if windowed \
        else [(config.lpt, config.l2_section_mb)]
    around = []
    # (persistent, dynamic_tiles, cluster_m): under a mask the tiles' lengths differ, and a
    # counter balances what the fixed walk may not; without one, neighbouring row blocks
    # may share their K/V loads in clusters of two.
    grids = [(False, False, 1), (True, False, 1)] + (
        [(True, True, 1)] if windowed else [(True, False, 2)])
    for stages, schedule, fence, (lpt, section_mb), (persistent, dynamic, cluster) in \
            itertools.product(WGMMA_STAGES, WGMMA_SCHEDULES, fences, orders, grids):
        try:
            # Lazy rescaling and the row-sum order belong to the overlap: a schedule without
            # it rescales and sums as before.
            overlap = schedule["intra_wg_overlap"]
            candidate = config.replace(kv_stages=stages, **schedule, fence_p=fence, lpt=lpt,
                                       l2_section_mb=section_mb, persistent=persistent,
                                       dynamic_tiles=dynamic, cluster_m=cluster,
                                       q_stages=config.q_stages if persistent else 1,
                                       lazy_rescale=config.lazy_rescale and overlap,
                                       correction_first=config.correction_first and overlap)
            if head_dim is not None:
                candidate.check_problem(head_dim, arch)
        except ConfigError:
            continue
        around.append(candidate)
    if config.intra_wg_overlap:
        around += [config.replace(lazy_rescale=not config.lazy_rescale),
                   config.replace(correction_first=not config.correction_first)]
    around.append(config.replace(try_wait_first=not config.try_wait_first))
    if config.persistent:
        try:
            other = config.replace(q_stages=3 - config.q_stages)
            if head_dim is not None:
                other.check_problem(head_dim, arch)
            around.append(other)
        except ConfigError:
            pass  # no room for O's own tile beside a second Q
    if config.static_persistent_walk and not windowed:
        around.append(config.replace(split_tail=not config.split_tail))
    return around
