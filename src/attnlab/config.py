"""The forward-kernel configuration: one frozen dataclass whose knobs are named after the seeds.

A config describes *how* a FlashAttention-2 forward kernel is built (tiling, copy
strategy, shared-memory layout, scheduling of on-chip loads, softmax form); the problem
(dtype, head dim) is supplied separately when the kernel is compiled, so one config serves
several problems. Invalid combinations are rejected when the config is built, with the reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

Swizzle = Literal["none", "xor", "pad8"]
SWIZZLE_MODES: tuple[str, ...] = ("none", "xor", "pad8")

#: Rows/columns of one 16x8x16 ``mma.sync`` along M and along the reduction (K) dimension.
MMA_M = 16
MMA_K = 16
#: Rows of one ``wgmma`` (a warpgroup's share of ``block_m``).
WGMMA_M = 64
#: An 8x8 ``ldmatrix`` fragment is 8 elements wide: two of them cover one MMA_K step.
FRAG_COLS = 8

#: Head dims the kernels serve (MMA tiles need multiples of 16; the swizzle atom 32).
SUPPORTED_HEAD_DIMS: tuple[int, ...] = (32, 64, 96, 128, 192, 256)
#: MiB of K and V an L2 section of the longest-first order keeps by default (``lpt``).
L2_SECTION_MB = 40
#: The largest section (MiB of K/V; the kernel computes its bytes in 32 bits). Far above the
#: L2: one section of every head, the longest-first order over the whole launch.
MAX_L2_SECTION_MB = 1024
SUPPORTED_DTYPES: tuple[str, ...] = ("float16", "bfloat16")

#: Shared memory a CTA may use (bytes), per target architecture.
SMEM_CAPACITY = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024,
                 "sm_90": 227 * 1024, "sm_90a": 227 * 1024}


class ConfigError(ValueError):
    """A kernel configuration that cannot be built, with the reason."""


@dataclass(frozen=True)
class FlashConfig:
    """Knobs of the FlashAttention-2 forward kernels (named after the seeds' kernels 1-16
    and the GA104 lab's variants; ``wgmma`` selects the Hopper kernel).

    Attributes:
        block_m: B_r, query rows per CTA. A multiple of ``16 * num_warps`` (each warp owns
            whole 16-row MMA tiles).
        block_n: B_c, key/value rows per main-loop iteration. A multiple of 16.
        num_warps: the compute warps, which split ``block_m`` between them (MMAs and
            softmax). The ``mma.sync`` kernel has no others; the ``wgmma`` kernel adds a
            producer warpgroup of 4 warps on top (``num_threads`` counts it).
        async_copy: global->shared copies with ``cp.async`` (LDGSTS, L1 bypass) instead of
            LDG + STS through registers (kernel 1).
        swizzle: shared-memory layout of the Q/K/V/O tiles: ``"none"`` (row-major, 8-way
            ldmatrix conflicts), ``"xor"`` (16-byte chunk index XOR row, kernel 2), or
            ``"pad8"`` (+8 halves of padding per row, the GA104 lab's Observation W).
        eager_kv_loads: issue the V_j load before S = QK_j^T and the K_{j+1} load before the
            softmax, so copies overlap math (kernel 3). Needs ``async_copy``.
        q_frags_per_load, k_frags_per_load, v_frags_per_load: shared->register sub-tiling
            along the reduction dimension, counted in 8-column ldmatrix fragments (kernel 4).
            0 loads the whole tile before its MMAs (and, for Q, keeps it in registers for the
            whole main loop); 2 loads one MMA_K step (two fragments) at a time, interleaved
            with the MMAs. Any positive even number is a coarser sub-tile.
        double_buffer_smem_to_rf: issue the ldmatrix of sub-tile s+1 before the MMAs of
            sub-tile s (kernel 5). Needs at least one sub-tiled operand.
        fused_softmax: fold the softmax scale and log2(e) into one FFMA feeding exp2
            (kernel 6); otherwise S is scaled by its own FMUL and exp goes through
            FADD + FMUL + exp2.
        reverse_kv: walk the K/V blocks from the last to the first (kernel 13), so the masked
            tail / causal diagonal block comes first.
        unpredicated_full_tiles: copy a tile that lies wholly inside its sequence with plain
            cp.async, after one uniform branch, instead of a predicated copy / zero-fill pair
            per row (a kernel-12 clean-up found in the SASS: both halves issue either way).
        kv_stages: shared-memory buffers per K and per V tile (the GA104 lab's ``pipeline``).
            1: K_{j+1} and V_j are loaded eagerly into single buffers (two barriers per block).
            2: a ring: K_{j+1} and V_{j+1} go into the other stage as block j starts, so each
            load has a whole block of math to land and one barrier per block suffices.
        static_strides: compile the row and head strides of Q/K/V/O into the kernel
            (kernel 16): the kernel is specialised per stride set (in practice per head
            count), and the offsets of the rows a thread copies become immediates instead of
            per-block 64-bit address arithmetic.
        peel_first_kv_block: run the CTA's first K/V block on its own (kernel 10): its
            P V MMAs start from C = 0 instead of a zeroed accumulator, and the softmax starts
            from that block's statistics with no rescale of O. Costs one more copy of the
            block's code.
        d_head_tile: O += P V in column chunks of ``d_head_tile`` (kernel 15, tiling along
            d_head): each ldmatrix of V feeds only its chunk's MMAs, so a V sub-tile in
            registers is ``d_head_tile`` columns wide instead of the whole head dim. 0 walks
            the whole head dim at once. A multiple of 16 that divides the head dim.
        ptxas_opt_level: the ``ptxas -O`` level the kernel is assembled with. 3 (the
            default) schedules for latency and, at 255 registers, spills a few values per
            block; 1 keeps fewer values in flight and needs no spills (docs/ladder.md).
        row_sum_chains: independent FADD chains that add up each row's share of a P tile,
            combined pairwise at the end. 1 is one dependent chain; more chains shorten it
            (a warp issues in order, so an FADD waiting on the one before also holds back
            the MMAs behind it) at the cost of a live register per chain. At most the
            row's elements per thread (block_n / 4), where it is a full tree.
        persistent: launch one CTA per resident slot (SMs x CTAs per SM, from the occupancy
            model on the compiled kernel's registers and shared memory) and let each loop over
            output tiles (the GA104 lab's persistent grid), instead of one CTA per tile. The
            walk goes wave by wave, alternately forwards and backwards over the CTAs, so
            that with tiles longest first no CTA takes the longest of every wave. With
            ``wgmma`` the K/V ring and Q's barriers run on from tile to tile: the producer
            loads the next tile's first K/V blocks, and its Q once the consumers are done with
            this one's (``stages_o_apart``: O staged in a tile of its own, so Q is free when
            the last S = Q K^T has run), while the consumers finish and store this tile.
        tma_kv_loads: load each K and V tile with one TMA bulk-tensor copy
            (``cp.async.bulk.tensor``, sm_90+) issued by one thread and completed on an
            mbarrier, instead of 16-byte ``cp.async`` copies by every thread. The copy's
            addresses are then the descriptor and the block's coordinates, the same for the
            whole CTA: no per-thread copy address competes with the accumulators for
            registers (the values the 32-rows-per-warp tile spilled at -O3), and the
            threads issue no copy instructions. Rows past the end of K/V are zero-filled by
            the TMA unit. The ``mma.sync`` kernel does not take it for packed (varlen)
            sequences, whose tiles would run into the next sequence; the ``wgmma`` kernel
            does (its boxes start at each sequence, its keys past the end are masked).
        wgmma: run the Hopper kernel (``kernels/sm90/forward.py``, sm_90a) instead of the
            ``mma.sync`` one: warpgroup MMAs (``wgmma``) read Q and K straight from shared
            memory and P from registers, one producer warp loads Q/K/V with TMA into a
            ``kv_stages`` ring guarded by full/empty mbarriers, and each 64-row slice of
            ``block_m`` is a consumer warpgroup (``num_warps`` counts the consumer warps,
            4, 8 or 12; a producer warpgroup is added). Every head dim, dense or packed.
            The ``ldmatrix`` schedule knobs (``*_frags_per_load``,
            ``double_buffer_smem_to_rf``, ``row_sum_chains``) do not apply to it.
        interleave_softmax: turn S into P one MMA_K slice of keys at a time, right before
            the O += P V MMAs of that slice, instead of the whole tile before the first of
            them: the row maxima and the O rescale come first, then each slice's exp2 and
            conversion, so the exp2 of slice s+1 can overlap the MMAs of slice s in program
            order. Then ptxas -O1, which keeps the source order and spills nothing, keeps
            the overlap that only -O3's scheduler found before (docs/ladder.md, "Tenth
            session").
        intra_wg_overlap: (wgmma) inside each consumer warpgroup, issue block j's S = Q K^T
            and block j-1's O += P V together and run block j's softmax while they are on the
            tensor cores (FlashAttention-3's intra-warpgroup pipelining): the softmax of one
            block hides behind the MMAs of two, at the price of holding P of the previous
            block in registers beside S. O is rescaled once the P V MMAs are done.
        pingpong: (wgmma, two or three consumer warpgroups) the warpgroups take turns at the
            tensor cores, round robin on one named barrier each: one issues its MMAs while the
            others run their softmax, so the tensor cores idle less while any exponentiates.
        fence_p: (wgmma) pin P's registers (an empty inline-asm read-write of each, FA3's
            ``warpgroup_fence_operand``) once it is converted, before the O += P V MMAs. At a
            B_c that is not a power of two ptxas otherwise sinks P's conversion in between
            the MMAs and issues them one k-step group at a time (docs/ladder.md, twelfth
            session).
        rescale_o_before_pv: (wgmma with intra_wg_overlap) rescale O for the previous
            block's row maxima while this block's S = Q K^T is on the tensor cores, before the
            previous block's O += P V is issued (FA3/FA4 do so at head dims above 128),
            instead of once that P V has completed, where the multiplies (D / 2 per thread and
            block) stand between the MMAs' completion and the next block.
        late_o_addresses: (wgmma) build the epilogue's shared-memory addresses for staging O
            after the K/V loop, from an opaque copy of the thread index, instead of letting
            ptxas hoist them above it: at hd64 they held 16 of the three-warpgroup tile's 160
            registers across the loop, and without them ptxas waits for the previous block's
            P V after some of the softmax's exponentials instead of before the first
            (docs/ladder.md, thirty-seventh session).
        lazy_rescale: (wgmma with intra_wg_overlap) a row keeps its maximum while a new
            block raises it by at most 2^8 in the exponent (P then reaches up to 256, carried
            exactly by the row sum), and a warp skips O's rescale when none of its rows moved
            (FA4's on Blackwell; ``kernels/common/softmax.py``): D / 2 multiplies per thread
            and block that rarely change anything once the maxima settle. The default for
            dense masked problems from 2k to below 8k queries at hd64/128/256 (+1-3 % there;
            docs/ladder.md, thirty-eighth session).
        correction_first: (wgmma with intra_wg_overlap) each row's sum starts from the old sum
            times the row's correction (FA4's order) instead of adding the block's sum to it
            at the end. The correction's exp2 is then needed first, so ptxas issues it ahead
            of P's exponentials (the ``MUFU`` queue is in order) and O's rescale after the P
            V wait runs under them; otherwise it waits for the last exponential and the
            D / 2 multiplies end the loop body (docs/ladder.md, forty-seventh session).
        try_wait_first: (wgmma) the consumer warpgroups wait for a ring stage's data by one
            non-blocking try first (``consumer_try_wait``, as FA4 does), entering the waiting
            loop only where it fails, instead of the waiting loop straight away. Where ptxas
            lays the plain loop's retry (a sleep and a second try) out inline in the K/V
            loop, as in the fp16 builds on the static persistent walk with Q in two buffers,
            the try first moves it out of the loop body, where every bf16 build has it; where
            the retry is already out, the try measured slower (docs/ladder.md, fifty-fourth
            and fifty-fifth sessions).
        lpt: under a mask (causal or a window), hand out the output tiles longest first over
            the whole launch, in L2 sections of heads whose K and V fit in L2 together (FA3's
            longest-processing-time order), instead of longest first within each head
            (``kernels/common/tile_scheduler.py``). No effect without a mask.
        l2_section_mb: with ``lpt``, the K and V bytes (MiB) one L2 section of heads may
            keep resident: fewer heads per section read K/V from L2 more often, more heads
            leave fewer tiles of the tail unbalanced.
        dynamic_tiles: (wgmma, persistent) after its first tile, a CTA takes the next one in
            launch order from a counter in global memory (an atomic add; FA3's scheduler for
            causal and packed batches), so the next tile goes to whichever CTA is free first,
            as the hardware's grid hands them out, instead of the fixed snake that some
            masks leave unbalanced (``tile_order.snake_imbalance``). The producer warp
            takes the tile and passes it to the consumers beside Q; the last CTA to finish
            sets the counter back to zero (``attnlab.counters``).
        cluster_m: (wgmma, persistent, no mask, dense) CTAs per thread-block cluster, 1 or
            2. With 2, the two CTAs of a cluster compute neighbouring row blocks of the same
            head and share its K/V walk: each loads half of every K and V block and the TMA
            unit multicasts it into both CTAs' shared memory (FA3's cluster of two on
            Hopper), so the L2 reads K and V once per two row blocks; a stage is free again
            once both CTAs' consumers have released it. The default of unmasked dense hd128,
            hd192 and hd256 whose row blocks pair up (``policy.paired_row_blocks``).
        q_stages: (wgmma, persistent) shared-memory buffers of Q, 1 or 2. With one, the
            producer loads the next tile's Q once the consumers are done with this one's, so
            the consumers, back from this tile's epilogue, wait for that load; with two it
            loads while they still walk this tile's K/V blocks. Needs O staged in a tile of
            its own (``stages_o_apart``), where Q's second buffer leaves room for it.
        split_tail: (wgmma; a persistent static walk, no mask, dense) the last full wave of
            tiles and the partial one after it are dealt out as equal runs of K/V blocks
            (stream-K over the tail, ``kernels/common/tile_scheduler.py``) instead of whole
            tiles, so no CTA idles through a partial last wave; a tile split between two CTAs
            is merged through global scratch (the later blocks' unnormalised O and row
            statistics) by the CTA that walks its earlier blocks. No effect on another grid,
            under a mask or on packed sequences (whose tiles differ in length).
    """

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    async_copy: bool = True
    swizzle: Swizzle = "xor"
    eager_kv_loads: bool = True
    q_frags_per_load: int = 0
    k_frags_per_load: int = 2
    v_frags_per_load: int = 2
    double_buffer_smem_to_rf: bool = True
    fused_softmax: bool = True
    reverse_kv: bool = False
    unpredicated_full_tiles: bool = False
    kv_stages: int = 1
    static_strides: bool = False
    peel_first_kv_block: bool = False
    d_head_tile: int = 0
    ptxas_opt_level: int = 3
    persistent: bool = False
    row_sum_chains: int = 1
    tma_kv_loads: bool = False
    wgmma: bool = False
    interleave_softmax: bool = False
    intra_wg_overlap: bool = False
    pingpong: bool = False
    fence_p: bool = False
    rescale_o_before_pv: bool = False
    late_o_addresses: bool = False
    lazy_rescale: bool = False
    correction_first: bool = False
    try_wait_first: bool = False
    lpt: bool = False
    l2_section_mb: int = L2_SECTION_MB
    dynamic_tiles: bool = False
    cluster_m: int = 1
    q_stages: int = 1
    split_tail: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if self.num_warps not in ((4, 8, 12) if self.wgmma else (1, 2, 4, 8)):
            raise ConfigError(f"num_warps must be one of 1, 2, 4, 8 (4, 8, 12 with wgmma), got "
                              f"{self.num_warps}")
        if self.block_m % (MMA_M * self.num_warps):
            raise ConfigError(
                f"block_m={self.block_m} must be a multiple of 16 * num_warps = "
                f"{MMA_M * self.num_warps}: each warp owns whole 16-row MMA tiles"
            )
        if self.block_n % MMA_K or self.block_n > 256:
            raise ConfigError(f"block_n must be a multiple of 16 up to 256, got {self.block_n}")
        if self.block_m > 256:
            raise ConfigError(f"block_m must be at most 256, got {self.block_m}")
        if self.swizzle not in SWIZZLE_MODES:
            raise ConfigError(f"swizzle must be one of {SWIZZLE_MODES}, got {self.swizzle!r}")
        for name in ("q_frags_per_load", "k_frags_per_load", "v_frags_per_load"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or value % 2:
                raise ConfigError(
                    f"{name} must be 0 (whole tile) or a positive even number of 8-column "
                    f"fragments (an MMA_K step is two), got {value!r}"
                )
        if self.v_frags_per_load and (self.block_n // FRAG_COLS) % self.v_frags_per_load:
            raise ConfigError(
                f"v_frags_per_load={self.v_frags_per_load} must divide block_n / 8 = "
                f"{self.block_n // FRAG_COLS}"
            )
        if self.eager_kv_loads and not self.async_copy:
            raise ConfigError(
                "eager_kv_loads needs async_copy: a synchronous copy cannot overlap the math"
            )
        if self.kv_stages not in ((1, 2, 3, 4) if self.wgmma else (1, 2)):
            raise ConfigError(f"kv_stages must be 1 or 2 (up to 4 with wgmma), got "
                              f"{self.kv_stages!r}")
        if self.kv_stages > 1 and not self.eager_kv_loads:
            raise ConfigError(
                "kv_stages=2 needs eager_kv_loads: the ring issues the next block's loads "
                "while the current block computes"
            )
        if (not isinstance(self.d_head_tile, int) or isinstance(self.d_head_tile, bool)
                or self.d_head_tile < 0 or self.d_head_tile % 16):
            raise ConfigError(
                f"d_head_tile must be 0 (the whole head dim) or a positive multiple of 16 "
                f"(one ldmatrix.x4 of V covers 16 columns), got {self.d_head_tile!r}"
            )
        if self.ptxas_opt_level not in (0, 1, 2, 3) or isinstance(self.ptxas_opt_level, bool):
            raise ConfigError(
                f"ptxas_opt_level must be 0, 1, 2 or 3, got {self.ptxas_opt_level!r}"
            )
        per_row = self.block_n // 4  # elements of a row in one thread's S fragment
        if (not isinstance(self.row_sum_chains, int) or isinstance(self.row_sum_chains, bool)
                or not 1 <= self.row_sum_chains <= per_row):
            raise ConfigError(
                f"row_sum_chains must be an int from 1 to block_n / 4 = {per_row} (a thread's "
                f"elements of one row), got {self.row_sum_chains!r}"
            )
        if (not isinstance(self.l2_section_mb, int) or isinstance(self.l2_section_mb, bool)
                or not 1 <= self.l2_section_mb <= MAX_L2_SECTION_MB):
            raise ConfigError(f"l2_section_mb must be an int from 1 to {MAX_L2_SECTION_MB} (MiB "
                              f"of K/V per L2 section), got {self.l2_section_mb!r}")
        if not self.lpt and self.l2_section_mb != L2_SECTION_MB:
            raise ConfigError("l2_section_mb sizes the sections of the longest-first order: it "
                              "needs lpt")
        if self.tma_kv_loads and not (self.eager_kv_loads and self.swizzle == "xor"):
            raise ConfigError(
                "tma_kv_loads needs eager_kv_loads (a TMA copy is asynchronous) and the xor "
                "swizzle (the TMA unit writes the swizzled tile itself)"
            )
        if self.wgmma:
            self._check_wgmma()
        elif (self.intra_wg_overlap or self.pingpong or self.fence_p
              or self.rescale_o_before_pv or self.dynamic_tiles or self.late_o_addresses
              or self.lazy_rescale or self.correction_first or self.try_wait_first
              or self.cluster_m != 1 or self.q_stages != 1 or self.split_tail):
            raise ConfigError("intra_wg_overlap, pingpong, fence_p, rescale_o_before_pv, "
                              "dynamic_tiles, late_o_addresses, lazy_rescale, "
                              "correction_first, try_wait_first, split_tail, cluster_m and "
                              "q_stages schedule the warpgroup-MMA kernel: they need wgmma")
        if self.double_buffer_smem_to_rf and not (
            self.q_frags_per_load or self.k_frags_per_load or self.v_frags_per_load
        ):
            raise ConfigError(
                "double_buffer_smem_to_rf needs at least one sub-tiled operand "
                "(a *_frags_per_load > 0): whole-tile loads leave nothing to prefetch"
            )

    def _check_wgmma(self) -> None:
        if self.block_m != WGMMA_M * (self.num_warps // 4) or self.num_warps not in (4, 8, 12):
            raise ConfigError(
                f"wgmma needs num_warps 4, 8 or 12 (one to three consumer warpgroups) and "
                f"block_m = 64 per warpgroup, got block_m={self.block_m}, "
                f"num_warps={self.num_warps}")
        if not self.tma_kv_loads:
            raise ConfigError("wgmma loads Q/K/V with TMA: set tma_kv_loads")
        if self.dynamic_tiles and not self.persistent:
            raise ConfigError("dynamic_tiles hands persistent CTAs their tiles: it needs "
                              "persistent")
        if self.cluster_m not in (1, 2):
            raise ConfigError(f"cluster_m must be 1 or 2, got {self.cluster_m!r}")
        if self.q_stages not in (1, 2):
            raise ConfigError(f"q_stages must be 1 or 2, got {self.q_stages!r}")
        if self.q_stages > 1 and not self.persistent:
            raise ConfigError("q_stages=2 loads the next tile's Q during this one: it needs "
                              "persistent")
        if self.cluster_m > 1 and not self.static_persistent_walk:
            raise ConfigError("cluster_m pairs the tiles of a persistent static walk: it needs "
                              "persistent without dynamic_tiles")
        if self.rescale_o_before_pv and not self.intra_wg_overlap:
            raise ConfigError("rescale_o_before_pv moves O's rescale under the next block's "
                              "Q K^T: it needs intra_wg_overlap")
        if self.lazy_rescale and not self.intra_wg_overlap:
            raise ConfigError("lazy_rescale skips the O rescale that intra_wg_overlap splits "
                              "off the softmax: it needs intra_wg_overlap")
        if self.correction_first and not self.intra_wg_overlap:
            raise ConfigError("correction_first orders the row sums of the softmax that "
                              "intra_wg_overlap splits from O's rescale: it needs "
                              "intra_wg_overlap")
        if self.pingpong and self.num_warps == 4:
            raise ConfigError("pingpong takes turns between consumer warpgroups: it needs two "
                              "or three (num_warps 8 or 12), got one")
        unsupported = [name for name in ("reverse_kv", "peel_first_kv_block", "d_head_tile",
                                         "static_strides", "interleave_softmax")
                       if getattr(self, name)]
        if unsupported:
            raise ConfigError(f"wgmma does not implement {', '.join(unsupported)} (kernel 10/13/"
                              "15/16 and the sliced softmax are knobs of the mma.sync kernel)")

    # ----------------------------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        """Threads per CTA (with ``wgmma``, the producer warpgroup's 128 included)."""
        return 32 * self.num_warps + (128 if self.wgmma else 0)

    @property
    def static_persistent_walk(self) -> bool:
        """A ``wgmma`` kernel whose persistent CTAs walk a fixed order of tiles (no
        ``dynamic_tiles`` counter): what clusters of CTAs (``cluster_m``) pair the tiles of."""
        return self.wgmma and self.persistent and not self.dynamic_tiles

    def replace(self, **changes: object) -> FlashConfig:
        """A copy with some knobs changed (validated like any new config)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> FlashConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown config keys: {sorted(unknown)}")
        return cls(**data)  # type: ignore[arg-type]

    def short_name(self) -> str:
        """The seeds' notation, e.g. ``(64, 64, 4): async+eager+swizzled+load_0_2_0_fragments``."""
        if self.wgmma:
            # The mma.sync kernel's copy and ldmatrix knobs do not apply.
            flags = ["wgmma", "tma", f"kv_stages_{self.kv_stages}"]
            if self.fused_softmax:
                flags.append("opt_softmax")
            flags += [name for name in ("intra_wg_overlap", "pingpong", "fence_p",
                                        "rescale_o_before_pv", "late_o_addresses",
                                        "lazy_rescale", "correction_first",
                                        "try_wait_first", "persistent", "dynamic_tiles")
                      if getattr(self, name)]
            flags += self._lpt_flags()
            if self.cluster_m > 1:
                flags.append(f"cluster_{self.cluster_m}")
            if self.q_stages > 1:
                flags.append(f"q_stages_{self.q_stages}")
            if self.split_tail:
                flags.append("split_tail")
            return f"({self.block_m}, {self.block_n}, {self.num_warps}): " + "+".join(flags)
        flags = []
        if self.async_copy:
            flags.append("async")
        if self.eager_kv_loads:
            flags.append("eager")
        if self.swizzle == "xor":
            flags.append("swizzled")
        elif self.swizzle == "pad8":
            flags.append("pad8")
        flags.append(
            f"load_{self.q_frags_per_load}_{self.k_frags_per_load}_{self.v_frags_per_load}"
            "_fragments"
        )
        if self.double_buffer_smem_to_rf:
            flags.append("buffer")
        if self.fused_softmax:
            flags.append("opt_softmax")
        if self.reverse_kv:
            flags.append("reverse_kv")
        if self.unpredicated_full_tiles:
            flags.append("unpredicated_full_tiles")
        if self.kv_stages > 1:
            flags.append(f"kv_stages_{self.kv_stages}")
        if self.peel_first_kv_block:
            flags.append("peel_first")
        if self.static_strides:
            flags.append("static_strides")
        if self.d_head_tile:
            flags.append(f"d_head_tile_{self.d_head_tile}")
        if self.ptxas_opt_level != 3:
            flags.append(f"ptxas_O{self.ptxas_opt_level}")
        if self.persistent:
            flags.append("persistent")
        if self.row_sum_chains > 1:
            flags.append(f"row_sum_chains_{self.row_sum_chains}")
        if self.tma_kv_loads:
            flags.append("tma_kv")
        if self.interleave_softmax:
            flags.append("interleave_softmax")
        flags += self._lpt_flags()
        return f"({self.block_m}, {self.block_n}, {self.num_warps}): " + "+".join(flags)

    def _lpt_flags(self) -> list[str]:
        if not self.lpt:
            return []
        return ["lpt" if self.l2_section_mb == L2_SECTION_MB
                else f"lpt_l2_{self.l2_section_mb}mb"]

    # ----------------------------------------------------------------------------------------
    def check_problem(self, head_dim: int, arch: str | None = "sm_80") -> None:
        """Reject a config that cannot serve ``head_dim`` on ``arch`` (raises ConfigError);
        ``arch=None`` checks only what does not depend on the target (the kernel object,
        built before a target is chosen)."""
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ConfigError(
                f"head_dim={head_dim} is not supported; supported: {SUPPORTED_HEAD_DIMS}"
            )
        for name in ("q_frags_per_load", "k_frags_per_load"):
            value = getattr(self, name)
            if value and (head_dim // FRAG_COLS) % value:
                raise ConfigError(
                    f"{name}={value} must divide head_dim / 8 = {head_dim // FRAG_COLS}"
                )
        if self.d_head_tile and head_dim % self.d_head_tile:
            raise ConfigError(
                f"d_head_tile={self.d_head_tile} must divide head_dim={head_dim}"
            )
        if self.q_stages > 1 and not self.stages_o_apart(head_dim):
            raise ConfigError(
                f"q_stages={self.q_stages} needs O staged in a tile of its own, for which "
                f"{self.short_name()} leaves no shared memory at head_dim={head_dim}")
        if arch is None:
            return
        if self.wgmma and arch != "sm_90a":
            raise ConfigError(f"wgmma needs sm_90a (warpgroup MMAs), not {arch}")
        if self.tma_kv_loads and not arch.startswith("sm_9"):
            raise ConfigError(f"tma_kv_loads needs the TMA unit of sm_90 or newer, not {arch}")
        capacity = SMEM_CAPACITY.get(arch)
        if capacity is None:
            raise ConfigError(f"unknown arch {arch!r}; known: {sorted(SMEM_CAPACITY)}")
        needed = self.smem_bytes(head_dim)
        if needed > capacity:
            raise ConfigError(
                f"{self.short_name()} needs {needed} bytes of shared memory at head_dim="
                f"{head_dim}; {arch} allows {capacity}"
            )

    def smem_row_elems(self, head_dim: int) -> int:
        """Elements per shared-memory row of a Q/K/V tile (padding included)."""
        return head_dim + (8 if self.swizzle == "pad8" else 0)

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """Shared memory of one CTA: ``q_stages`` Q tiles and ``kv_stages`` K and V tiles,
        and O's own tile where ``stages_o_apart``."""
        rows = self.q_stages * self.block_m + 2 * self.block_n * self.kv_stages
        if self.stages_o_apart(head_dim, elem_bytes):
            rows += self.block_m
        return rows * self.smem_row_elems(head_dim) * elem_bytes

    def stages_o_apart(self, head_dim: int, elem_bytes: int = 2) -> bool:
        """Whether a persistent ``wgmma`` CTA stages O in a tile of its own, where shared
        memory has room for it (beside the barriers), instead of in Q's: then the next
        tile's Q loads while this tile's O is stored."""
        if not (self.wgmma and self.persistent):
            return False
        rows = (1 + self.q_stages) * self.block_m + 2 * self.block_n * self.kv_stages
        return rows * head_dim * elem_bytes <= SMEM_CAPACITY["sm_90a"] - 1024
