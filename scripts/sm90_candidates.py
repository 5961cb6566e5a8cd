"""Time wgmma candidates per head dim against the peers, in one run (what ``SM90A_WGMMA_KNOBS``
is chosen from).

Usage (GPU): python scripts/sm90_candidates.py [--head-dims 64,128,192,256]
[--masks plain,causal] [--seqlen 4096[,8192,...]] [--dtypes bfloat16[,float16]]
[--tokens 16384] [--variants NAME,...] [--varlen [--varlen-divide N]] [--out DIR]
For each head dim, mask, length and dtype (by default plain and causal, bf16, batch 4 x 16
heads x seq 4k), it times the wgmma kernel's default and each variant of it (``VARIANTS``;
earlier sweeps' tiles are in their results' ``configs``) next to SDPA flash, cuDNN and FA4:
TFLOP/s end to end and device only. The candidates are compiled into the kernel cache in
parallel first. The table goes to stdout, the numbers to OUT/sm90_candidates.json. With
``--varlen`` the points are the Hopper table's ragged batch (``bench.ragged``; lengths divided
by N) at each head dim, mask and dtype: the packed default and its grid variants (or the named
ones) against FA4, each variant's output checked against the default's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from attnlab import kernel_cache
from attnlab.bench.baselines import available_peers
from attnlab.bench.ragged import RAGGED_SEQLENS, RaggedBatch
from attnlab.bench.report import one_line
from attnlab.bench.runner import Point, attnlab_impl, measure_point
from attnlab.config import L2_SECTION_MB, MAX_L2_SECTION_MB, ConfigError, FlashConfig
from attnlab.kernels.abi import ForwardSpec
from attnlab.policy import (
    FA4_ORDER,
    ONE_CTA,
    SM90A_SHORT_MASKED_KNOBS,
    SM90A_WGMMA_KNOBS,
    default_for,
    paired_row_blocks,
)
from attnlab.tune.cache import seqlen_bucket

#: Candidates per head dim: knob changes on the default of the point (``policy.default_for``
#: at its head dim, mask and length), so a sweep measures one step against what users run.
#: ``{}`` is the default itself.
_PERSISTENT = {"persistent": True, "dynamic_tiles": False}
_DYNAMIC = {"persistent": True, "dynamic_tiles": True}
#: The persistent grid in the longest-first order over one section of every head: the only
#: order whose tiles shorten steadily through the launch, which the snake balances (the host
#: model, ``tile_order.snake_imbalance``: 1.00-1.01 where the per-head order gets 1.5-1.8);
#: what it costs in L2 is the question. With ``dynamic_tiles`` any order balances.
_GLOBAL_LPT = {"lpt": True, "l2_section_mb": MAX_L2_SECTION_MB}
#: FA3 drops the warpgroups' turns (its scheduler barrier) above hd128 with the overlap on:
#: measured here only at hd64 and hd128 (+1-2 %), inherited by the other head dims.
_GRIDS = {"default": {}, "no_pingpong": {"pingpong": False},
          "one_cta": ONE_CTA, "persistent": _PERSISTENT, "dynamic": _DYNAMIC,
          "persistent_global_lpt": {**_PERSISTENT, **_GLOBAL_LPT},
          "dynamic_global_lpt": {**_DYNAMIC, **_GLOBAL_LPT}}
#: Three consumer warpgroups under a mask spill in the K/V loop once it is inside a loop over
#: tiles (160 registers a thread; hd64 B_c 128: 54 stores); a narrower K/V block frees the
#: registers of S (cross-compiled: hd32 and hd64 at B_c 96, hd96 at 80 or 64, no spill).
_NARROW = {32: 96, 64: 96, 96: 80}
VARIANTS: dict[int, dict[str, dict[str, object]]] = {
    head_dim: {**_GRIDS, **({
        f"bc{_NARROW[head_dim]}_persistent": {**_PERSISTENT, "block_n": _NARROW[head_dim],
                                               "fence_p": True},
        f"bc{_NARROW[head_dim]}_dynamic": {**_DYNAMIC, "block_n": _NARROW[head_dim],
                                            "fence_p": True},
    } if head_dim in _NARROW else {})}
    for head_dim in (32, 64, 96, 128, 192, 256)}
#: The one-CTA-per-tile masked tiles of the balance rule's time (nineteenth session), against
#: the counter at the same lengths.
VARIANTS[128]["one_cta_kv3"] = {**ONE_CTA, "kv_stages": 3}
#: Unmasked hd128 without the turns (thirty-third session): a third K/V stage, and wider K/V
#: blocks (FA3's hd128 tile is 128 x 176, with turns).
VARIANTS[128].update(kv3={"kv_stages": 3}, pingpong={"pingpong": True}, **{
    f"bc{width}": {"block_n": width, "fence_p": True} for width in (144, 160, 176)},
    bc176_pingpong={"block_n": 176, "fence_p": True, "pingpong": True})
#: FA4's B_c at hd192 (112) and one between ours and its 144 at hd96, now that ``fence_p``
#: keeps such widths' P V one group (measured at half speed before it, twelfth session).
for _head_dim in (96, 192):
    VARIANTS[_head_dim]["bc112"] = {"block_n": 112, "fence_p": True}
#: FA4's schedule above hd128 with the intra-warpgroup overlap: no turns, and O rescaled
#: under the next S = Q K^T (each measured alone within 1 %, thirteenth and thirty-third
#: sessions; not together).
for _head_dim in (128, 192, 256):
    VARIANTS[_head_dim]["rescale_first"] = {"pingpong": False, "rescale_o_before_pv": True}
#: O rescaled under the next S = Q K^T with the turns kept (the three-warpgroup tiles need
#: them, hd128 masked and hd192 have them), and hd64 with a fourth K/V stage (thirty-fourth
#: session).
for _head_dim in (32, 64, 96, 128, 192):
    VARIANTS[_head_dim]["rescale"] = {"rescale_o_before_pv": True}
VARIANTS[64]["kv4"] = {"kv_stages": 4}
#: FA4's two K/V stages at hd64, whose CTAs' requests meet more often in the L2 request
#: coalescer (forty-second session: even with three, docs/ladder.md).
VARIANTS[64]["kv2"] = {"kv_stages": 2}
#: Below 4k masked queries, the tile of the long masked ones (the three-warpgroup tiles measured
#: 0.81x at seq 1k in the thirteenth session, before the R2P mask and the rescale first), in
#: its longest-first order and in the per-head one (thirty-fifth session), and on the static
#: walk instead of the counter (thirty-sixth).
for _head_dim in (32, 64, 96, 256):
    VARIANTS[_head_dim]["long_masked_tile"] = dict(SM90A_WGMMA_KNOBS[_head_dim, True])
    VARIANTS[_head_dim]["long_masked_tile_per_head"] = {**SM90A_WGMMA_KNOBS[_head_dim, True],
                                                        "lpt": False,
                                                        "l2_section_mb": L2_SECTION_MB}
    VARIANTS[_head_dim]["long_masked_tile_static"] = {**SM90A_WGMMA_KNOBS[_head_dim, True],
                                                      "dynamic_tiles": False}
#: FA4's grid at hd32/64 under a mask: one CTA per tile, longest first, B_c 128 (which the
#: persistent loop cannot hold without spills; one CTA per tile can, as packed sequences run
#: it): hd128 gained from it from 8k (thirty-fifth session), hd64 not measured since the
#: twentieth session (-7 % at 4k then, before the R2P mask).
for _head_dim in (32, 64):
    VARIANTS[_head_dim]["one_cta_bc128"] = {**ONE_CTA, "block_n": 128, "fence_p": False}
#: ... and on the default's grid, where B_c 128 spills 4 values today (`attnlab sass --masked`).
VARIANTS[64]["bc128"] = {"block_n": 128, "fence_p": False}
#: hd256 causal at 2k, where the short masked tile (B_c 64) beat the long one (B_c 80) under
#: one-sided bands a causal mask in effect (+2.3 / +3.9 %, fifty-second session, H200): that
#: tile's knobs (B_c 64 with the turns) on the default's grid, B_c 64 without the turns
#: (masked, and unmasked below 8k, the default since the fifty-third session), and the tile
#: before it (B_c 80).
VARIANTS[256].update(short_masked_tile=dict(SM90A_SHORT_MASKED_KNOBS[256]),
                     bc64={"block_n": 64, "fence_p": False},
                     bc80={"block_n": 80, "fence_p": True})
_LPT16 = {"lpt": True, "l2_section_mb": 16}
#: hd256's 16 MiB sections; at hd128 causal also FA4's grid, one CTA per tile longest first
#: (thirty-fifth session).
for _head_dim in (128, 256):
    VARIANTS[_head_dim].update(one_cta_lpt16={**ONE_CTA, **_LPT16},
                               dynamic_lpt16={**_DYNAMIC, **_LPT16})
#: hd128's masked grids before that, from 8k too: the per-head order, static and from the
#: counter.
_PER_HEAD = {"lpt": False, "l2_section_mb": L2_SECTION_MB}
VARIANTS[128].update(per_head_persistent={**_PERSISTENT, **_PER_HEAD},
                     per_head_dynamic={**_DYNAMIC, **_PER_HEAD})


#: The epilogue's addresses built after the K/V loop (thirty-seventh session): in the CPU
#: build the wait for the previous P V moved from before the first exponential to after 11
#: at hd64 causal and hd32 causal, and at hd64 plain with O rescaled after P V.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim]["late_o"] = {"late_o_addresses": True}
VARIANTS[64]["late_o_rescale_after"] = {"late_o_addresses": True, "rescale_o_before_pv": False}
#: Lazy rescaling (thirty-eighth session): rows keep their maxima within 2^8, a warp skips O's
#: rescale where none moved; ``eager`` is the walk without it where the default has it.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim].update(lazy={"lazy_rescale": True}, eager={"lazy_rescale": False})

#: Each row's sum started from the old sum times its correction (forty-seventh session): in
#: the CPU build the correction's exp2 moves ahead of P's and O's rescale under them;
#: ``corr_last`` is the walk without it where the default has it.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim].update(corr_first={"correction_first": True},
                               corr_last={"correction_first": False})
#: hd128 unmasked: alone the row-sum order moved its P V wait earlier (after 2 exponentials
#: instead of 8, CPU build); with the epilogue's addresses after the loop the wait falls after
#: 10, as in FA4's build of the same tile, and O's multiplies still run under the exponentials.
VARIANTS[128]["corr_late_o"] = {"correction_first": True, "late_o_addresses": True}
#: hd64 masked in FA4's order (``policy.FA4_ORDER``): O rescaled after P V with the row sums
#: from the corrected old sums and the late addresses. Measured on every masked hd64 tile in
#: the forty-eighth session: the default below 2k and from 8k since; -1.9 to -3.6 % on the 2k and
#: 4k tiles, where this variant is what a sweep would try again.
VARIANTS[64]["corr_after_late"] = dict(FA4_ORDER)
#: The 2k and 4k masked tiles rescale lazily, whose branch keeps O's 32 multiplies after the
#: last exponential in FA4's order; without it (CPU build, 2k and 4k): no spill, the P V wait
#: after 8-16 exponentials (the default: 0-26), no multiply after the last (the default: 32).
#: Measured (forty-eighth session): -4.2 to 0 % device only, not taken.
VARIANTS[64]["fa4_order_eager"] = {**FA4_ORDER, "lazy_rescale": False}

#: K and V multicast to clusters of two CTAs (``cluster_m``, forty-third session): the
#: persistent unmasked walks of every head dim. Where the default pairs them (hd128-256),
#: ``no_cluster`` is the walk without.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim].update(cluster={"cluster_m": 2}, no_cluster={"cluster_m": 1})
#: Q in two buffers (``q_stages``, forty-ninth session): the next tile's Q loads during this
#: tile's K/V walk, where the consumers of the short masked hd64 tile waited for it (ncu at
#: causal 1k: the most-sampled stall, 6.6 % of the warps' samples, a Q wait at a tile's start).
for _head_dim in VARIANTS:
    VARIANTS[_head_dim].update(q2={"q_stages": 2}, q1={"q_stages": 1},
                               dynamic_q2={**_DYNAMIC, "q_stages": 2})
#: Packed sequences under a mask ran one CTA per tile until the fiftieth session measured the
#: dense masked tile on the counter (``policy._PACKED_WALK``), and in the longest-first order
#: over one section of every head (-25 % at hd128: its sections are sized from the average
#: sequence).
for _head_dim in VARIANTS:
    VARIANTS[_head_dim].update(
        dense_masked_dynamic={**SM90A_WGMMA_KNOBS[_head_dim, True], **_DYNAMIC},
        dense_masked_dynamic_lpt={**SM90A_WGMMA_KNOBS[_head_dim, True], **_DYNAMIC,
                                  **_GLOBAL_LPT})
#: The last full wave and the partial one dealt out as runs of K/V blocks (``split_tail``,
#: sixtieth session): the unmasked persistent static walks.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim]["split_tail"] = {"split_tail": True}
#: The fp16 defaults that try a ring stage once before they wait (``try_wait_first``), without
#: the try: the paired (clustered) hd128 build keeps the wait's retry out of its K/V loops
#: without it (CPU SASS, sixtieth session), where the try adds 7 instructions a loop body.
for _head_dim in VARIANTS:
    VARIANTS[_head_dim]["no_try"] = {"try_wait_first": False}
#: Variants only an unmasked walk can take: never timed on masked points.
PLAIN_ONLY = {"cluster", "no_cluster", "split_tail"}

#: Variants about the masked grids and tiles: timed on unmasked points only when named.
MASKED_ONLY = {"dense_masked_dynamic", "dense_masked_dynamic_lpt", "short_masked_tile",
               "long_masked_tile", "long_masked_tile_per_head", "long_masked_tile_static",
               "one_cta_bc128", "bc128",
               "one_cta_kv3", "per_head_persistent", "per_head_dynamic"}


def candidates(head_dim: int, causal: bool, seqlen: int, dtype: str,
               names: set[str] | None = None) -> dict[str, FlashConfig]:
    """The variants of the point's default (``names``: only those, the default always; without
    names, every variant but ``MASKED_ONLY`` on unmasked points); a variant that is the default
    at this point (e.g. ``one_cta_lpt16`` at hd128 causal from 8k) is not timed twice. The
    default is the policy's at the length's bucket, as ``dispatch`` looks it up (which may
    still hand an unbalanced static walk to the counter), unmasked row blocks paired in
    clusters where ``dispatch`` pairs them, with its dtype's knobs (until the sixtieth session
    the fp16 points ran bf16's default and variants, without fp16's ``try_wait_first``). A
    variant the head dim cannot build (e.g. a second Q buffer where shared memory has no room
    for it) is left out."""
    default = default_for("sm_90a", head_dim, causal, dtype, seqlen=seqlen_bucket(seqlen))
    if not causal:
        default = paired_row_blocks(default, head_dim, seqlen)
    return _variants_of(default, head_dim, causal, names,
                        lambda name: causal or name not in MASKED_ONLY)


def varlen_candidates(head_dim: int, causal: bool, default: FlashConfig,
                      names: set[str] | None = None) -> dict[str, FlashConfig]:
    """The grid variants (``_GRIDS``) and the named ones of the ragged batch's ``default``
    (what ``attention_varlen`` picks), those that build and differ from it."""
    return _variants_of(default, head_dim, causal, names, lambda name: name in _GRIDS)


def _variants_of(default: FlashConfig, head_dim: int, causal: bool, names: set[str] | None,
                 unnamed: Callable[[str], bool]) -> dict[str, FlashConfig]:
    """``default`` and its variants: the ``names`` (without names, those ``unnamed`` keeps),
    never an unmasked-only one under a mask, only those that build and differ from it."""
    chosen = {name: _variant(default, knobs, head_dim)
              for name, knobs in VARIANTS[head_dim].items()
              if name != "default" and not (causal and name in PLAIN_ONLY)
              and (name in names if names is not None else unnamed(name))}
    return {"default": default, **{name: cfg for name, cfg in chosen.items()
                                   if cfg is not None and cfg != default}}


def _variant(default: FlashConfig, knobs: dict[str, object], head_dim: int
             ) -> FlashConfig | None:
    """``default`` with ``knobs``, or None where that cannot be built at ``head_dim``."""
    try:
        config = default.replace(**knobs)
        config.check_problem(head_dim, "sm_90a")
    except ConfigError:
        return None
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--head-dims", default=",".join(map(str, VARIANTS)))
    parser.add_argument("--seqlen", default="4096",
                        help="query (= key) length, or several comma-separated")
    parser.add_argument("--dtypes", default="bfloat16",
                        help="bfloat16, float16 or both (comma-separated)")
    parser.add_argument("--masks", default="plain,causal",
                        help="plain, causal or both (comma-separated)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="the Hopper table's shapes: TOKENS // seqlen sequences of hidden "
                             "2048 (heads = 2048 // head_dim); default batch 4 x 16 heads")
    parser.add_argument("--variants", default=None,
                        help="comma-separated VARIANTS names to time beside the default "
                             "(default: all of the head dim's)")
    parser.add_argument("--varlen", action="store_true",
                        help="time the Hopper table's ragged batch (bench.ragged) at each head "
                             "dim, mask and dtype instead of dense points")
    parser.add_argument("--varlen-divide", type=int, default=1,
                        help="with --varlen, every sequence's length divided by this")
    args = parser.parse_args()
    names = None if args.variants is None else set(args.variants.split(","))
    unknown = (names or set()) - {name for per_dim in VARIANTS.values() for name in per_dim}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    head_dims = [int(h) for h in args.head_dims.split(",")]
    masks = [{"plain": False, "causal": True}[m] for m in args.masks.split(",")]
    seqlens = [int(n) for n in args.seqlen.split(",")]
    dtypes = args.dtypes.split(",")

    def point(head_dim: int, causal: bool, seqlen: int, dtype: str) -> Point:
        if args.tokens is None:
            return Point(4, seqlen, seqlen, 16, head_dim, dtype, causal)
        return Point(args.tokens // seqlen, seqlen, seqlen, 2048 // head_dim, head_dim, dtype,
                     causal)

    if args.varlen_divide < 1 or (args.varlen_divide > 1 and not args.varlen):
        parser.error("--varlen-divide takes an integer >= 1, with --varlen")
    if args.varlen:
        seqlens = tuple(n // args.varlen_divide for n in RAGGED_SEQLENS)
        rows = [varlen_row(hd, causal, dtype, names, args.runs, seqlens)
                for dtype in dtypes for hd in head_dims for causal in masks]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sm90_candidates.json").write_text(json.dumps(rows, indent=1))
        return
    points = [point(hd, causal, n, dtype) for dtype in dtypes for hd in head_dims
              for causal in masks for n in seqlens]
    kernel_cache.warm([ForwardSpec(cfg, "sm_90a", p.dtype, p.head_dim, p.causal)
                       for p in points
                       for cfg in candidates(p.head_dim, p.causal, p.seqlen_q, p.dtype,
                                             names).values()],
                      jobs=16)
    peers = {name: fn for name, fn in available_peers().items()
             if name in ("sdpa_flash", "sdpa_cudnn", "fa4")}
    rows = []
    for point in points:
        configs = candidates(point.head_dim, point.causal, point.seqlen_q, point.dtype, names)
        impls = {**peers, **{name: attnlab_impl(cfg) for name, cfg in configs.items()}}
        results = measure_point(point, impls, runs=args.runs)
        row = {"point": point.label(), "configs": {n: c.short_name() for n, c in configs.items()}}
        for r in results:
            row[r.impl] = [r.tflops, r.device_tflops, r.error]
        rows.append(row)
        print(one_line(point.label(), results), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sm90_candidates.json").write_text(json.dumps(rows, indent=1))


def varlen_row(head_dim: int, causal: bool, dtype: str, names: set[str] | None,
               runs: int, seqlens: tuple[int, ...] = RAGGED_SEQLENS) -> dict:
    """The ragged batch's default and its variants against FA4, one row."""
    batch = RaggedBatch(head_dim, dtype, seqlens)
    configs = varlen_candidates(head_dim, causal, batch.default_config(causal), names)
    kernel_cache.warm([ForwardSpec(cfg, "sm_90a", dtype, head_dim, causal, varlen=True,
                                   with_lse=False)
                       for cfg in configs.values()], jobs=16)
    impls = {name: batch.attnlab(cfg) for name, cfg in configs.items()}
    if (fa4 := batch.fa4()) is not None:
        impls["fa4"] = fa4
    # A variant that walks the packed tiles wrongly must not win: each against the default.
    q, k, v = batch.sets[0]
    scale = head_dim ** -0.5
    ref = impls["default"](q, k, v, scale, causal).float()
    diffs = {name: float((fn(q, k, v, scale, causal).float() - ref).abs().max())
             for name, fn in impls.items() if name != "default"}
    row = {**batch.measure(impls, causal, runs), "max_abs_diff_to_default": diffs,
           "configs": {n: c.short_name() for n, c in configs.items()}}
    cells = "  ".join(f"{n} {v[0]:.0f}({v[1]:.0f})" for n, v in row.items()
                      if isinstance(v, list) and v[0] is not None)
    print(f"{row['point']}: {cells}", flush=True)
    return row


if __name__ == "__main__":
    main()
