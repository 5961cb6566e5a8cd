"""The seeds' optimization ladder as named configurations of the ``mma.sync`` kernel.

Each step adds one idea to the previous one, as in "Flash Attention from scratch":

=====  ==============================================================================
k01    base: cp.async, row-major shared memory, whole-tile loads, one load at a time
k02    + XOR swizzle (no ldmatrix bank conflicts)
k03    + eager K/V loads (copies in flight during the math)
k04    + sub-tiled shared->register loads, two fragments at a time, interleaved with MMAs
k05    + double-buffered shared->register loads
k06    + FFMA-fused softmax with exp2
k07    auto-tuned for the GPU at hand (``k07_for(arch)``; ``k07`` is the Hopper entry)
k08    strided swizzling: the same config, CuTe folds the swizzle (docs/ladder.md, SASS)
k09    no register copies before HMMA: the same config, CuTe's fragments are in place
k10    first-block specialisation (peeled first K/V block)
k11    swizzled RF->SMEM epilogue: the same config as k09, in the kernel since k02
k12    clean-ups found in the SASS: unpredicated full tiles
k13    K/V blocks walked backwards
k14    cache configuration: the same config as k12 (the carveout cannot be set, below)
k15    tiling along d_head: O += P V in 32-column chunks of the head dim
k16    static global-memory strides (row and head strides compiled in)
=====  ==============================================================================

A step that measured no faster (k10, k13, k14, k15) keeps its row but is not carried
forward: ``BASES`` names what each step changes. The GA104 lab's variants (``LAB_VARIANTS``)
each change one thing of their base: kernel 7, or for ``bc128`` the lab's own
16-rows-per-warp kernel. ``HOPPER_STEPS`` go on from kernel 16 with what only sm_90 has: K/V
through the TMA unit, the softmax sliced into the P V MMAs on that ring, then the
warpgroup-MMA kernel (``kernels/sm90``); ``named_for(arch)`` leaves them out where they
cannot run. ``WGMMA_STEPS`` are the Hopper ladder: the warpgroup-MMA kernel's own steps to
the sm_90a default (``FAMILIES`` names the rows of each ``attnlab ladder --family``).

Every named config builds with no register spill (the issue's target, kept by
``tests/test_compile.py``): from kernel 7 on, the 32-rows-per-warp tile is assembled with
ptxas -O1, because -O3 spills 16-80 bytes there (docs/ladder.md, "Tenth session").
"""

from __future__ import annotations

from attnlab.config import ConfigError, FlashConfig

k01 = FlashConfig(
    block_m=64, block_n=64, num_warps=4, async_copy=True, swizzle="none",
    eager_kv_loads=False, q_frags_per_load=0, k_frags_per_load=0, v_frags_per_load=0,
    double_buffer_smem_to_rf=False, fused_softmax=False,
)
k02 = k01.replace(swizzle="xor")
k03 = k02.replace(eager_kv_loads=True)
k04 = k03.replace(q_frags_per_load=2, k_frags_per_load=2, v_frags_per_load=2)
k05 = k04.replace(double_buffer_smem_to_rf=True)
k06 = k05.replace(fused_softmax=True)

#: Kernel 7 per architecture family: the best configuration measured on that GPU.
#: sm_80: the seed's A100 result, (128, 64, 64, 4): load_0_2_0_fragments+opt_softmax.
#: sm_90: the best of the sweep on an H200 (docs/ladder.md has the search and the numbers).
TUNED_K07: dict[str, FlashConfig] = {
    "sm_80": k06.replace(q_frags_per_load=0, v_frags_per_load=0,
                         double_buffer_smem_to_rf=False),
    "sm_90": k06.replace(block_m=128),
}

#: The ladder's kernel 7: the Hopper entry, assembled spill-free (ptxas -O1; at -O3 this tile
#: spills). Later steps and the lab variants inherit the level.
k07 = TUNED_K07["sm_90"].replace(ptxas_opt_level=1)

# Kernels 8, 9 and 11 are what CuTe's layout algebra already emits (docs/ladder.md has the
# SASS): their rows measure the unchanged config again.
k08 = k07
k09 = k08
k10 = k09.replace(peel_first_kv_block=True)
k11 = k09  # k10 measured slower: not carried forward
k12 = k11.replace(unpredicated_full_tiles=True)
k13 = k12.replace(reverse_kv=True)
# Kernel 14 asked the driver for a 100 % shared-memory carveout. It measured no faster (eighth
# session), and a TVM-FFI launch of CuTe DSL 4.8 cannot ask at all: the DSL keeps the launch's
# carveout in its Python executor, which TVM-FFI calls and exported kernels bypass
# (docs/measurement.md, "CuTe DSL 4.8"). Its row measures kernel 12 again.
k14 = k12  # k13 measured slower: not carried forward
k15 = k12.replace(d_head_tile=32)
k16 = k12.replace(static_strides=True)  # k15 measured no faster: not carried forward

LADDER: dict[str, FlashConfig] = {
    "k01": k01, "k02": k02, "k03": k03, "k04": k04, "k05": k05, "k06": k06, "k07": k07,
    "k08": k08, "k09": k09, "k10": k10, "k11": k11, "k12": k12, "k13": k13, "k14": k14,
    "k15": k15, "k16": k16,
}

#: The GA104 lab's variants (seed 004), each one change to its base (``BASES``).
LAB_VARIANTS: dict[str, FlashConfig] = {
    "pad8": k07.replace(swizzle="pad8"),  # Observation W: +8 halves per row, not the XOR
    "br16": k07.replace(block_m=64),  # 16 query rows per warp
    # B_c = 128 on the lab's 16 rows per warp (its flash_attn_br16_bc128): twice the MMAs
    # per K/V load.
    "bc128": k07.replace(block_m=64, block_n=128),
    "pipeline": k07.replace(kv_stages=2),  # a two-stage cp.async K/V ring
    "persistent": k07.replace(persistent=True),  # SMs x CTAs/SM CTAs looping over tiles
}
LAB_BASE = "k07"

#: K and V through the TMA unit into a two-stage ring (``tma_kv_loads``, ``kv_stages``):
#: one barrier per block and no copy instructions in the math warps (docs/ladder.md,
#: "Seventh session"). Packed (varlen) calls cannot take TMA tiles and drop these knobs.
TMA_RING: dict[str, object] = {"tma_kv_loads": True, "kv_stages": 2}

#: The softmax turned into P one MMA_K slice at a time between the P V MMAs
#: (``interleave_softmax``), assembled with ptxas -O1: spill-free at hd128, and faster than the
#: -O3 build that spills (docs/ladder.md, "Tenth session"). Measured with the TMA ring only.
INTERLEAVED_SOFTMAX: dict[str, object] = {"interleave_softmax": True, "ptxas_opt_level": 1}

#: The Hopper kernel (``kernels/sm90/forward.py``): warpgroup MMAs fed from shared memory, a
#: producer warp loading Q/K/V by TMA, two consumer warpgroups of 64 rows. Kernel 16's
#: compiled-in strides do not apply (the TMA descriptors carry the strides); it is spill-free
#: at -O3.
WGMMA: dict[str, object] = {"wgmma": True, "num_warps": 8, "static_strides": False,
                            "ptxas_opt_level": 3, **TMA_RING}

#: Steps past the seeds' ladder that need sm_90: the load scheme of the Hopper ``mma.sync``
#: defaults (one change to kernel 16), the sliced softmax on that ring, then the
#: warpgroup-MMA kernel.
HOPPER_STEPS: dict[str, FlashConfig] = {
    "tma_ring": k16.replace(**TMA_RING),
    "interleave_softmax": k16.replace(**TMA_RING, **INTERLEAVED_SOFTMAX),
    "wgmma": k16.replace(block_n=128, **WGMMA),
}

#: The Hopper ladder (``attnlab ladder --family sm90``): from the first warpgroup-MMA kernel to
#: the sm_90a default, one technique per step (docs/ladder.md, "The Hopper ladder"). A third
#: K/V stage; FA3's intra-warpgroup overlap (S of block j issued with P V of block j-1); its
#: ping-pong of the consumer warpgroups; a persistent grid whose producer loads the next tile
#: while the consumers store this one (the default at hd128: back to two K/V stages, whose
#: third's shared memory now stages O, so Q is free for the next tile as soon as the last
#: S = Q K^T has run); then a third consumer warpgroup (B_r = 192) with the third stage its
#: shared memory has room for, which the default takes at hd32/hd64 without a mask (at hd128
#: its tile needs 240 KB of shared memory, so the hd128 ladder has no such row). Off the
#: persistent step, the warpgroups without their turns: the default at hd128 without a mask
#: (thirty-third session; the turns paid on the one-CTA kernel, not on this one), and that
#: default with neighbouring row blocks in clusters of two that share each K/V block by TMA
#: multicast (the hd128 and hd256 default where the row blocks pair up, forty-third
#: session); then O
#: rescaled under the next S = Q K^T, FA4's order above hd128: with no turns, hd256's
#: schedule (thirty-fourth session; at hd128 it loses 1.5 %); the same rescale on the
#: three-warpgroup tile with its turns (the hd64 default until the thirty-seventh session);
#: instead of it the epilogue's addresses built after the K/V loop; and with them each row's
#: sum started from the old sum times its correction, so O's rescale runs under P's
#: exponentials (forty-seventh session), the hd64 default. Off the persistent step without
#: turns, Q in two buffers, so the next tile's Q loads during this tile's K/V walk (the hd128
#: default, forty-ninth session); on it the last two waves dealt out as runs of K/V blocks (the
#: hd128 default from 8k queries, sixtieth session).
_RING3 = HOPPER_STEPS["wgmma"].replace(kv_stages=3)
_PINGPONG = _RING3.replace(intra_wg_overlap=True, pingpong=True)
_PERSISTENT = _PINGPONG.replace(persistent=True, kv_stages=2)
_TALL = _PERSISTENT.replace(block_m=192, num_warps=12, kv_stages=3)
WGMMA_STEPS: dict[str, FlashConfig] = {
    "wg_ring3": _RING3,
    "wg_overlap": _RING3.replace(intra_wg_overlap=True),
    "wg_pingpong": _PINGPONG,
    "wg_persistent": _PERSISTENT,
    "wg_free": _PERSISTENT.replace(pingpong=False),
    "wg_cluster": _PERSISTENT.replace(pingpong=False, cluster_m=2),
    "wg_q2": _PERSISTENT.replace(pingpong=False, q_stages=2),
    "wg_split_tail": _PERSISTENT.replace(pingpong=False, q_stages=2, split_tail=True),
    "wg_rescale_first": _PERSISTENT.replace(pingpong=False, rescale_o_before_pv=True),
    "wg_tall": _TALL,
    "wg_tall_rescale_first": _TALL.replace(rescale_o_before_pv=True),
    "wg_tall_late_o": _TALL.replace(late_o_addresses=True),
    "wg_tall_correction_first": _TALL.replace(late_o_addresses=True, correction_first=True),
}
#: The rows of each ``attnlab ladder --family``.
FAMILIES: dict[str, tuple[str, ...]] = {
    "seeds": (*LADDER, *LAB_VARIANTS, *HOPPER_STEPS),
    "sm90": ("wgmma", *WGMMA_STEPS),
}

#: The config each row changes (its delta in ``attnlab ladder`` is against that row).
BASES: dict[str, str] = {
    **{f"k{i:02d}": f"k{i - 1:02d}" for i in range(2, 11)},
    "k11": "k09", "k12": "k11", "k13": "k12", "k14": "k12", "k15": "k12", "k16": "k12",
    **dict.fromkeys(LAB_VARIANTS, LAB_BASE),
    "bc128": "br16", "tma_ring": "k16", "interleave_softmax": "tma_ring",
    "wgmma": "interleave_softmax", "wg_ring3": "wgmma", "wg_overlap": "wg_ring3",
    "wg_pingpong": "wg_overlap", "wg_persistent": "wg_pingpong", "wg_free": "wg_persistent",
    "wg_cluster": "wg_free", "wg_q2": "wg_free", "wg_split_tail": "wg_q2",
    "wg_rescale_first": "wg_free",
    "wg_tall": "wg_persistent",
    "wg_tall_rescale_first": "wg_tall", "wg_tall_late_o": "wg_tall",
    "wg_tall_correction_first": "wg_tall_late_o",
}

#: What each step adds, for tables and plots.
STEP_NAMES: dict[str, str] = {
    "k01": "base",
    "k02": "swizzling",
    "k03": "eager K/V loads",
    "k04": "interleaving on-chip loads with MMA",
    "k05": "double-buffered SMEM->RF loads",
    "k06": "FFMA-fused softmax",
    "k07": "auto-tuned",
    "k08": "strided swizzling (CuTe: same config)",
    "k09": "no register copies (CuTe: same config)",
    "k10": "first-block specialisation",
    "k11": "swizzled RF->SMEM (since k02; = k09)",
    "k12": "unpredicated full tiles",
    "k13": "K/V blocks backwards",
    "k14": "smem carveout (not settable: = k12)",
    "k15": "tiling along d_head (P V)",
    "k16": "static GMEM strides",
    "pad8": "lab: +8-half padding instead of swizzle",
    "br16": "lab: 16 rows per warp",
    "bc128": "lab: B_c = 128 (16 rows per warp)",
    "pipeline": "lab: 2-stage cp.async K/V ring",
    "persistent": "lab: persistent grid",
    "tma_ring": "sm_90: K/V by TMA into a 2-stage ring",
    "interleave_softmax": "sm_90: softmax sliced into the P V MMAs",
    "wgmma": "sm_90a: warpgroup MMAs, TMA producer warp",
    "wg_ring3": "sm_90a: a third K/V stage",
    "wg_overlap": "sm_90a: S of block j issued with P V of block j-1",
    "wg_pingpong": "sm_90a: consumer warpgroups take turns at the MMAs",
    "wg_persistent": "sm_90a: persistent CTAs, next tile loaded under this one's store",
    "wg_free": "sm_90a: persistent, the warpgroups without turns",
    "wg_cluster": "sm_90a: K/V multicast to clusters of two CTAs",
    "wg_q2": "sm_90a: Q in two buffers, the next tile's loaded during this one",
    "wg_split_tail": "sm_90a: the last two waves dealt out as runs of K/V blocks",
    "wg_rescale_first": "sm_90a: O rescaled under the next S = Q K^T",
    "wg_tall": "sm_90a: three consumer warpgroups (B_r = 192)",
    "wg_tall_rescale_first": "sm_90a: B_r = 192, O rescaled under the next S = Q K^T",
    "wg_tall_late_o": "sm_90a: B_r = 192, O's addresses built after the K/V loop",
    "wg_tall_correction_first": "sm_90a: B_r = 192, row sums from the corrected old sums",
}


def family(arch: str) -> str:
    """``sm_90a`` -> ``sm_90``; the Ampere/Ada variants share the ``sm_80`` entry."""
    return "sm_90" if arch.startswith("sm_9") else "sm_80"


#: Head dims, per architecture family, where kernel 7's 32 rows per warp would spill (O alone
#: is D fp32 registers per row pair): 16 rows per warp (block_m = 64) keeps them spill-free
#: (tests/test_compile.py). On Hopper hd96 builds spill-free at 32 rows per warp, and
#: measured 1.09-1.10x against 0.90-0.92x at 16 (docs/ladder.md, "hd32 and hd96").
SIXTEEN_ROWS_PER_WARP: dict[str, tuple[int, ...]] = {"sm_80": (96, 192, 256),
                                                     "sm_90": (192, 256)}


def k07_for(arch: str, head_dim: int = 128) -> FlashConfig:
    """Kernel 7 for an architecture (and head dim): the tuned configuration of its family."""
    config = TUNED_K07[family(arch)]
    if head_dim in SIXTEEN_ROWS_PER_WARP[family(arch)]:
        config = config.replace(block_m=64)
    return config


NAMED: dict[str, FlashConfig] = {**LADDER, **LAB_VARIANTS, **HOPPER_STEPS, **WGMMA_STEPS}


def named_for(arch: str, head_dim: int = 128, ladder_family: str | None = None
              ) -> dict[str, FlashConfig]:
    """``NAMED`` (or the rows of ``FAMILIES[ladder_family]``) without the configs that ``arch``
    cannot run at ``head_dim`` (the sm_90 steps on an Ampere GPU, a tile over its shared
    memory)."""
    names = FAMILIES[ladder_family] if ladder_family is not None else NAMED
    runnable = {}
    for name in names:
        config = NAMED[name]
        try:
            config.check_problem(head_dim, arch)
        except ConfigError:
            continue
        runnable[name] = config
    return runnable


def get(name: str) -> FlashConfig:
    """A named configuration: a ladder step (``"k01"`` ... ``"k16"``) or a lab variant."""
    try:
        return NAMED[name]
    except KeyError:
        raise KeyError(f"unknown ladder config {name!r}; known: {sorted(NAMED)}") from None


def resolve(spec: str) -> FlashConfig:
    """A config from a ladder name (``k07``) or a JSON file of ``FlashConfig`` fields."""
    import json
    from pathlib import Path

    if spec in NAMED:
        return NAMED[spec]
    path = Path(spec)
    if path.suffix == ".json" and path.exists():
        return FlashConfig.from_dict(json.loads(path.read_text()))
    raise KeyError(f"{spec!r} is neither a ladder config ({', '.join(NAMED)}) nor a JSON file "
                   "of FlashConfig fields")
