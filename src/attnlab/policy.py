"""Which configuration ``attention()`` runs when neither the caller nor ``attnlab tune`` chose.

Production policy, kept apart from the ladder (``attnlab.ladder`` only names the steps): the
defaults start from the ladder's tuned kernel 7 and add the steps that measured faster on
each architecture family, per head dim, mask and dtype. Every table entry cites the session
in ``docs/ladder.md`` that measured it.
"""

from __future__ import annotations

import itertools

from attnlab.backward_config import backward_head_dims, default_backward
from attnlab.config import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, ConfigError, FlashConfig
from attnlab.kernels.abi import (
    BackwardSpec,
    CombineSpec,
    DecodeSpec,
    ForwardSpec,
    PreprocessSpec,
)
from attnlab.ladder import HOPPER_STEPS, INTERLEAVED_SOFTMAX, TMA_RING, family, k07_for

#: What the default changes on the sm_90 family per (head dim, windowed, dtype), each measured
#: against the plain default on an H200 (docs/ladder.md, "Row sums in chains", "B_c = 128
#: at hd64", "hd32 and hd96", "TMA K/V loads" and "Tenth session"): the TMA ring where it
#: measured faster, at hd128 with the sliced softmax at -O1;
#: the row-sum chains; at hd32/hd64 B_c = 128 (S then fits beside the narrow O); kernel 13's
#: backward K/V walk where it measured faster. Other problems keep the plain default (for
#: hd96: ``SIXTEEN_ROWS_PER_WARP``). CuTe DSL 4.8 builds two of these with spills that 4.3.5
#: did not (docs/measurement.md, "CuTe DSL 4.8"): plain hd96 at -O3 (32 B; -O1 is spill-free)
#: and fp16 hd128 with the sliced softmax (64 B; the whole-tile softmax at -O1 is spill-free).
#: Causal hd128 on a persistent grid (the lab's knob; H100, twenty-ninth session, forward
#: alone: +6 to +9 % at seq 2k and 8k, slower at every other hd64/hd128 point:
#: docs/backward.md, "the sm80 path's forward").
SM90_DEFAULT_KNOBS: dict[tuple[int, bool, str], dict[str, object]] = {
    (32, False, "bfloat16"): {"block_n": 128, **TMA_RING},
    (32, False, "float16"): {"block_n": 128, **TMA_RING},
    (32, True, "bfloat16"): {"block_n": 128, "reverse_kv": True, **TMA_RING},
    (32, True, "float16"): {"block_n": 128, "reverse_kv": True, **TMA_RING},
    (64, False, "bfloat16"): {"block_n": 128, "row_sum_chains": 8, **TMA_RING},
    (64, False, "float16"): {"block_n": 128, "row_sum_chains": 4, **TMA_RING},
    (64, True, "bfloat16"): {"block_n": 128, "row_sum_chains": 4, "reverse_kv": True,
                             **TMA_RING},
    (64, True, "float16"): {"block_n": 128, "row_sum_chains": 8, "reverse_kv": True,
                            **TMA_RING},
    (96, False, "bfloat16"): {"ptxas_opt_level": 1},
    (96, False, "float16"): {"ptxas_opt_level": 1},
    (96, True, "bfloat16"): TMA_RING,
    (96, True, "float16"): TMA_RING,
    (128, False, "bfloat16"): {"row_sum_chains": 4, **TMA_RING, **INTERLEAVED_SOFTMAX},
    (128, False, "float16"): {**TMA_RING, "ptxas_opt_level": 1},
    (128, True, "bfloat16"): {"row_sum_chains": 4, **TMA_RING, **INTERLEAVED_SOFTMAX,
                              "persistent": True},
    (128, True, "float16"): {**TMA_RING, "ptxas_opt_level": 1, "persistent": True},
}


#: The wgmma kernel's tile per (head dim, windowed): FA3's two overlaps everywhere (eleventh
#: session: hd128 seq 4k 526 -> 652 TFLOP/s end to end), B_r / B_c / stages from the tile
#: sweeps on an H100 (docs/ladder.md, twelfth and thirteenth sessions,
#: ``scripts/sm90_candidates.py``). Three consumer warpgroups (B_r = 192) at hd32/64/96; under
#: a mask only with the longest-first order over L2 sections (``lpt``: +5% at hd64, +10% at
#: hd32; without it the taller tile's longer tail cancels its gain). P pinned (``fence_p``) at
#: B_c 80 and 96: without it ptxas splits the P V MMAs and hd256 B_c 80 runs at half speed.
#: ``lpt`` measured -5% at hd128 with 40 MiB sections and -1% with 8-16 MiB, so hd128 keeps the
#: per-head order; hd256 gains 4% more with 16 MiB sections (8 heads at 4k) than with 40.
#: A persistent grid (nineteenth session, seq 2k and 4k, end to end): +2 to +6% unmasked at
#: every head dim (hd128 with two K/V stages, so that O has a tile of its own), under a mask
#: +6% at hd128 and hd256 (in the per-head order) and +13% at seq 2k. Masked from seq 4k the
#: three-warpgroup tiles and hd256 draw their tiles from a counter (``dynamic_tiles``;
#: twentieth session, end to end against the static walk and one CTA per tile in the same
#: run): hd32 +5% at 4k and 16k, hd64 +7% at 4k with B_c 96 (whose S leaves three
#: warpgroups without spills), hd96 +2 to +5%, hd256 with ``lpt`` over 16 MiB sections +2 to
#: +10% over its one-CTA tile at 4k-16k (the Hopper table's shapes). hd128 keeps the static
#: walk where it balances (+2 to +4% over the counter at 4k and 8k; the dispatcher hands an
#: unbalanced walk to the counter: +8% at 16k); hd192, even on every grid, one CTA per tile.
#: hd128 unmasked without the warpgroups' turns (thirty-third session, seq 2k-16k, same runs):
#: +0.7 to +3.7 % device only on an H100 and +0.1 to +2.1 % on an H200, +0.3 to +2.5 % end to
#: end; under a mask the turns stay (-1.1 to -3.7 % without them); at hd192 / hd256 they are
#: even (within 1 %), at hd32-96 with three warpgroups dropping them loses up to 11 % (hd64).
#: The three-warpgroup tiles keep their turns (without them hd64 lost 11 %) but rescale O
#: under the next S = Q K^T where it measured faster (thirty-fourth session, H100, device
#: only): hd64 +0.9 to +1.5 % plain (seq 2k-16k) and +0.7 to +1.1 % causal from 4k; hd96
#: plain +0.9 to +4.4 % (causal even); hd32 -3 to -5 %, so not there.
_RESCALE_FIRST = {"rescale_o_before_pv": True}
#: hd64 unmasked then went back to O rescaled after its P V, with the epilogue's addresses
#: built after the K/V loop (``late_o_addresses``; thirty-seventh session, H100, seq 8k and
#: 16k, end to end (device only) against the rescale first): bf16 550 (556) -> 552 (559), 553
#: (557) -> 554 (561); fp16 514 (522) -> 526 (533), 517 (527) -> 528 (543). The 16 address
#: registers no longer held across the loop let ptxas wait for the previous P V after 11 of
#: the softmax's 66 exponentials instead of before the first (as FA4's build does); either
#: change alone leaves the wait first. Under a mask the pair measured even and the late
#: addresses alone -3 %, so not there.
_LATE_O = {"late_o_addresses": True}
#: FA4's schedule above hd128: no turns and O rescaled under the next S = Q K^T. hd256
#: (thirty-fourth session, H100, seq 4k, same run): +2.7 % device only (+2.9 % end to end)
#: unmasked, +2.5 % (+3.5 %) causal, where either alone had measured within 1 %. hd128's
#: masked tile of the 2k and 4k buckets: ``_LONG_MASKED_TILES``.
_NO_TURNS_RESCALE_FIRST = {"pingpong": False, **_RESCALE_FIRST}
#: hd256 keeps its row maxima within 2^8 and skips O's rescale (128 multiplies a thread and
#: block, 28 % of the loop body) where no row of a warp moved (``lazy_rescale``), plain and
#: masked at every length of the long tiles (forty-fifth session, H100, 16k tokens, end to
#: end (device only), default -> lazy): plain bf16 2k 658 (725) -> 663 (740), 4k 696 (769) ->
#: 701 (782), 8k 732 (779) -> 739 (789), 16k 742 (798) -> 750 (809); fp16 2k 654 (700) ->
#: 660 (713), 8k 713 (752) -> 719 (764), 16k 719 (763) -> 727 (774); causal bf16 8k 703
#: (760) -> 714 (777), 16k 733 (778) -> 740 (789), fp16 8k 682 (722) -> 691 (736), 16k 712
#: (752) -> 725 (767). Packed sequences take it too (their tests pass; not timed). hd192
#: (96 multiplies, 22 % of its plain body) likewise, plain and masked at every length
#: (forty-sixth session, H100, the same shapes, seq 2k-16k): plain bf16 657 (713) -> 660
#: (723), 727 (778) -> 731 (790), 741 (786) -> 743 (794), 774 (808) -> 785 (808); fp16 628
#: (690) -> 640 (707), 693 (748) -> 704 (768), 715 (751) -> 721 (771), 735 (768) -> 754
#: (786); causal bf16 531 (556) -> 529 (560), 628 (678) -> 632 (688), 695 (730) -> 698
#: (744), 734 (772) -> 734 (783); fp16 505 (541) -> 510 (550), 614 (662) -> 617 (671), 684
#: (712) -> 683 (717), 722 (750) -> 721 (756): device only +0 to +2.7 % at every point, end
#: to end -0.4 to +2.6 %.
_LAZY = {"lazy_rescale": True}
#: Each row's sum started from the old sum times its correction (``correction_first``;
#: forty-seventh session, H100, 16k tokens, device only, default -> it, in two or three runs):
#: O's rescale then runs under P's exponentials instead of ending the loop body. hd64 plain
#: bf16 2k-16k +0.5 to +2.7 %, fp16 -0.5 to +1.5 % (eleven of twelve points up); hd128 masked
#: 2k-16k bf16 -0.4 to +0.7 %, fp16 +0.6 to +2.4 %; hd96 masked 2k-8k +0.5 to +2.1 %; hd32
#: fp16 plain +4.6 to +5.8 %, bf16 plain even, masked even to +1.1 %. Not hd64 masked
#: with O rescaled before P V (-0.4 to -3.2 %; from 8k, with O rescaled after it, see
#: ``_VERY_LONG_MASKED_TILES``), hd96 plain (-3.5 to +0.3 %), hd128 plain (-3.5 to 0 %), nor
#: the short masked tiles (hd128 1k -1 %); hd192 and hd256, whose loop bodies barely change,
#: untimed.
_CORRECTION_FIRST = {"correction_first": True}
#: FA4's order of a loop body under a mask, at hd64: the row sums from the corrected old
#: sums, O rescaled after P V, the epilogue's addresses built after the loop (in the CPU
#: builds the P V wait comes after 10-26 of the exponentials at 16k, 11-12 at 1k, and none
#: of O's multiplies after the last; measured on hd64's short and very long masked tiles,
#: below).
FA4_ORDER = {**_CORRECTION_FIRST, "rescale_o_before_pv": False, **_LATE_O}
#: Q in two buffers (``q_stages``): the next tile's Q loads while this tile's K/V blocks are
#: walked, instead of once the consumers are done with this one's (ncu, hd64 causal 1k: the
#: most-sampled stall was that wait, at a tile's start). Forty-ninth session, H100, 16k
#: tokens, bf16 unless noted, end to end (device only), default -> it: hd64 short masked
#: tile 1k 302 (316) -> 320 (337), fp16 297 (309) -> 302 (314); hd64 plain 1k 404 (429) ->
#: 421 (451), 4k 508 (559) -> 514 (563); hd128 plain 1k 562 (615) -> 607 (655), 4k 661 (722)
#: -> 670 (732); hd128 causal 1k 429 (452) -> 454 (479), 4k 588 (648) -> 600 (660); hd128
#: plain 16k 692 (725) -> 700 (731). Not hd64's three-warpgroup masked tiles (2k 409 -> 400,
#: 4k 474 -> 460 device only, fp16 likewise -0.4 to -2.7 %), nor hd64 plain from 8k
#: (``_LONG_PLAIN_TILES``).
_Q_DOUBLE = {"q_stages": 2}
_M192 = {"block_m": 192, "num_warps": 12}
_PERSISTENT = {"persistent": True}
#: One CTA per tile: neither the persistent walk nor what only it has (the counter, Q's
#: second buffer).
ONE_CTA = {"persistent": False, "dynamic_tiles": False, "q_stages": 1}
_DYNAMIC = {"persistent": True, "dynamic_tiles": True}
_WGMMA_TILES: dict[tuple[int, bool], dict[str, object]] = {
    (32, False): {**_M192, "block_n": 128, "kv_stages": 3, **_CORRECTION_FIRST,
                  **_PERSISTENT},
    (32, True): {**_M192, "block_n": 128, "kv_stages": 3, "lpt": True, **_CORRECTION_FIRST,
                 **_DYNAMIC},
    (64, False): {**_M192, "block_n": 128, "kv_stages": 3, **_LATE_O, **_CORRECTION_FIRST,
                  **_PERSISTENT, **_Q_DOUBLE},
    (64, True): {**_M192, "block_n": 96, "kv_stages": 3, "fence_p": True, "lpt": True,
                 **_RESCALE_FIRST, **_DYNAMIC},
    (96, False): {**_M192, "block_n": 96, "kv_stages": 2, "fence_p": True, **_RESCALE_FIRST,
                  **_PERSISTENT},
    (96, True): {**_M192, "block_n": 96, "kv_stages": 2, "fence_p": True, "lpt": True,
                 **_CORRECTION_FIRST, **_DYNAMIC},
    (128, False): {"block_n": 128, "kv_stages": 2, "pingpong": False, **_PERSISTENT,
                   **_Q_DOUBLE},
    (128, True): {"block_n": 128, "kv_stages": 2, **_CORRECTION_FIRST, **_PERSISTENT,
                  **_Q_DOUBLE},
    (192, False): {"block_n": 96, "kv_stages": 2, "fence_p": True, **_LAZY, **_PERSISTENT},
    (192, True): {"block_n": 96, "kv_stages": 2, "fence_p": True, "lpt": True, **_LAZY},
    # Unmasked hd256 below ``LONG_PLAIN_SEQLEN`` at B_c 64 (fifty-third session, H200, end to
    # end (device only), B_c 80 -> 64, 16k tokens of 8 heads): bf16 1k 604 (657) -> 619 (669),
    # 2k 678 (731) -> 689 (742), 4k 716 (746) -> 727 (758); fp16 1k 574 (641) -> 584 (651), 2k
    # 646 (690) -> 655 (701), 4k 688 (715) -> 697 (725) (batch 4 x 16 heads: 2k, 4k +1.3 to
    # +2.3 %). From 8k it keeps B_c 80 (``_LONG_PLAIN_TILES``).
    (256, False): {"block_n": 64, "kv_stages": 2, **_NO_TURNS_RESCALE_FIRST, **_LAZY,
                   **_PERSISTENT},
    # Masked hd256 at B_c 64, not 80 (fifty-third session, H200, causal, batch 4 x 16 heads,
    # end to end (device only), B_c 80 -> 64): bf16 2k 567 (625) -> 576 (631), 3k 610 (650) -> 614
    # (664), 4k 660 (681) -> 663 (685), 8k 721 (742) -> 723 (746), 16k 767 (771) -> 780 (790);
    # fp16 2k 532 (602) -> 542 (615), 3k 586 (644) -> 594 (654), 4k 636 (655) -> 646 (662), 8k
    # 702 (706) -> 698 (710), 16k 745 (750) -> 758 (770): a 128-row tile's diagonal crosses
    # fewer masked keys in 64-key blocks. (Measured with P pinned, ``fence_p``, whose SASS at
    # this power-of-two width differs by 8 of 3,672 instructions, none of them MMAs.)
    (256, True): {"block_n": 64, "kv_stages": 2, "lpt": True,
                  "l2_section_mb": 16, **_NO_TURNS_RESCALE_FIRST, **_LAZY, **_DYNAMIC},
}
#: Masked and shorter than ``LONG_MASKED_SEQLEN`` queries: the tiles of two warpgroups in the
#: per-head order, on a persistent grid (+9 to +13% at seq 2k: hd64, hd128, hd256). At seq 1k
#: the three-warpgroup, longest-first hd64 tile measured 0.81x of this one (192 rows leave a
#: partial last row block and fewer tiles to balance) and hd256's B_c 80 0.89x of B_c 64 (1k
#: keys leave a partial last K/V block, masked); both won from 8k. With the R2P mask and the
#: rescale first since, the long masked tiles won from seq 2k (thirty-fifth session, H200, bf16,
#: 16k tokens, end to end (device only)): hd64 2k 363 -> 383 (374 -> 394) and again 363 -> 384,
#: 3k 387 -> 442; hd256 2k 553 -> 570 (604 -> 617); hd32 223 -> 233, hd96 446 -> 457; at 1k
#: the short tiles still won (hd64 302 against 274, hd256 459 against 450). hd64's rescales O
#: under the next S = Q K^T (forty-sixth session, H100, causal, 16k tokens, end to end
#: (device only), default -> rescale first, two calls): 1k bf16 296 (305) -> 297 (309) and 299
#: (309) -> 301 (311), fp16 290 (300) -> 295 (305) and 292 (306) -> 296 (310); 512 bf16 219
#: (221) -> 220 (222), fp16 216 (217) -> 219 (220): +0.5 to +1.7 % device only. hd256's rescales
#: lazily, as its long tiles do (same session, one call): 1k bf16 424 (457) -> 441 (477), fp16
#: 421 (451) -> 440 (472); 512 bf16 292 (299) -> 296 (305), fp16 288 (299) -> 294 (303).
#: hd64's then took FA4's order (``FA4_ORDER``; forty-eighth session, H100, causal, end to
#: end (device only), rescale first -> it): 1k B = 16 x 32 heads bf16 302 (308) -> 309 (315),
#: fp16 295 (309) -> 300 (313); 512 B = 32 bf16 219 (223) -> 223 (227), fp16 214 (222) ->
#: 214 (221); 1k B = 4 x 16 heads bf16 260 (247) -> 265 (251), fp16 258 (247) -> 260 (250).
_SHORT_MASKED_TILES: dict[int, dict[str, object]] = {
    32: {"block_n": 128, "kv_stages": 3, **_PERSISTENT},
    64: {"block_n": 128, "kv_stages": 3, **FA4_ORDER, **_PERSISTENT, **_Q_DOUBLE},
    96: {"block_n": 128, "kv_stages": 2, **_PERSISTENT},
    256: {"block_n": 64, "kv_stages": 2, **_LAZY, **_PERSISTENT},
}
#: A persistent masked tile whose CTAs' static walk would leave them unbalanced (the busiest
#: over ``MAX_IMBALANCE`` times the average; measured: hd128 causal seq 16k 0.69x and hd256
#: causal 8k-16k 0.59-0.70x the better peer where the walk predicts 1.54-1.80) draws its
#: tiles from the counter instead (``dispatch``).
#: Masked hd128 from ``VERY_LONG_MASKED_SEQLEN`` queries: FA4's grid, one CTA per tile in the
#: longest-first order over 16 MiB L2 sections (thirty-fifth session, H200, bf16, causal, 16k
#: tokens, end to end (device only), against the persistent static walk the dispatcher would
#: run, or its counter where that walk is unbalanced): 8k 620 -> 634 (643 -> 665), 16k (the
#: counter) 658 -> 681 (696 -> 708); shorter it lost (4k 590 -> 583, 2k 526 -> 488), as the
#: order over 40 MiB sections had on the persistent grid (thirteenth session). Sliding windows
#: (equal tiles) take it too, not measured. hd64 from 8k on the long masked tile's grid at
#: B_c 128 instead of 96 (4 spilled values; thirty-sixth session, H100, causal, 16k tokens, end
#: to end (device only)): fp16 8k 462 -> 474 (471 -> 485), 16k 489 -> 508 (496 -> 510); bf16
#: 8k 479 -> 479 (481 -> 484), 16k 510 -> 511 (517 -> 523); at 4k bf16 lost 1 % (425 -> 421).
#: That tile then took FA4's order (forty-eighth session, H100, causal, B = 4, two calls, end
#: to end (device only), default -> the row sums from the corrected old sums, O rescaled
#: after P V, the late addresses): bf16 8k 489 (510) -> 498 (522) and 489 (505) -> 504 (518),
#: 16k 505 (536) -> 515 (551) and 511 (530) -> 522 (543); fp16 8k 471 (496) -> 483 (505) and
#: 478 (505) -> 486 (530), 16k 485 (524) -> 498 (535) and 491 (522) -> 504 (531). The same
#: three on the 4k tile lost (bf16 469 -> 452 and 465 -> 451 device only, fp16 -2 %).
_VERY_LONG_MASKED_TILES: dict[int, dict[str, object]] = {
    64: {"block_n": 128, "fence_p": False, **FA4_ORDER},
    128: {**ONE_CTA, "lpt": True, "l2_section_mb": 16},
}
VERY_LONG_MASKED_SEQLEN = 8192
#: Masked hd64 up to ``MID_MASKED_SEQLEN`` queries (the 2k bucket): the long masked tile on the
#: static walk instead of the counter (the dispatcher still hands an unbalanced walk to the
#: counter). Thirty-sixth session, H100, causal, end to end (device only), counter -> static:
#: 2k B=8 bf16 351 -> 363 (388 -> 400), fp16 340 -> 350 (357 -> 369); 2k B=6 bf16 372 -> 384
#: (389 -> 402), fp16 355 -> 368 (381 -> 392); again 359 -> 379, 352 -> 366. The bucket's
#: other lengths lose: 1536 B=8 bf16 350 -> 342 (371 -> 365), fp16 342 -> 335 (-2 %). Not from
#: 3k: 3k B=4 bf16 430 -> 406 (-5.6 %), fp16 412 -> 391, though the host's balance model reads
#: that walk as even (1.03); 4k B=3 +1.6 % (bf16 426 -> 433, fp16 416 -> 423). Swept again at
#: 1280-4096 (thirty-seventh session, docs/ladder.md): neither a partial last row block nor
#: the balance model separates the lengths where the static walk wins.
_MID_MASKED_TILES: dict[int, dict[str, object]] = {64: {"dynamic_tiles": False}}
MID_MASKED_SEQLEN = 2048
#: Dense masked problems from ``LONG_MASKED_SEQLEN`` to below ``VERY_LONG_MASKED_SEQLEN``
#: queries keep their row maxima within 2^8 and skip O's rescale where no row moved
#: (``lazy_rescale``). Thirty-eighth session, H100, causal, 16k tokens, device only, default ->
#: lazy, two runs: 2k hd64 bf16 404 -> 407, fp16 393 -> 401, hd128 bf16 559 -> 570, fp16 548
#: -> 553; 4k hd64 471 -> 480 and 466 -> 474 (bf16), 455 -> 461 and 452 -> 460 (fp16), hd128
#: 640 -> 652 and 629 -> 642 (bf16), 618 -> 624 and 614 -> 619 (fp16), hd256 700 -> 722 (bf16),
#: 686 -> 699 (fp16); from 8k even (-0.8 to +0.3 %), plain problems -2 to 0 %
#: (docs/ladder.md). Sliding windows take it too (their tests pass; not timed). hd192's and
#: hd256's tiles have it at every length (``_LAZY``).
#: hd128's masked tile there also drops the warpgroups' turns and rescales O under the next
#: S = Q K^T (``_NO_TURNS_RESCALE_FIRST``; fifty-third session, H200, causal, batch 4 x 16
#: heads, end to end (device only), default -> it): bf16 2k 539 (572) -> 549 (573), 3k 580
#: (635) -> 588 (639), 4k 605 (658) -> 615 (664); fp16 2k 507 (546) -> 518 (551), 3k 545 (603)
#: -> 562 (615), 4k 566 (598) -> 581 (616) (fifty-second session, 4k: bf16 595 (649) -> 606
#: (655), fp16 562 (615) -> 577 (628) and 524 (533) -> 548 (550)). On the one-CTA tile from
#: the 8k bucket it lost: bf16 6k 614 (637) -> 569 (593), 8k 636 (654) -> 592 (607), 16k 676
#: (681) -> 630 (630); fp16 -1.1 to -1.6 %. (The thirty-third session's -1.1 to -3.7 % under a
#: mask was the turns dropped alone.)
_LONG_MASKED_TILES: dict[int, dict[str, object]] = {
    64: _LAZY, 128: {**_LAZY, **_NO_TURNS_RESCALE_FIRST}}
MAX_IMBALANCE = 1.05
LONG_MASKED_SEQLEN = 2048
#: Masked packed sequences below this (longest) query length run the short masked tiles: the
#: long ones were not measured on them from 2k.
LONG_MASKED_PACKED_SEQLEN = 4096
#: Packed sequences on a persistent walk draw their tiles from the counter (``dynamic_tiles``): the
#: host does not know the sequences' lengths, so the static snake deals each CTA tiles of unknown
#: length, many of them empty (a row block past its sequence's end). Fiftieth session, H100, the
#: Hopper table's ragged batch (16 sequences of 256-4096 tokens, 16 heads), end to end (device
#: only), default -> counter: plain bf16 hd64 365 (392) -> 490 (530), hd128 579 (647) -> 608 (685)
#: and 578 (570) -> 607 (599), hd256 624 (691) -> 645 (719); fp16 hd64 346 (381) -> 477 (519), hd128
#: 544 (611) -> 576 (653) and 533 (546) -> 575 (581), hd256 600 (676) -> 625 (703). Causal (from the
#: 4k bucket), against one CTA per tile (which they ran: hd64 B_c 128, hd128 three K/V stages): the
#: dense masked tile on the counter, bf16 hd64 328 (358) -> 384 (418), hd128 510 (581) -> 518 (586)
#: and 502 (538) -> 510 (546), hd256 554 (647) -> 568 (663); fp16 hd64 345 (368) -> 377 (408), hd128
#: 492 (564) -> 496 (566) and 495 (562) -> 502 (565), hd256 533 (590) -> 548 (614). From that bucket
#: hd32/96 (the tiles and walks of hd64) and hd192 plain take it unmeasured (hd192 masked has no
#: persistent walk). Masked below the 4k bucket (the same batch's lengths halved, 128-2048 tokens,
#: bf16 (fp16)), the short tile on the counter with one Q buffer, against one CTA per tile: hd32 164
#: (164) -> 177 (176), fp16 164 (167) -> 178 (181); hd64 279 (281) -> 309 (310) and 280 (282) -> 310
#: (311), fp16 279 (281) -> 301 (304); hd96 370 (380) -> 383 (393), fp16 360 (376) -> 375 (387);
#: hd128 417 (452) -> 435 (468) and 418 (455) -> 435 (470), fp16 426 (448) -> 437 (458); not hd256:
#: 487 (541) -> 478 (530) and 485 (542) -> 476 (530), fp16 463 (522) -> 450 (515). Plain at those
#: lengths the counter against one CTA per tile: hd64 436 (455) against 402 (424), hd128 564 (619)
#: against 528 (595), hd256 613 (683) against 619 (683).
_PACKED_WALK = {"dynamic_tiles": True}
_PACKED_SHORT_MASKED_WALK = {"dynamic_tiles": True, "q_stages": 1}
_PACKED_SHORT_MASKED_ONE_CTA_HEAD_DIMS = (256,)
#: A sliding window's tiles each walk about its band (``left + right + 1`` keys), all alike,
#: where a causal mask's walk 0 to Sq keys: so a dense band at most half as wide as the queries
#: looks its masked default up at another query length (``masked_lookup_seqlen``), per head
#: dim. hd128: the persistent walk of the 4k bucket (one CTA a tile, the longest first, is for
#: long causal walks of unequal lengths); hd256: the short masked tile (B_c 64, whose band
#: edges waste less of a block than B_c 80). Fifty-first session, H100, bf16, 16k tokens
#: (``scripts/window_candidates.py``), end to end (device only), default -> this, at 8k / 16k
#: queries: hd128 (512, 512) 453 (500) -> 521 (561) / 446 (480) -> 519 (541), (1024, 0) 489
#: (500) -> 540 (551) / 435 (494) -> 498 (554), (2048, 0) 518 (566) -> 555 (616) / 521 (603) ->
#: 569 (637), (4096, 0) at 16k 575 (668) -> 589 (684); hd256 (512, 512) 517 (545) -> 543 (572)
#: / 513 (550) -> 530 (567), (1024, 0) 503 (539) -> 516 (553) / 490 (536) -> 508 (551), (2048,
#: 0) 573 (661) -> 582 (668) / 559 (642) -> 575 (658), (4096, 0) at 16k 625 (729) -> 647 (732).
#: (At 8k, (4096, 0) is wider than half and keeps the causal lookup: hd128 580 (660) against
#: 587 (665), hd256 642 (719) against 641 (716).) hd64 keeps its own (the other buckets' tiles
#: -5 to +3 %); hd32 and hd192 (their defaults 1.06-1.20x FA4 at 16k) and packed sequences
#: are not measured further. hd96: the short masked tile (128 x 128) for a narrow band only
#: (``_BAND_MAX_WIDTH``): fifty-second session, H200, bf16, 8k / 16k queries, its default
#: (192 x 96, one CTA a tile) -> the short tile, end to end (device only): (256, 256) 319 (332)
#: -> 353 (362) / 310 (298) -> 343 (330), (512, 512) 399 (431) -> 424 (458) / 395 (424) -> 423
#: (453) (fp16 at 16k 398 (424) -> 427 (457); fifty-first session, H100, 401 (423) -> 433
#: (456)), (1024, 0) 412 (452) -> 418 (449) / 425 (448) -> 428 (452) (fp16 398 (452) -> 406
#: (461)), (768, 0) even (-0.5 to +0.3 %), but (1536, 0) 488 (518) -> 459 (489) / 472 (523) ->
#: 451 (500) and (2048, 0) 488 (543) -> 466 (525) / 491 (542) -> 478 (528). At 2k / 4k
#: queries (same H200): (256, 256) 317 (325) -> 351 (359) / 305 (309) -> 337 (340), (512, 0)
#: 297 (306) -> 326 (335) / 307 (312) -> 334 (340), (512, 512) 372 (412) -> 404 (444) / 387
#: (407) -> 410 (432), (1024, 0) 391 (426) -> 393 (433) / 410 (407) -> 415 (411): at 2k the
#: last two are wider than half the queries and gain too, so hd96 asks width only.
_BAND_LOOKUP_SEQLEN = {96: 1, 128: 4096, 256: 1}
#: The widest band (``left + right``) a head dim looks up by ``_BAND_LOOKUP_SEQLEN``, whatever
#: the query length; the others' bands are at most half as wide as the queries.
_BAND_MAX_WIDTH = {96: 1024}
#: Unmasked hd64 from ``LONG_PLAIN_SEQLEN`` queries keeps one Q buffer (forty-ninth session,
#: H100, 16k tokens, end to end (device only), two Q buffers -> one): fp16 8k 511 (541) ->
#: 545 (554), 16k 522 (534) -> 536 (551); bf16 8k 562 (586) -> 554 (583), 16k 534 (565) ->
#: 538 (567) and 561 (571) -> 561 (571). A tile there walks 64-128 K/V blocks, over which
#: the Q load's wait is spread thin; the two buffers won at 1k and 4k (``_Q_DOUBLE``).
#: hd256 keeps B_c 80 there (fifty-third session, H200, batch 4 x 16 heads, end to end (device
#: only), B_c 80 -> 64, in two runs: 8k bf16 748 (764) -> 747 (766) and 755 (772) -> 748
#: (767), fp16 735 (727) -> 717 (726) and 728 (743) -> 729 (738); 16k +3.1 to +5.2 %, but at
#: 16k tokens of 8 heads bf16 764 (784) -> 762 (786), fp16 734 (755) -> 735 (751)).
#: From there hd128 and hd256 deal their last two waves out as runs of K/V blocks
#: (``split_tail``; sixtieth session, H200, 16k tokens, end to end (device only), default ->
#: split; fp16 hd128 without its ``try_wait_first`` in either arm): bf16 hd128 8k 678 (703) ->
#: 686 (716), 16k 695 (710) -> 706 (721); hd256 8k 751 (785) -> 758 (803), 16k 777 (806) -> 793
#: (809); fp16 hd128 8k 655 (680) -> 657 (681), 16k 671 (680) -> 670 (682); hd256 8k 721 (765)
#: -> 729 (780), 16k 731 (774) -> 742 (793). Shorter
#: tiles pay more for a piece's start and merge: end to end 2k -0.2 to -1.9 %, 4k -0.5 to +0.9 %
#: (device only +0.4 to +1.5 %).
_SPLIT_TAIL = {"split_tail": True}
_LONG_PLAIN_TILES: dict[int, dict[str, object]] = {
    64: {"q_stages": 1}, 128: _SPLIT_TAIL,
    256: {"block_n": 80, "fence_p": True, **_SPLIT_TAIL}}
LONG_PLAIN_SEQLEN = 8192
#: Keys a short K/V sequence has at most (cross-attention to a CLIP-77 context): one K/V
#: block of 80 instead of 128 keys with 40 % padding. Measured at hd64 and hd128 (seed 004's
#: cross shapes, device only): +8-13 % at 77 keys (`docs/measurement.md`, sixteenth session).
SHORT_KV_SEQLEN = 80
_SHORT_KV_TILE = {"block_n": 80, "fence_p": True}
_SHORT_KV_HEAD_DIMS = (64, 128)
#: K and V multicast to clusters of two CTAs (``cluster_m``; docs/ladder.md, forty-third
#: session, H100): unmasked dense problems at hd128, hd192 and hd256 whose row blocks pair up
#: (an odd count leaves a CTA a tile past the end and the walk a wave longer: hd64 at 8k, 43
#: blocks, lost 4-10 %). Under the power cap a call took 2-3 % less energy and ran 2.4 %
#: (hd128, six rounds on two machines) and 3.4 % (hd256, two rounds) faster at 16k (on an
#: H200 1.8 and 2.0 %, and end to end +0 to +1 % at every point); device only +0.7 to +1.7 %
#: (hd128) and -0.3 to +1.6 % (hd256) from 1k to 4k, -1.4 to +0.8 % at 16k; end to end -1.2
#: to +1.1 %; hd192 (one run) -0.4 to +2.3 % end to end, +2.7 % under the cap. hd64 (+1.2 %
#: sustained, -2 to +1 % end to end), hd96 (-1.4 to -2.4 %), hd32 (-4 % in bf16, +4 % in
#: fp16: one run, not taken) and short K/V walks keep one CTA.
_CLUSTER_HEAD_DIMS = (128, 192, 256)
_FA3_SCHEDULE = {"intra_wg_overlap": True, "pingpong": True}
SM90A_WGMMA_KNOBS: dict[tuple[int, bool], dict[str, object]] = {
    key: {**_FA3_SCHEDULE, **tile} for key, tile in _WGMMA_TILES.items()}
SM90A_SHORT_MASKED_KNOBS: dict[int, dict[str, object]] = {
    head_dim: {**_FA3_SCHEDULE, **tile} for head_dim, tile in _SHORT_MASKED_TILES.items()}


def default_for(arch: str, head_dim: int = 128, windowed: bool = False,
                dtype: str = "bfloat16", varlen: bool = False,
                seqlen: int | None = None, short_kv: bool = False) -> FlashConfig:
    """What ``attention()`` runs without a tuned entry: on sm_90a, dense or packed, the
    warpgroup-MMA kernel with the tile measured best (``SM90A_WGMMA_KNOBS``; masked and
    ``seqlen`` below ``LONG_MASKED_SEQLEN`` (packed: ``LONG_MASKED_PACKED_SEQLEN``),
    ``SM90A_SHORT_MASKED_KNOBS``; dense and masked up to ``MID_MASKED_SEQLEN``,
    ``_MID_MASKED_TILES`` (hd64 on the static walk), from ``VERY_LONG_MASKED_SEQLEN``,
    ``_VERY_LONG_MASKED_TILES`` (hd64 B_c 128 in ``FA4_ORDER``, hd128 one CTA per tile
    longest first), below it ``_LONG_MASKED_TILES`` (hd64/128 lazy rescaling, hd128 without
    turns and O rescaled first; hd192's and hd256's tiles rescale lazily everywhere);
    unmasked from ``LONG_PLAIN_SEQLEN`` (or ``seqlen`` None), ``_LONG_PLAIN_TILES`` (hd64
    with one Q buffer, hd256 B_c 80);
    unmasked with at most ``SHORT_KV_SEQLEN`` keys (``short_kv``) at hd64/128, one 80-key
    block); packed sequences (``varlen``) on a persistent walk draw their tiles from the
    counter (``packed_walk``); fp16 on the static persistent walk with Q in two buffers waits
    for a ring stage by a try first (``_fp16_waits_first``); otherwise
    ``mma_sync_default_for``. (``windowed``: causal or sliding-window attention; ``dtype``:
    ``"bfloat16"`` or ``"float16"``; ``varlen``: packed sequences; ``seqlen``: the (longest)
    query length, None for long.)"""
    if arch == "sm_90a":
        config = _wgmma_default(head_dim, windowed, varlen, seqlen, short_kv)
        if dtype == "float16" and _fp16_waits_first(config):
            config = config.replace(try_wait_first=True)
        return config
    return mma_sync_default_for(arch, head_dim, windowed, dtype, varlen)


# fp16 defaults on the static persistent walk with Q in two buffers wait for a ring stage by
# one try first (``try_wait_first``). The fp16 builds of those configs (hd64 unmasked below
# 8k and its short masked tile, hd128 unmasked and masked below 8k, hd128's short K/V tile)
# lay the waiting loop's retry (a sleep and a second try) out inline in the K/V loop, where
# the bf16 builds of the same configs, and every hd64/hd128 build on the counter or with one
# Q buffer, keep it out of the loop (CPU SASS, fifty-fourth and fifty-fifth sessions): the
# fp16 hd64 plain 4k kernel ran 3.1 % more cycles than the bf16 one (FA4 the same in both),
# its extra stall samples on those sleeps (ncu, H200). Measured in the fifty-fourth session (H200,
# batch 4 x 16 heads, device only, ratio to cuDNN in the same process, two rounds, without
# -> with): fp16 hd64 plain 4k 1.116 / 1.124 -> 1.133 / 1.130, hd128 causal 4k 1.145 / 1.144
# -> 1.160 / 1.162, hd128 plain 16k 1.104 / 1.113 -> 1.121 / 1.120. Where the build has no
# inline retry the try costs: bf16 hd64 plain 4k 1.162 / 1.159 -> 1.143 / 1.143; in fp16,
# where the fifty-fifth session took it back out (same A/B, with -> without): hd128 causal
# 8k 1.115 / 1.083 -> 1.186 / 1.104 (633 / 647 -> 662 / 664 TFLOP/s), 16k 1.131 / 1.136 ->
# 1.184 / 1.183 (607 / 600 -> 623 / 624), hd64 plain 16k 1.195 / 1.195 -> 1.212 / 1.216
# (518 / 517 -> 530 / 527); hd64 plain 8k 1.162 / 1.162 -> 1.206 / 1.177 and causal 16k
# 1.195 / 1.195 -> 1.214 / 1.210 even in TFLOP/s (cuDNN moved); hd64 causal 4k even.
def _fp16_waits_first(config: FlashConfig) -> bool:
    """Whether an fp16 build of sm_90a ``config`` lays the ring stage's waiting retry out in its
    K/V loop, so that a try first (``try_wait_first``) takes it out: the static persistent walk
    with Q in two buffers (CPU SASS of every fp16 hd64/hd128 default, fifty-fifth session)."""
    return config.static_persistent_walk and config.q_stages == 2


def _wgmma_default(head_dim: int, windowed: bool, varlen: bool, seqlen: int | None,
                   short_kv: bool) -> FlashConfig:
    """``default_for``'s sm_90a config before its dtype's knobs."""
    limit = LONG_MASKED_PACKED_SEQLEN if varlen else LONG_MASKED_SEQLEN
    short = windowed and seqlen is not None and seqlen < limit
    if short and head_dim in SM90A_SHORT_MASKED_KNOBS:
        config = HOPPER_STEPS["wgmma"].replace(**SM90A_SHORT_MASKED_KNOBS[head_dim])
        return packed_walk(config, head_dim, windowed, seqlen) if varlen else config
    config = HOPPER_STEPS["wgmma"].replace(**SM90A_WGMMA_KNOBS[head_dim, windowed])
    dense_masked = windowed and not varlen and seqlen is not None
    if dense_masked and seqlen <= MID_MASKED_SEQLEN and head_dim in _MID_MASKED_TILES:
        config = config.replace(**_MID_MASKED_TILES[head_dim])
    very_long = dense_masked and seqlen >= VERY_LONG_MASKED_SEQLEN
    if very_long and head_dim in _VERY_LONG_MASKED_TILES:
        config = config.replace(**_VERY_LONG_MASKED_TILES[head_dim])
    long = dense_masked and LONG_MASKED_SEQLEN <= seqlen < VERY_LONG_MASKED_SEQLEN
    if long and head_dim in _LONG_MASKED_TILES:
        config = config.replace(**_LONG_MASKED_TILES[head_dim])
    long_plain = not windowed and (seqlen is None or seqlen >= LONG_PLAIN_SEQLEN)
    if long_plain and head_dim in _LONG_PLAIN_TILES:
        config = config.replace(**_LONG_PLAIN_TILES[head_dim])
    if short_kv and not windowed and head_dim in _SHORT_KV_HEAD_DIMS:
        config = config.replace(**_SHORT_KV_TILE)
    if varlen:
        # Packed sequences' tiles differ in length: no split tail (their walk is the counter's).
        return packed_walk(config.replace(split_tail=False), head_dim, windowed, seqlen)
    return config


def paired_row_blocks(config: FlashConfig, head_dim: int, seqlen_q: int) -> FlashConfig:
    """The sm_90a default of an unmasked dense problem (``default_for`` at ``head_dim``,
    neither packed nor with a short K/V walk) with its row blocks paired in clusters of two
    that share their K/V loads (``_CLUSTER_HEAD_DIMS``), where ``seqlen_q`` queries make an
    even count of them; otherwise ``config``."""
    if (head_dim in _CLUSTER_HEAD_DIMS and config.static_persistent_walk
            and row_blocks_pair(config, seqlen_q)):
        return config.replace(cluster_m=2)
    return config


def row_blocks_pair(config: FlashConfig, seqlen_q: int) -> bool:
    """Whether ``seqlen_q`` queries make an even count of ``config``'s row blocks: the count
    where clusters of two CTAs (``cluster_m=2``) waste no tile (an odd count measured 4-10 %
    slower with them, docs/ladder.md, forty-third session)."""
    return -(-seqlen_q // config.block_m) % 2 == 0


def masked_lookup_seqlen(head_dim: int, seqlen_q: int, window: tuple[int, int]) -> int:
    """The query length by which a dense problem's default is looked up: ``seqlen_q``, but
    for a sliding window (both sides bounded, ``window = (left, right)``) at most half as wide
    as the queries (at most ``_BAND_MAX_WIDTH`` wide where that table has the head dim) at a
    head dim of ``_BAND_LOOKUP_SEQLEN``, that table's length if shorter."""
    left, right = window
    if head_dim in _BAND_MAX_WIDTH:
        narrow = left + right <= _BAND_MAX_WIDTH[head_dim]
    else:
        narrow = 2 * (left + right + 1) <= seqlen_q
    if 0 <= left and 0 <= right and narrow and head_dim in _BAND_LOOKUP_SEQLEN:
        return min(seqlen_q, _BAND_LOOKUP_SEQLEN[head_dim])
    return seqlen_q


def packed_walk(config: FlashConfig, head_dim: int, windowed: bool,
                seqlen: int | None) -> FlashConfig:
    """An sm_90a ``config`` chosen for dense problems (the default or a tuned entry), for
    packed sequences whose longest has ``seqlen`` queries: a persistent walk on the counter
    (``_PACKED_WALK``; masked below ``LONG_MASKED_PACKED_SEQLEN`` with one Q buffer, at hd256
    one CTA per tile); either way the counter or the hardware hands each tile to whichever
    CTA is free, where a fixed walk over tiles whose lengths the host does not know leaves
    some CTAs far more work than others. The ``mma.sync`` kernel's grid stays as it is."""
    if not (config.wgmma and config.persistent):
        return config
    if not (windowed and seqlen is not None and seqlen < LONG_MASKED_PACKED_SEQLEN):
        return config.replace(**_PACKED_WALK)
    if head_dim in _PACKED_SHORT_MASKED_ONE_CTA_HEAD_DIMS:
        return config.replace(**ONE_CTA)
    return config.replace(**_PACKED_SHORT_MASKED_WALK)


def mma_sync_default_for(arch: str, head_dim: int = 128, windowed: bool = False,
                         dtype: str = "bfloat16", varlen: bool = False) -> FlashConfig:
    """The best ``mma.sync`` configuration without a tuned entry: kernel 7 plus the steps
    since that measured faster (``docs/ladder.md``): kernel 12's unpredicated full tiles,
    kernel 16's compiled-in strides (one compile per head count / layout) and, on Hopper,
    the knobs measured best for the problem (``SM90_DEFAULT_KNOBS``; packed sequences load
    K/V with ``cp.async``)."""
    config = k07_for(arch, head_dim).replace(unpredicated_full_tiles=True, static_strides=True)
    if family(arch) == "sm_90":
        knobs = SM90_DEFAULT_KNOBS.get((head_dim, windowed, dtype), {})
        if varlen:
            # No TMA for packed sequences, and the sliced softmax without the ring measured
            # slower than kernel 16 (1.07-1.09x against 1.09-1.11x): both go.
            knobs = {name: value for name, value in knobs.items()
                     if name not in TMA_RING and name not in INTERLEAVED_SOFTMAX}
        config = config.replace(**knobs)
    return config


def default_specs(arch: str) -> list[ForwardSpec]:
    """The kernels ``attention()`` runs on ``arch`` without a tuned entry: every supported head
    dim, both dtypes, plain and masked, each bucket of query lengths the dispatch looks the
    default up by (``tune.cache.SEQLEN_BUCKETS``), with and without a short K/V walk and the
    LSE, dense batches and packed sequences (a ``static_strides`` default with the strides of
    contiguous tensors of ``abi.CANONICAL_HEADS`` heads), dense plain ones also with their
    row blocks paired (``paired_row_blocks``). What ``attnlab cache --warm`` compiles."""
    from attnlab.tune.cache import SEQLEN_BUCKETS

    specs = []
    for head_dim, dtype, windowed, varlen, seqlen, short_kv in itertools.product(
            SUPPORTED_HEAD_DIMS, SUPPORTED_DTYPES, (False, True), (False, True),
            SEQLEN_BUCKETS, (False, True)):
        config = default_for(arch, head_dim, windowed, dtype, varlen, seqlen, short_kv)
        configs = [config]
        if not (windowed or short_kv or varlen):
            configs.append(paired_row_blocks(config, head_dim, 2 * config.block_m))
        specs += [ForwardSpec(c, arch, dtype, head_dim, windowed, varlen, with_lse)
                  for c in configs for with_lse in (False, True)]
    return list(dict.fromkeys(specs))


def default_backward_specs(arch: str) -> list[BackwardSpec | PreprocessSpec]:
    """The backward kernels a training step runs on ``arch`` by default: every backward head
    dim and dtype, dense and packed, plain and masked, and the preprocess with and without
    the LSE's gradient. What ``attnlab cache --warm`` compiles beside ``default_specs``."""
    specs: list[BackwardSpec | PreprocessSpec] = []
    for head_dim in backward_head_dims(arch):
        for dtype in SUPPORTED_DTYPES:
            for varlen in (False, True):
                specs += [BackwardSpec(default_backward(head_dim, arch, varlen,
                                                        windowed=windowed),
                                       arch, dtype, head_dim, windowed, varlen)
                          for windowed in (False, True)]
                specs += [PreprocessSpec(arch, dtype, head_dim, varlen, with_dlse)
                          for with_dlse in (False, True)]
    return specs


def decode_specs(arch: str) -> list[DecodeSpec | CombineSpec]:
    """The decoding kernels a call may build on ``arch``, bf16: every head dim whose tile fits,
    contiguous and paged, whole and split (merged by the combine, serially or, on sm_90a, in
    clusters of two), and the combine (``attnlab audit``'s family; the masked and
    ``cache_batch_idx`` variants differ only in their row addressing)."""
    from attnlab.decode import decode_tile

    specs: list[DecodeSpec | CombineSpec] = []
    for head_dim in SUPPORTED_HEAD_DIMS:
        try:
            keys_per_warp, stages = decode_tile(head_dim, arch)
        except ConfigError:
            continue
        specs += [DecodeSpec(arch, "bfloat16", head_dim, paged, False, False, split,
                             keys_per_warp, stages, serial_merge=serial)
                  for paged in (False, True)
                  for split, serial in ((False, False), (True, False), (True, True))]
        if arch == "sm_90a":
            specs += [DecodeSpec(arch, "bfloat16", head_dim, paged, False, False, False,
                                 keys_per_warp, stages, cluster_splits=2)
                      for paged in (False, True)]
        specs.append(CombineSpec(arch, "bfloat16", head_dim))
    return specs
