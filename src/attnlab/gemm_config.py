"""The GEMM configuration: one frozen dataclass of the Hopper HGEMM's knobs.

A config says *how* ``C = A @ B`` is tiled and scheduled; the problem (M, N, K, dtypes,
operand majorness) comes with the call. Invalid combinations are refused when a config is
built, with the reason (``attnlab.ConfigError``).

The knobs are the lab's GEMM steps as they exist on sm_90a (``attnlab.ladder`` names them):
the CTA tile (``block_m`` x ``block_n``, the lab's 128 x 128 and 128 x 256), the K step and
the depth of the TMA ring (the lab's cp.async double buffering becomes a ``stages``-deep ring
filled by a producer warp), the order of the output tiles (``raster_group``: L2 reuse), the
persistent grid (the lab's Observation DD) and split-K (Observations EE and FF:
``split_k``, ``split_mode``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from attnlab.config import SMEM_CAPACITY, WGMMA_M, ConfigError

SplitMode = Literal["serial", "workspace", "atomic"]
SPLIT_MODES: tuple[str, ...] = ("serial", "workspace", "atomic")
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
            fp32 accumulator in L2: order-dependent rounding, the lab's Pattern A).
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    stages: int = 0
    raster_group: int = 8
    persistent: bool = True
    split_k: int = 1
    split_mode: SplitMode = "workspace"

    def __post_init__(self):
        if self.block_m not in (64, 128, 192):
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
        if self.accumulator_registers + CONSUMER_OVERHEAD_REGS > self.consumer_registers:
            raise ConfigError(
                f"a {self.block_m} x {self.block_n} tile needs {self.accumulator_registers} "
                f"accumulator registers per thread; {self.num_consumers} consumer warpgroups "
                f"have {self.consumer_registers} in all")

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

    def stage_bytes(self, in_dtype: str = "bfloat16") -> int:
        """Bytes of one A and B stage of ``in_dtype`` operands."""
        return (self.block_m + self.block_n) * self.block_k * element_bytes(in_dtype)

    def epilogue_bytes(self, out_dtype: str) -> int:
        """Bytes of the C tile staged for its TMA store."""
        return self.block_m * self.block_n * element_bytes(out_dtype)

    def ring_stages(self, arch: str, out_dtype: str, in_dtype: str = "bfloat16") -> int:
        """The ring's depth on ``arch`` for ``in_dtype`` operands when the tile leaves as
        ``out_dtype``: ``stages``, or as many as fit (at most ``MAX_STAGES``).

        Raises:
            ConfigError: fewer than two stages fit.
        """
        room = SMEM_CAPACITY[arch] - BARRIER_BYTES - self.epilogue_bytes(out_dtype)
        fit = room // self.stage_bytes(in_dtype)
        stages = self.stages or min(fit, MAX_STAGES)
        if stages < 2 or stages > fit:
            raise ConfigError(
                f"{self.block_m} x {self.block_n} x {self.block_k} tiles with a {out_dtype} "
                f"epilogue fit {fit} ring stages in {SMEM_CAPACITY[arch] // 1024} KiB of "
                f"shared memory; asked {self.stages or 'as many as fit'} (need at least 2)")
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
        grid = "persistent" if self.persistent else "grid"
        return (f"{self.block_m}x{self.block_n}x{self.block_k} s{stages} "
                f"g{self.raster_group} {grid}{split}")
