"""The GEMM configuration: one frozen dataclass of the Hopper HGEMM's knobs.

A config says *how* ``C = A @ B`` is tiled and scheduled; the problem (M, N, K, dtypes,
operand majorness) comes with the call. Invalid combinations are refused when a config is
built, with the reason (``attnlab.ConfigError``).

The knobs are the lab's GEMM steps as they exist on sm_90a (``attnlab.ladder`` names them):
the CTA tile (``block_m`` x ``block_n``, the lab's 128 x 128 and 128 x 256), the K step and
the depth of the TMA ring (the lab's cp.async double buffering becomes a ``stages``-deep ring
filled by a producer warp), the order of the output tiles (``raster_group``: L2 reuse), the
persistent grid (the lab's Observation DD) and split-K (Observations EE and FF:
``split_k``, ``split_mode``); with 2:4 sparse A, how its metadata reaches the MMAs
(``sparse_meta``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from attnlab.config import SMEM_CAPACITY, WGMMA_M, ConfigError

SplitMode = Literal["serial", "workspace", "atomic", "cluster"]
SPLIT_MODES: tuple[str, ...] = ("serial", "workspace", "atomic", "cluster")
SparseMeta = Literal["tma", "global"]
SPARSE_METAS: tuple[str, ...] = ("tma", "global")
#: Tile heights of the sm_90a kernel: 64 rows per consumer warpgroup.
BLOCK_MS: tuple[int, ...] = (64, 128, 192)
#: Bytes of 2:4 sparse A's metadata words per row of A and 128-deep K group: 16 rows' words
#: are 16 thread places x 4 32-deep steps x 4 bytes (``attnlab.gemm.sparse.wgmma_words``).
META_ROW_BYTES = 16
#: Most K slices of one tile in a cluster (the portable cluster size).
MAX_CLUSTER_SPLITS = 8
#: fp32 words of padding per row of the cluster split's partial tile in shared memory: the
#: accumulator's 8-byte stores then fill all 32 banks per half-warp.
PARTIAL_PAD = 8
#: Output dtypes the kernels write (fp32 also for split-K's partial sums).
OUT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
#: Most ring stages worth having: past this the TMA latency is long hidden.
MAX_STAGES = 8
#: Shared memory the ring's barriers and the allocator's alignment take (bytes).
BARRIER_BYTES = 1024
#: Registers per thread a consumer warpgroup keeps beside its accumulator (addresses, loop
#: state, the epilogue's converted values).
CONSUMER_OVERHEAD_REGS = 72


def element_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a torch dtype name)."""
    return {"float32": 4, "int8": 1}.get(dtype, 2)


@dataclass(frozen=True)
class GemmConfig:
    """Knobs of the sm_90a HGEMM (``kernels/gemm/sm90.py``).

    Attributes:
        block_m: rows of C per CTA tile; 64 per consumer warpgroup (64, 128 or 192).
        block_n: columns of C per CTA tile (a multiple of 16, at most 256: one wgmma's N).
        block_k: the K step: the depth of one stage of the A/B ring (32, 64 or 128).
        stages: stages of the A/B ring; 0: as many as fit beside the epilogue's tile
            (at most ``MAX_STAGES``).
        raster_group: output tiles go ``raster_group`` M tiles at a time, N fastest within
            the group, so the group's A rows and one column block of B stay in L2 (1: row
            by row).
        persistent: one CTA per SM walks the tiles (its ring runs on into the next tile while
            the epilogue's TMA store drains); else one CTA per tile.
        split_k: slices of K per output tile (1: none; 0: chosen per shape by
            ``attnlab.gemm.dispatch``).
        split_mode: how slices meet: ``"serial"`` (one kernel: each slice stores its fp32
            partial sums, the last slice of a tile to finish adds them up in split order and
            writes C: deterministic), ``"workspace"`` (the same partials summed in order by a
            second kernel: the lab's two-pass form) or ``"atomic"`` (TMA reduce-adds into an
            fp32 accumulator in L2: order-dependent rounding, the lab's Pattern A) or
            ``"cluster"`` (one kernel, no workspace: the slices of a tile are one thread-block
            cluster, each stages its fp32 partials in its shared memory and sums one band
            of the tile's rows from every slice's through distributed shared memory, in
            split order: deterministic; at most ``MAX_CLUSTER_SPLITS`` slices).
        sparse_meta: how 2:4 sparse A's metadata words reach the sparse ``wgmma`` (no part
            in a dense kernel): ``"tma"`` (the producer copies each K tile's words of the
            tile's rows into a shared-memory ring beside A's and B's, one slot fewer than
            their stages; a consumer thread reads its words with one shared-memory load) or
            ``"global"`` (each consumer thread loads its words from global memory, one K tile
            ahead).
        pdl: launch with programmatic dependent launch: each CTA lets the stream's next
            kernel launch as soon as it starts, and the kernel's CTAs set up (shared memory,
            barriers, registers) while the stream's previous kernel finishes, waiting for it
            (``griddepcontrol.wait``) before their first global access. A small GEMM leaves
            SMs idle, where the next call's CTAs can wait.
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 0
    raster_group: int = 8
    persistent: bool = True
    split_k: int = 1
    split_mode: SplitMode = "workspace"
    sparse_meta: SparseMeta = "tma"
    pdl: bool = True

    def __post_init__(self):
        if self.block_m not in BLOCK_MS:
            raise ConfigError(f"block_m must be 64, 128 or 192 (64 rows per consumer "
                              f"warpgroup), got {self.block_m}")
        if self.block_n % 16 or not 16 <= self.block_n <= 256:
            raise ConfigError(f"block_n must be a multiple of 16 in [16, 256], got "
                              f"{self.block_n}")
        if self.block_k not in (32, 64, 128):
            raise ConfigError(f"block_k must be 32, 64 or 128, got {self.block_k}")
        if self.stages < 0 or self.stages == 1 or self.stages > MAX_STAGES:
            raise ConfigError(f"stages must be 0 (auto) or 2..{MAX_STAGES}, got {self.stages}")
        if self.raster_group < 1:
            raise ConfigError(f"raster_group must be >= 1, got {self.raster_group}")
        if self.split_k < 0:
            raise ConfigError(f"split_k must be >= 0 (0: per shape), got {self.split_k}")
        if self.split_mode not in SPLIT_MODES:
            raise ConfigError(f"split_mode must be one of {SPLIT_MODES}, got "
                              f"{self.split_mode!r}")
        if self.split_mode == "cluster" and self.split_k > 1:
            self.check_cluster_splits(self.split_k)
        if self.sparse_meta not in SPARSE_METAS:
            raise ConfigError(f"sparse_meta must be one of {SPARSE_METAS}, got "
                              f"{self.sparse_meta!r}")
        if self.accumulator_registers + CONSUMER_OVERHEAD_REGS > self.consumer_registers:
            raise ConfigError(
                f"a {self.block_m} x {self.block_n} tile needs {self.accumulator_registers} "
                f"accumulator registers per thread; {self.num_consumers} consumer warpgroups "
                f"have {self.consumer_registers} in all")

    def cluster_splits_ok(self, splits: int) -> bool:
        """Whether ``splits`` slices can meet in a cluster: at most ``MAX_CLUSTER_SPLITS``,
        each summing an equal band of the tile's rows, four columns per consumer thread at a
        time."""
        if not 1 < splits <= MAX_CLUSTER_SPLITS or self.block_m % splits:
            return False
        return (self.block_m // splits) * self.block_n % (4 * 128 * self.num_consumers) == 0

    def can_split(self, splits: int, mode: str) -> bool:
        """Whether ``splits`` slices of this tile can meet in ``mode``: serially or through
        a workspace any count, in a cluster where the tile shares out."""
        return mode != "cluster" or self.cluster_splits_ok(splits)

    def check_cluster_splits(self, splits: int) -> None:
        """Refuse a cluster split the tile cannot share out (ConfigError)."""
        if not self.cluster_splits_ok(splits):
            raise ConfigError(
                f"a {self.block_m} x {self.block_n} tile cannot meet in a cluster of {splits} "
                f"slices: at most {MAX_CLUSTER_SPLITS}, dividing block_m, each slice's band of "
                f"rows a multiple of {4 * 128 * self.num_consumers} values")

    def partial_bytes(self) -> int:
        """Shared memory of the cluster split's fp32 partial tile (padded rows)."""
        return self.block_m * (self.block_n + PARTIAL_PAD) * 4

    @property
    def num_consumers(self) -> int:
        """Consumer (MMA) warpgroups: one per 64 rows of the tile."""
        return self.block_m // WGMMA_M

    @property
    def num_threads(self) -> int:
        """The producer warpgroup and the consumers."""
        return 128 * (1 + self.num_consumers)

    @property
    def accumulator_registers(self) -> int:
        """fp32 accumulator registers per consumer thread (64 rows x block_n / 128)."""
        return WGMMA_M * self.block_n // 128

    @property
    def consumer_registers(self) -> int:
        """Registers per consumer thread after ``setmaxnreg`` (``kernels/sm90/wgmma.py``)."""
        from attnlab.kernels.sm90.registers import CONSUMER_REGS

        return CONSUMER_REGS[self.num_consumers]

    def stage_bytes(self, in_dtype: str = "bfloat16", sparse: bool = False) -> int:
        """Bytes of one A and B stage of ``in_dtype`` operands (A 2:4 sparse: its kept
        halves)."""
        a_rows = self.block_m // 2 if sparse else self.block_m
        return (a_rows + self.block_n) * self.block_k * element_bytes(in_dtype)

    def meta_bytes(self) -> int:
        """Bytes of one slot of 2:4 sparse A's metadata ring (``sparse_meta="tma"``): the
        words of the tile's rows for one 128-deep K group (a 64-deep stage takes its group's
        words whole and reads half of them)."""
        return self.block_m * META_ROW_BYTES

    def words_by_tma(self, sparse: bool) -> bool:
        """Whether the kernel for A 2:4 ``sparse`` or not has the metadata ring."""
        return sparse and self.sparse_meta == "tma"

    def meta_slots(self, stages: int, sparse: bool) -> int:
        """Slots of the metadata ring beside a ``stages``-deep A/B ring (0: no such ring).
        A consumer frees a slot once its threads have read their words, before it releases
        the previous stage of A and B, so one slot fewer than the stages never holds the
        producer back; and 128 x 256 x 128 keeps its two stages (two words slots do not fit
        beside them and C's tile)."""
        return stages - 1 if self.words_by_tma(sparse) else 0

    def epilogue_bytes(self, out_dtype: str) -> int:
        """Bytes of the C tile staged for its TMA store."""
        return self.block_m * self.block_n * element_bytes(out_dtype)

    def ring_stages(self, arch: str, out_dtype: str, in_dtype: str = "bfloat16",
                    sparse: bool = False, cluster: bool = False) -> int:
        """The ring's depth on ``arch`` for ``in_dtype`` operands (A 2:4 sparse: its kept
        halves, and its metadata ring when ``sparse_meta`` is ``"tma"``) when the tile leaves
        as ``out_dtype`` (``cluster``: beside the cluster split's partial tile): ``stages``,
        or as many as fit (at most ``MAX_STAGES``).

        Raises:
            ConfigError: fewer than two stages fit.
        """
        room = SMEM_CAPACITY[arch] - BARRIER_BYTES - self.epilogue_bytes(out_dtype)
        if cluster:
            room -= self.partial_bytes()
        stage = self.stage_bytes(in_dtype, sparse)
        # Each stage past the first brings a metadata slot (``meta_slots``).
        meta = self.meta_bytes() if self.words_by_tma(sparse) else 0
        fit = (room + meta) // (stage + meta)
        stages = self.stages or min(fit, MAX_STAGES)
        if stages < 2 or stages > fit:
            beside = f" and a {self.partial_bytes() // 1024} KiB partial tile" if cluster else ""
            words = " (and the metadata words' ring)" if meta else ""
            raise ConfigError(
                f"{self.block_m} x {self.block_n} x {self.block_k} tiles{words} with a "
                f"{out_dtype} epilogue{beside} fit {fit} ring stages in "
                f"{SMEM_CAPACITY[arch] // 1024} KiB of shared memory; asked "
                f"{self.stages or 'as many as fit'} (need at least 2)")
        return stages

    def replace(self, **changes) -> GemmConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def short_name(self) -> str:
        return self.label()

    def check_problem(self, head_dim: int, arch: str | None) -> None:
        """The analysis tools' check of a target: the kernel is sm_90a's (``head_dim`` is an
        attention config's and plays no part)."""
        if arch is not None and arch != "sm_90a":
            raise ConfigError(f"the GEMM kernel is built for sm_90a (wgmma, TMA), not {arch}")

    def smem_bytes(self, head_dim: int = 0, element_bytes_: int = 2) -> int:
        """Dynamic shared memory of the kernel with ``element_bytes_``-byte operands (2:
        fp16/bf16, 1: int8) and a 16-bit C: the ring, C's tile, the barriers (``head_dim``
        is an attention config's and plays no part)."""
        in_dtype = "int8" if element_bytes_ == 1 else "bfloat16"
        stages = self.ring_stages("sm_90a", "bfloat16", in_dtype)
        return (stages * self.stage_bytes(in_dtype) + self.epilogue_bytes("bfloat16")
                + BARRIER_BYTES)

    @classmethod
    def from_name(cls, name: str) -> tuple[GemmConfig, bool]:
        """``(config, int8)`` of a tool's name for a GEMM config: ``gemm`` or ``igemm`` (the
        default tile; ``igemm`` the INT8 kernel, K step 128), optionally ``:BMxBNxBK``.

        Raises:
            ValueError: not such a name; ConfigError: a tile the kernel cannot build.
        """
        family, _, tile = name.partition(":")
        if family not in ("gemm", "igemm"):
            raise ValueError(f"{name!r} is not a GEMM config name (gemm[:BMxBNxBK], igemm[...])")
        int8 = family == "igemm"
        if not tile:
            return cls(block_k=128 if int8 else 64), int8
        try:
            block_m, block_n, block_k = (int(x) for x in tile.split("x"))
        except ValueError:
            raise ValueError(f"expected {family}:BMxBNxBK (e.g. {family}:128x256x64), got "
                             f"{name!r}") from None
        return cls(block_m=block_m, block_n=block_n, block_k=block_k), int8

    def label(self) -> str:
        """A short name: tile, ring, order and split."""
        stages = self.stages or "auto"
        split = "" if self.split_k == 1 else f" split{self.split_k or 'auto'}-{self.split_mode}"
        clustered = self.split_mode == "cluster" and self.split_k > 1
        grid = "persistent" if self.persistent and not clustered else "grid"
        meta = "" if self.sparse_meta == "tma" else f" meta-{self.sparse_meta}"
        pdl = "" if self.pdl else " no-pdl"
        return (f"{self.block_m}x{self.block_n}x{self.block_k} s{stages} "
                f"g{self.raster_group} {grid}{split}{meta}{pdl}")


MmaSwizzle = Literal["none", "xor", "pad8"]


@dataclass(frozen=True)
class MmaGemmConfig:
    """Knobs of the ``mma.sync`` HGEMM (``kernels/gemm/sm80.py``): the lab's HGEMM steps, each
    a knob, so ``attnlab ladder --family gemm`` rebuilds its progression.

    Attributes:
        block_m, block_n, block_k: the CTA tile and its K step.
        warps_m, warps_n: the warp grid over the tile (4 x 4: the lab's 16-warp kernel).
        smem: stage the tiles in shared memory; False is the lab's first step, every MMA
            fragment loaded straight from global memory.
        ldmatrix: fragments by ``ldmatrix`` (else by 32-bit shared loads of the fragment's
            values).
        async_copy: global -> shared by ``cp.async`` (else loads and stores through
            registers).
        stages: shared-memory ring depth (1: load, barrier, compute, barrier; 2: the lab's
            double buffering, which needs ``async_copy``).
        swizzle: the tiles' shared layout: ``"none"``, ``"xor"`` or ``"pad8"`` (+8 halves a
            row, the lab's choice).
        smem_epilogue: C staged in shared memory and written by 16-byte row copies (else each
            thread stores its fragment's column pairs).
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warps_m: int = 4
    warps_n: int = 4
    smem: bool = True
    ldmatrix: bool = True
    async_copy: bool = True
    stages: int = 2
    swizzle: MmaSwizzle = "pad8"
    smem_epilogue: bool = False

    def __post_init__(self):
        if self.block_m % (16 * self.warps_m) or self.block_n % (16 * self.warps_n):
            raise ConfigError(f"block_m must be a multiple of 16 x warps_m and block_n of 16 x "
                              f"warps_n, got {self.block_m} x {self.block_n} over "
                              f"{self.warps_m} x {self.warps_n} warps")
        if self.block_k not in (32, 64):
            raise ConfigError(f"block_k must be 32 or 64, got {self.block_k}")
        if self.warps_m * self.warps_n not in (4, 8, 16):
            raise ConfigError(f"4, 8 or 16 warps, got {self.warps_m} x {self.warps_n}")
        if self.swizzle not in ("none", "xor", "pad8"):
            raise ConfigError(f"swizzle must be none, xor or pad8, got {self.swizzle!r}")
        if not 1 <= self.stages <= 4:
            raise ConfigError(f"stages must be 1 to 4, got {self.stages}")
        if self.stages > 1 and not self.async_copy:
            raise ConfigError("a ring of stages > 1 needs async_copy (cp.async)")
        if not self.smem and (self.ldmatrix or self.async_copy or self.stages != 1
                              or self.smem_epilogue):
            raise ConfigError("smem=False loads fragments from global memory: ldmatrix, "
                              "async_copy, stages and smem_epilogue need shared memory")

    @property
    def num_threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def smem_bytes(self, head_dim: int = 0, element_bytes_: int = 2) -> int:
        """Shared memory of the tiles, the ring and C's staging (``head_dim``: an attention
        config's, no part here)."""
        pad = 8 if self.swizzle == "pad8" else 0
        ring = (self.stages * (self.block_m + self.block_n) * (self.block_k + pad)
                * element_bytes_ if self.smem else 0)
        staging = self.block_m * (self.block_n + pad) * 2 if self.smem_epilogue else 0
        return ring + staging

    def check_problem(self, head_dim: int, arch: str | None) -> None:
        """The analysis tools' check of a target: the shared memory fits ``arch``."""
        if arch is not None and self.smem_bytes() > SMEM_CAPACITY[arch]:
            raise ConfigError(f"{self.label()} needs {self.smem_bytes()} bytes of shared "
                              f"memory; {arch} has {SMEM_CAPACITY[arch]}")

    def replace(self, **changes) -> MmaGemmConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        how = ("global" if not self.smem else
               f"{'cp.async' if self.async_copy else 'ldg+sts'} s{self.stages} {self.swizzle} "
               f"{'ldmatrix' if self.ldmatrix else 'lds'}"
               f"{' smem-epi' if self.smem_epilogue else ''}")
        return (f"mma {self.block_m}x{self.block_n}x{self.block_k} "
                f"{self.warps_m * self.warps_n}w {how}")

    def short_name(self) -> str:
        return self.label()
