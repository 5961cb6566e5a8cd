"""The backward-kernel configuration: the tiles and warps of the FlashAttention-2 backward.

The backward kernel (``kernels/sm80/backward.py``) works in the transposed frame: a CTA owns
``block_n`` key rows (B_c) of one sequence and K/V head and walks the query blocks of
``block_m`` rows (B_r) that see them. Its warps split B_c for S^T, dP^T, dV and dK (each warp
keeps 16 key rows of dK and dV in registers for the whole walk) and split the B_r x D tile of
dQ as ``dq_warps_m`` x the rest. A config describes how; the problem (dtype, head dim) comes
with the spec, as for the forward's ``FlashConfig``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from attnlab.config import MMA_M, SMEM_CAPACITY, ConfigError

#: Head dims the backward serves.
BACKWARD_HEAD_DIMS: tuple[int, ...] = (32, 64, 96, 128, 192, 256)
#: The largest head dim whose dK and dV a warpgroup (wgmma) or a warp (mma.sync) holds for
#: its own key rows: D fp32 values per thread each. Above it warps share key rows and split
#: the head dim (``split_head_dim``).
WHOLE_ROWS_MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class BackwardConfig:
    """Knobs of the ``mma.sync`` backward kernel.

    Attributes:
        block_m: B_r, query rows per step of the walk (a multiple of 16).
        block_n: B_c, key rows per CTA: a multiple of 16 per warp along it (``kv_warps``):
            ``16 * num_warps`` (each warp owns 16 key rows), ``8 * num_warps`` (two warps
            share 16 key rows: ``split_head_dim``), or with ``kv_warps_n`` more rows per
            warp.
        num_warps: 4 or 8.
        q_stages: shared-memory buffers of Q_i and dO_i: 2 loads the next query block while
            this one computes; 1 loads it after (less shared memory, exposed latency).
        dq_warps_m: warps along B_r in dQ += dS K (the rest split the head dim); 0 picks
            ``min(num_warps, block_m / 16)``.
        kv_warps_n: mma.sync, warps that share key rows, splitting B_r in S^T and dP^T and
            the head dim in dV and dK (FA2's two-dimensional warp layout): each reads a
            share of Q_i and dO_i instead of the whole tiles, and P^T joins dS^T in shared
            memory (``split_head_dim``); 0 picks 2 when ``block_n = 8 * num_warps``, else 1.
        wgmma: the Hopper kernel (sm_90a): two warpgroups of 64 key rows each (B_c = 128,
            8 warps) issue warpgroup MMAs that read Q, dO, K, V and dS from shared memory
            through descriptors; B_r = 64 (dQ's two warpgroups split the head dim) or 128
            (they split the query rows). With B_c = 64 (and B_r = 64) the two warpgroups
            share the key rows and split the head dim instead (``split_head_dim``).
        producer_warp: with ``wgmma``, warp specialisation: a producer warp loads Q_i,
            dO_i, L_i and D_i by TMA into a ring guarded by full/empty barriers, so the
            consumer warpgroups meet once per query block (dS^T written; its tile is double
            buffered) instead of three times (loads landed, dS^T written, ring reused).
        lpt: under a mask (causal or a window), hand out the K/V blocks longest first over
            L2 sections of (sequence, K/V head) pairs (the forward's ``lpt``, read the other
            way round: a causal band gives the first K/V blocks the most query blocks), so
            the short ones fill the grid's tail.
        dq_first: mma.sync, FA2's order of the last three GEMMs: dV, then dQ = dS K and its
            reduce-adds, then dK, so the adds go out between dK's MMAs instead of after the
            last GEMM (forward + backward on an H100: +2 to +9 % at hd64, 0 to +3 % at bf16
            hd128 without a mask; ``docs/backward.md`` step 20).
        ptxas_opt_level: the ``ptxas -O`` level (the forward's knob): -O1 spilled fewer
            values in the wgmma kernel at hd128 (6 against 18) until the store addresses
            were recomputed per block (step 14); since then -O3 spills none there and
            measures 0-2 % faster. The mma.sync tiles at hd128 with B_r = 64 take -O1
            (``FULL_TILE_OPT_LEVEL``, step 18).
    """

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 8
    q_stages: int = 2
    dq_warps_m: int = 0
    kv_warps_n: int = 0
    wgmma: bool = False
    producer_warp: bool = False
    lpt: bool = False
    dq_first: bool = False
    ptxas_opt_level: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "num_warps", "q_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if self.num_warps not in (4, 8):
            raise ConfigError(f"num_warps must be 4 or 8, got {self.num_warps}")
        if self.kv_warps_n not in (0, 1, 2) or isinstance(self.kv_warps_n, bool):
            raise ConfigError(f"kv_warps_n must be 0 (derived), 1 or 2, got {self.kv_warps_n!r}")
        if self.kv_warps_n and self.wgmma:
            raise ConfigError("kv_warps_n is the mma.sync kernel's warp layout (wgmma's "
                              "warpgroups split the head dim at block_n=64)")
        along_c, along_n = self.kv_warps
        if not self.wgmma and (self.block_n % (MMA_M * along_c)
                               or self.block_n < 8 * self.num_warps):
            raise ConfigError(f"block_n must be a multiple of 16 per warp along it ({along_c} "
                              f"warps: 16 * num_warps = {MMA_M * self.num_warps} when each warp "
                              f"owns 16 key rows, 8 * num_warps when two share them), got "
                              f"{self.block_n}")
        if self.block_m % MMA_M or not 16 <= self.block_m <= 128:
            raise ConfigError(f"block_m must be a multiple of 16 from 16 to 128, got "
                              f"{self.block_m}")
        if not self.wgmma and self.block_m % (MMA_M * along_n):
            raise ConfigError(f"block_m={self.block_m} must split into {along_n} warps' "
                              "16-column slices of S^T")
        if self.ptxas_opt_level not in (0, 1, 2, 3) or isinstance(self.ptxas_opt_level, bool):
            raise ConfigError(f"ptxas_opt_level must be 0, 1, 2 or 3, got "
                              f"{self.ptxas_opt_level!r}")
        if self.q_stages not in (1, 2):
            raise ConfigError(f"q_stages must be 1 or 2, got {self.q_stages}")
        if self.wgmma and ((self.num_warps, self.dq_warps_m) != (8, 0) or (
                self.block_n, self.block_m) not in ((128, 64), (128, 128), (64, 64))):
            raise ConfigError("wgmma needs num_warps 8 (two warpgroups), no dq_warps_m and "
                              "(block_n, block_m) of (128, 64) or (128, 128) (a warpgroup "
                              "per 64 key rows) or (64, 64) (the warpgroups split the head "
                              "dim)")
        if self.dq_first and self.wgmma:
            raise ConfigError("dq_first orders the mma.sync kernel's GEMMs (the wgmma kernel "
                              "issues dQ between dV and dK already)")
        if self.producer_warp and not self.wgmma:
            raise ConfigError("producer_warp needs wgmma (the TMA ring feeds warpgroup MMAs)")
        wm = self.dq_warps[0]
        if self.num_warps % wm or self.block_m % (MMA_M * wm):
            raise ConfigError(f"dq_warps_m={wm} must divide num_warps={self.num_warps} and "
                              f"block_m / 16 = {self.block_m // MMA_M}")

    @property
    def dq_warps(self) -> tuple[int, int]:
        """Warps of dQ += dS K along (B_r, D) (with wgmma: a warpgroup's four warps per 64
        query rows, the warpgroups along D when B_r is 64)."""
        if self.wgmma:
            return (4 * self.block_m // 64, self.num_warps * 64 // (4 * self.block_m))
        wm = self.dq_warps_m or min(self.num_warps, self.block_m // MMA_M)
        return wm, self.num_warps // wm

    @property
    def kv_warps(self) -> tuple[int, int]:
        """mma.sync: warps of S^T, dP^T, dV and dK along (B_c, B_r or D)."""
        along_n = self.kv_warps_n or (2 if self.block_n == 8 * self.num_warps else 1)
        return self.num_warps // along_n, along_n

    @property
    def split_head_dim(self) -> bool:
        """Two warpgroups (wgmma, B_c = 64) or two warps (mma.sync, ``kv_warps_n = 2``) work
        on the same key rows and split the head dim of dK and dV between them (FA3's tile
        above hd128, FA2's layout below), so each holds D / 2 columns of dK and dV; P^T then
        joins dS^T in shared memory, as dV's A operand."""
        if self.wgmma:
            return self.block_n == 64
        return self.kv_warps[1] > 1

    @property
    def num_threads(self) -> int:
        """Threads of the MMA warps (the consumers when ``producer_warp``)."""
        return 32 * self.num_warps

    @property
    def launch_threads(self) -> int:
        """Threads per CTA: the MMA warps and, with ``producer_warp``, the producer
        warpgroup."""
        return self.num_threads + (128 if self.producer_warp else 0)

    @property
    def ds_stages(self) -> int:
        """dS^T buffers: two when no CTA barrier separates one block's dQ from the next
        block's dS^T store (``producer_warp``)."""
        return 2 if self.producer_warp else 1

    def replace(self, **changes: object) -> BackwardConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> BackwardConfig:
        return cls(**data)  # type: ignore[arg-type]

    def short_name(self) -> str:
        """E.g. ``bwd(64, 128, 8): q_stages_2``."""
        flags = ["wgmma"] if self.wgmma else []
        if self.producer_warp:
            flags.append("producer_warp")
        if self.lpt:
            flags.append("lpt")
        if self.dq_first:
            flags.append("dq_first")
        if self.split_head_dim:
            flags.append("split_d")
        flags.append(f"q_stages_{self.q_stages}")
        if self.dq_warps_m:
            flags.append(f"dq_warps_m_{self.dq_warps_m}")
        if self.kv_warps_n:
            flags.append(f"kv_warps_n_{self.kv_warps_n}")
        if self.ptxas_opt_level != 3:
            flags.append(f"ptxas_O{self.ptxas_opt_level}")
        return f"bwd({self.block_m}, {self.block_n}, {self.num_warps}): " + "+".join(flags)

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """K and V, ``q_stages`` Q and dO tiles, the dS^T (and with ``split_head_dim`` P^T)
        tiles, L and D, and with wgmma dQ's fp32 staging tile (and the ring's barriers)."""
        rows = 2 * self.block_n + 2 * self.q_stages * self.block_m
        # L and D per stage; a producer's stages are whole 128-byte lines with room for a
        # packed sequence's 16-byte-aligned start.
        stats_rows = -(-(self.block_m + 4) // 32) * 32 if self.producer_warp else self.block_m
        stats = 2 * 4 * stats_rows * self.q_stages
        # One 1024-byte-aligned fp32 box per warp (the TMA reduce's source).
        staging = self.block_m * head_dim * 4 + 1024 if self.wgmma else 0
        barriers = 16 * self.q_stages if self.producer_warp else 0
        transposed_tiles = (2 if self.split_head_dim else 1) * self.ds_stages
        return ((rows * head_dim + transposed_tiles * self.block_n * self.block_m) * elem_bytes
                + stats + staging + barriers)

    def check_problem(self, head_dim: int, arch: str | None = "sm_80") -> None:
        """Reject a config that cannot serve ``head_dim`` on ``arch`` (ConfigError)."""
        if head_dim not in BACKWARD_HEAD_DIMS:
            raise ConfigError(f"the backward serves head dims {BACKWARD_HEAD_DIMS}, not "
                              f"{head_dim}")
        if head_dim > WHOLE_ROWS_MAX_HEAD_DIM and not self.split_head_dim:
            raise ConfigError(f"{self.short_name()} keeps D fp32 values of dK and dV per "
                              f"thread, too many at head_dim={head_dim}: above "
                              f"{WHOLE_ROWS_MAX_HEAD_DIM} the warps must split the head dim "
                              "(block_n=64 with wgmma, 8 * num_warps with mma.sync)")
        if not self.wgmma and head_dim % (16 * self.kv_warps[1]):
            raise ConfigError(f"head_dim={head_dim} must split into {self.kv_warps[1]} "
                              "16-column slices for dV and dK")
        if head_dim % (16 * self.dq_warps[1]):
            raise ConfigError(f"head_dim={head_dim} must split into {self.dq_warps[1]} "
                              "16-column slices for dQ")
        if arch is None:
            return
        if self.wgmma and arch != "sm_90a":
            raise ConfigError(f"wgmma needs sm_90a (warpgroup MMAs), not {arch}")
        capacity = SMEM_CAPACITY.get(arch)
        if capacity is None:
            raise ConfigError(f"unknown arch {arch!r}; known: {sorted(SMEM_CAPACITY)}")
        if self.smem_bytes(head_dim) > capacity:
            raise ConfigError(f"{self.short_name()} needs {self.smem_bytes(head_dim)} bytes "
                              f"of shared memory at head_dim={head_dim}; {arch} allows "
                              f"{capacity}")


def backward_head_dims(arch: str) -> tuple[int, ...]:
    """The head dims whose backward ``arch`` runs: those whose default tile fits its shared
    memory (all but hd256 on sm_86/89)."""
    return tuple(d for d in BACKWARD_HEAD_DIMS if _default_or_none(d, arch, False) is not None)


def default_backward(head_dim: int, arch: str = "sm_80", varlen: bool = False,
                     deterministic: bool = False, windowed: bool = False) -> BackwardConfig:
    """The backward's default: on sm_90a the wgmma kernel fed by a producer warp, longest
    first under a mask (B_r = 128 at head dims up to 64, +24 % there, ``docs/backward.md``,
    but for packed sequences in the deterministic turn; above hd128 the 64 x 64 tile whose
    warpgroups split the head dim, with as many ring stages as shared memory holds);
    elsewhere the mma.sync one with FA2's sm80 tile, longest first under a mask too (B_c =
    128 over 8 warps, B_r = 64; B_r = 32 for packed sequences or the deterministic turn at
    hd128, whose offsets and turn counters push B_r = 64 to spill), made smaller where
    shared memory is (sm_86/89: one Q/dO stage, then B_c = 64); for dense batches at hd64
    and hd128 (not ``deterministic``) its warps split B_r and D in pairs (``TWO_D_TILES``);
    above hd128 they split the head dim in pairs (B_c = 64, B_r = 32: dQ's and the
    fragments' registers beside dK's and dV's 128). ``windowed``: the kernel applies a mask
    (causal or a window), which takes more registers (``FULL_TILE_OPT_LEVEL``)."""
    if head_dim not in BACKWARD_HEAD_DIMS:
        raise ConfigError(f"the backward serves head dims {BACKWARD_HEAD_DIMS}, not "
                          f"{head_dim}")
    config = _default_or_none(head_dim, arch, varlen, deterministic, windowed)
    if config is None:
        raise ConfigError(f"no backward tile at head_dim={head_dim} fits the shared memory "
                          f"of {arch} ({SMEM_CAPACITY.get(arch)} bytes); it serves "
                          f"{backward_head_dims(arch)} there")
    return config


def mma_sync_backward_for(arch: str, head_dim: int, windowed: bool = False,
                          dtype: str = "bfloat16") -> BackwardConfig:
    """The ``mma.sync`` backward measured best on ``arch`` for dense batches: the sm_80
    default plus, on Hopper (the sm80 path of an H100), FA2's GEMM order (``dq_first``)
    where it measured faster: hd64, and hd128 without a mask in bf16 (in fp16 it spills 3
    values there and measured 1-3 % slower; hd128's masked kernel, at -O1, 1-4 % slower).
    On sm_80 itself the order was not measured and stays (at hd128 it spills there)."""
    config = default_backward(head_dim, "sm_80", windowed=windowed)
    if arch.startswith("sm_9") and (head_dim != 128 or (dtype == "bfloat16"
                                                        and not windowed)):
        config = config.replace(dq_first=True)
    return config


#: The ptxas level of the masked mma.sync kernels at hd128 with B_r = 64 (255 registers in
#: either warp layout): -O3 spilled 1-17 values there (masked bodies, fp16, the deterministic
#: turn), -O1 none (docs/backward.md, step 18). The plain kernels spill none at -O3 and keep
#: it (+0.7 to +2.5 % forward + backward at seq 2k-4k, step 19); so does hd64's
#: two-dimensional tile, masked or not (2-4 % faster).
FULL_TILE_OPT_LEVEL = 1

#: The mma.sync kernel's tiles in FA2's two-dimensional warp layout, where they measured
#: faster (+10-12 % at hd128, +11 % at hd64 with B_r = 128, H200, docs/backward.md step 16);
#: dense batches only: with packed sequences or the deterministic turn they spill.
TWO_D_TILES = {64: BackwardConfig(block_m=128, kv_warps_n=2, dq_warps_m=4),
               128: BackwardConfig(kv_warps_n=2, dq_warps_m=2)}


def _default_or_none(head_dim: int, arch: str, varlen: bool, deterministic: bool = False,
                     windowed: bool = False) -> BackwardConfig | None:
    """``default_backward``'s choice, or None when no candidate fits ``arch``."""
    capacity = SMEM_CAPACITY.get(arch, min(SMEM_CAPACITY.values()))
    if arch == "sm_90a":
        if head_dim > WHOLE_ROWS_MAX_HEAD_DIM:
            split = BackwardConfig(wgmma=True, block_n=64, block_m=64, producer_warp=True,
                                   lpt=True)
            return split if split.smem_bytes(head_dim) <= capacity else split.replace(
                q_stages=1)
        # B_r = 128 at hd64 but for packed sequences in the deterministic turn, whose
        # offsets and turn counters beside it spill (step 18).
        tall = head_dim <= 64 and not (varlen and deterministic)
        return BackwardConfig(wgmma=True, block_m=128 if tall else 64, producer_warp=True,
                              lpt=True)
    if head_dim > WHOLE_ROWS_MAX_HEAD_DIM:
        candidates = tuple(BackwardConfig(block_n=64, block_m=32, q_stages=stages)
                           for stages in (2, 1))
    else:
        block_m = 32 if (varlen or deterministic) and head_dim == 128 else 64
        candidates = tuple(BackwardConfig(block_m=block_m, **knobs) for knobs in (
            {}, {"q_stages": 1}, {"num_warps": 4, "block_n": 64},
            {"num_warps": 4, "block_n": 64, "q_stages": 1}))
        if not (varlen or deterministic) and head_dim in TWO_D_TILES:
            candidates = (TWO_D_TILES[head_dim], *candidates)
    config = next((c for c in candidates if c.smem_bytes(head_dim) <= capacity), None)
    if config is None:
        return None
    if head_dim == 128 and config.block_m == 64 and windowed:
        config = config.replace(ptxas_opt_level=FULL_TILE_OPT_LEVEL)
    # Longest first under a mask, as on sm_90a: +1 to +4 % forward + backward at causal
    # hd64 and hd128 seq 2k, +0.5 % at hd128 8k (step 19).
    return config.replace(lpt=True)
