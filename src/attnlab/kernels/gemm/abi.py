"""The GEMM kernels' launch ABI: what changes a binary (the specs, the disk cache's keys) and
the argument lists, in order, with their compile-time stand-ins. Importing this module does
not import the CuTe DSL.

Operands keep their own layouts: A ``[M, K]`` and B ``[K, N]`` each with a unit stride along
one mode (``a_major``, ``b_major``: ``"k"`` for a row-major A or a B that is a transposed
``[N, K]`` weight, ``"m"``/``"n"`` for the other), the other stride a multiple of 16 bytes (the
TMA unit's rule). C is ``[M, N]`` row-major, or ``[splits, M, N]`` fp32 partial sums.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from attnlab.config import ConfigError
from attnlab.gemm_config import BLOCK_MS, GemmConfig, MmaGemmConfig
from attnlab.kernels.abi import FlatSpec, _element_type

#: Operand dtypes of the GEMM kernel: the HGEMM's, and INT8 (IGEMM).
GEMM_DTYPES = ("float16", "bfloat16", "int8")
#: INT8's epilogue: none (16-bit operands), per-row x per-column scales, and per-column zero
#: points of B (with A's row sums).
DEQUANTS = ("none", "scale", "scale_zero")
#: How split-K slices reach C: not at all, partials summed by the last slice, partials summed
#: by a second kernel, reduce-adds into C, partials summed within a cluster.
SPLITS = ("none", "serial", "workspace", "atomic", "cluster")
#: Bytes every TMA stride and base must be a multiple of.
GEMM_ALIGN_BYTES = 16
#: The K step of 2:4 sparse and online INT8 tiles: A's kept halves, or an int8 tile read as
#: 16-bit pairs, then fill 32 columns, one swizzle atom.
SPARSE_BLOCK_K = 64
#: The logical K of one sparse MMA (``mma.sp`` m16n8k32, ``wgmma.mma_async.sp`` m64nNk32):
#: one compressed 16-column block of A's kept halves against 32 rows of B.
SPARSE_MMA_K = 32
#: A's columns one 16-bit metadata word covers (four groups of four).
META_COLUMNS = 16
#: Columns of A one K group of the sm_90 kernel's metadata words covers (four 32-deep steps:
#: one 16-byte load a thread, ``attnlab.gemm.sparse.wgmma_words``).
WORDS_K = 128
#: A 16-bit metadata word of padding: every group of four keeps positions 0 and 1 (zeros).
PAD_META = 0x4444
#: Rows of A the sm_90 kernel's metadata words are padded to a multiple of (with
#: ``PAD_META``): every tile height divides it, so a tile's TMA box of words never reaches
#: past the tensor, where the TMA unit's zero fill would hand the MMA the selector 0b0000,
#: which PTX leaves undefined (ISA, "Sparse matrix storage" of ``wgmma.mma_async.sp``).
WORDS_ROWS = math.lcm(*BLOCK_MS)


def binary_config(config: GemmConfig | MmaGemmConfig) -> GemmConfig | MmaGemmConfig:
    """``config`` with the knobs that do not change the binary (the grid, the split count and
    its mode, which the spec's ``split`` carries) at their defaults: one cache entry per
    binary. (Every ``MmaGemmConfig`` knob changes the binary.)"""
    if isinstance(config, MmaGemmConfig):
        return config
    default = GemmConfig()
    if config.split_mode == "cluster" and config.split_k > 1:
        # The cluster's size is compiled in: its meeting's loads are then unrolled.
        return config.replace(persistent=default.persistent)
    return config.replace(persistent=default.persistent, split_k=default.split_k,
                          split_mode=default.split_mode)


@dataclass(frozen=True)
class GemmSpec(FlatSpec):
    """One compiled GEMM: the sm_90a kernel (``kernels/gemm/sm90.py``) of a ``GemmConfig``,
    or the ``mma.sync`` ladder kernel (``kernels/gemm/sm80.py``) of an ``MmaGemmConfig``.

    Attributes:
        config: the tile and ring (``binary_config`` of a ``GemmConfig``), or the ladder's
            knobs.
        arch: the target (``"sm_90a"``; the ``mma.sync`` kernel also ``"sm_80"``...).
        dtype: A's and B's dtype.
        out_dtype: C's dtype (``"float32"`` for split-K's partials and reduce-adds).
        a_major, b_major: the unit-stride mode of A (``"k"`` or ``"m"``) and B (``"k"`` or
            ``"n"``).
        split: ``"none"``, ``"serial"`` (with a workspace and tile counters),
            ``"workspace"`` (C is ``[splits, M, N]``), ``"atomic"`` (C is reduce-added to) or
            ``"cluster"`` (a tile's slices are one cluster: a CTA per slice, the grid the
            work items).
        dequant: INT8's epilogue (``DEQUANTS``); ``"none"`` for 16-bit operands.
        bias: the epilogue adds ``bias[j]`` to column ``j`` (in fp32, before C's rounding;
            the sm_90a kernel without split-K, with the serial split or in a cluster).
        sparse: A is 2:4 structured-sparse (``attnlab.gemm.sparse``): its kept halves
            ``[M, K / 2]`` (K-major) and their metadata; the sm_90a kernel with
            ``wgmma.mma_async.sp`` (``block_k`` 64 or 128; its metadata words by TMA or by
            each thread's global loads, ``GemmConfig.sparse_meta``), or the ``mma.sync``
            kernel with ``mma.sp``, K step 64, tiles in shared memory by ``cp.async`` and
            ``ldmatrix``.
        online_int8: fp16/bf16 A and B quantized to int8 per K tile in shared memory (a scale
            per row of A and per column of B and K tile), multiplied by s8 MMAs, each tile's
            int32 sums scaled into an fp32 accumulator (``attnlab.gemm.online``); the same
            ``mma.sync`` kernel and K step as ``sparse``.
    """

    KIND: ClassVar[str] = "gemm"

    config: GemmConfig | MmaGemmConfig
    arch: str
    dtype: str
    out_dtype: str
    a_major: str = "k"
    b_major: str = "n"
    split: str = "none"
    dequant: str = "none"
    bias: bool = False
    sparse: bool = False
    online_int8: bool = False

    def __post_init__(self):
        if self.bias and self.split in ("workspace", "atomic"):
            raise ConfigError(f"a bias is added by the epilogue of the slice that finishes a "
                              f"tile: split \"none\", \"serial\" or \"cluster\", not "
                              f"{self.split!r}")
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {self.split!r}")
        cluster_config = (isinstance(self.config, GemmConfig) and self.config.split_k > 1
                          and self.config.split_mode == "cluster")
        if (self.split == "cluster") != cluster_config:
            raise ConfigError("split \"cluster\" goes with a config of split_mode \"cluster\" "
                              "and its split_k (the cluster's size, compiled in)")
        if self.sparse and self.online_int8:
            raise ConfigError("sparse and online_int8 are separate kernels; pick one")
        cfg = self.config
        if (isinstance(cfg, GemmConfig) and not self.sparse
                and cfg.sparse_meta != GemmConfig.sparse_meta):
            # The same binary under another cache key and label.
            raise ConfigError(f"sparse_meta is the 2:4 sparse kernel's knob; a dense GEMM "
                              f"takes the default ({GemmConfig.sparse_meta!r}), got "
                              f"{cfg.sparse_meta!r}")
        mma_sync_only = [(self.online_int8, "online INT8")]
        if isinstance(cfg, GemmConfig) and self.sparse:
            self._check_sparse_wgmma()
        else:
            mma_sync_only.append((self.sparse, "2:4 sparse A"))
        for flag, what in mma_sync_only:
            if not flag:
                continue
            if not isinstance(cfg, MmaGemmConfig) or self.dtype not in ("float16", "bfloat16"):
                raise ConfigError(f"{what} runs on the mma.sync kernel with 16-bit operands")
            if cfg.block_k != SPARSE_BLOCK_K or not (cfg.smem and cfg.ldmatrix
                                                     and cfg.async_copy):
                raise ConfigError(f"{what} needs block_k={SPARSE_BLOCK_K} (two 32-deep MMA "
                                  f"steps a tile) and its tiles in shared memory by cp.async "
                                  f"and ldmatrix; got {cfg.label()}")

    def _check_sparse_wgmma(self) -> None:
        """2:4 sparse A on the sm_90a kernel: 16-bit, K-major kept halves, 32-deep steps."""
        if self.dtype not in ("float16", "bfloat16") or self.a_major != "k":
            raise ConfigError(f"2:4 sparse A on the wgmma kernel is K-major fp16/bf16, got "
                              f"{self.a_major}-major {self.dtype}")
        if self.config.block_k % (2 * SPARSE_MMA_K):
            raise ConfigError(f"2:4 sparse A on the wgmma kernel needs block_k 64 or 128 (a "
                              f"16-byte-wide stage of kept halves per 32-deep step pair), got "
                              f"{self.config.block_k}")
        if self.dequant != "none":
            raise ConfigError("2:4 sparse A has no INT8 epilogue")

    def variant(self) -> str:
        split = "" if self.split == "none" else f"_{self.split}"
        dequant = "" if self.dequant == "none" else f"_{self.dequant}"
        bias = "_bias" if self.bias else ""
        sparse = "_sp24" if self.sparse else ""
        online = "_online_int8" if self.online_int8 else ""
        return f"_{self.a_major}{self.b_major}{split}{dequant}{bias}{sparse}{online}"

    @property
    def label(self) -> str:
        if isinstance(self.config, MmaGemmConfig):
            family = ("sparse24_sm80" if self.sparse else
                      "online_int8_sm80" if self.online_int8 else "hgemm_sm80")
            return f"{family}({self.config.label()})"
        family = "igemm" if self.dtype == "int8" else "hgemm"
        return f"{family}({self.config.label()})"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GemmSpec:
        fields = {k: v for k, v in data.items() if k != "kind"}
        knobs = fields["config"]
        config_class = MmaGemmConfig if "warps_m" in knobs else GemmConfig
        return cls(**{**fields, "config": config_class(**knobs)})


class GemmArgs(NamedTuple):
    """The HGEMM launch's arguments, in order.

    Attributes:
        a: ``[M, K]``; b: ``[K, N]`` (see the module docstring for their strides).
        c: ``[M, N]`` in ``out_dtype``, or fp32 ``[splits, M, N]`` (``split="workspace"``).
        workspace: fp32 ``[splits, M, N]``, the slices' partial sums (``split="serial"``,
            else None).
        counters: int32, one per output tile and consumer warpgroup, zero before the launch
            and left zero after it: how many slices of the tile have stored their partials
            (``split="serial"``, else None).
        scale_a, scale_b: fp32 ``[M]`` and ``[N]``, INT8's per-row and per-column scales
            (else None).
        zero_b: fp32 ``[N]``, B's per-column zero points (``dequant="scale_zero"``, else
            None; the kernel sums A's rows for them itself).
        bias: ``[N]`` in A's dtype (``bias=True``, else None).
        meta: the 2:4 metadata of A (``sparse=True``, else None): for the ``mma.sync``
            kernel int16 ``[M, K / 16]``, per row four 4-bit groups a word, each the two kept
            positions of one group of four (``attnlab.gemm.sparse``); for the sm_90 kernel
            int32 ``[M' / 16, K / 128, 16, 4]``, the same fields as the words its threads
            hand the MMA, M padded to M' (a multiple of ``WORDS_ROWS``, which the TMA copies
            of ``sparse_meta="tma"`` need; ``attnlab.gemm.sparse.wgmma_words``).
        num_splits: K slices per output tile (1 without split-K).
        num_ctas: CTAs of the grid; each walks the tiles ``c, c + num_ctas, ...``.
    """

    a: Any
    b: Any
    c: Any
    workspace: Any
    counters: Any
    scale_a: Any
    scale_b: Any
    zero_b: Any
    bias: Any
    meta: Any
    num_splits: Any
    num_ctas: Any


@dataclass(frozen=True)
class ReduceSpec(FlatSpec):
    """The split-K reduction (``kernels/gemm/reduce.py``): fp32 partials summed in split
    order, written as ``out_dtype``."""

    KIND: ClassVar[str] = "gemm_reduce"

    arch: str
    out_dtype: str

    @property
    def dtype(self) -> str:
        """The dtype a spec is named by: the output's (the partials are fp32)."""
        return self.out_dtype

    @property
    def label(self) -> str:
        return "splitk_reduce"


class ReduceArgs(NamedTuple):
    """The reduction's arguments: fp32 ``partials [splits, M, N]`` and ``out [M, N]``."""

    partials: Any
    out: Any


def _fake_matrix(dtype: str, unit_stride_mode: int, batched: bool = False):
    """A symbolic 2D tensor (or ``[batch, rows, cols]``) whose ``unit_stride_mode`` (0 or 1
    of the matrix) has stride 1 and whose other stride is a multiple of 16 bytes."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    div = GEMM_ALIGN_BYTES * 8 // _element_type(dtype).width
    other = cute.sym_int32(divisibility=div)
    stride = (other, 1) if unit_stride_mode == 1 else (1, other)
    shape = (cute.sym_int(), cute.sym_int())
    if batched:
        shape, stride = (cute.sym_int(), *shape), (cute.sym_int64(divisibility=div), *stride)
    return make_fake_tensor(_element_type(dtype), shape, stride=stride,
                            assumed_align=GEMM_ALIGN_BYTES)


def fake_gemm_args(spec: GemmSpec) -> GemmArgs:
    """Compile-time stand-ins for an HGEMM launch's arguments under ``spec``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    serial = spec.split == "serial"

    def vector(dtype, used: bool):
        element = _element_type(dtype)
        return (make_fake_tensor(element, (cute.sym_int(),), stride=(1,),
                                 assumed_align=element.width // 8) if used else None)

    scaled, zeroed = spec.dequant != "none", spec.dequant == "scale_zero"
    meta = None
    if spec.sparse and isinstance(spec.config, GemmConfig):
        # The sm_90 kernel's words: [row blocks, K groups, 16, 4] int32, contiguous.
        meta = make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int(), 16, 4),
                                stride=(cute.sym_int32(divisibility=64), 64, 4, 1),
                                assumed_align=16)
    elif spec.sparse:
        meta = make_fake_tensor(cutlass.Int16, (cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int32(), 1), assumed_align=2)
    return GemmArgs(
        _fake_matrix(spec.dtype, 1 if spec.a_major == "k" else 0),
        _fake_matrix(spec.dtype, 1 if spec.b_major == "n" else 0),
        _fake_matrix(spec.out_dtype, 1, batched=spec.split == "workspace"),
        _fake_matrix("float32", 1, batched=True) if serial else None,
        vector("int32", serial), vector("float32", scaled), vector("float32", scaled),
        vector("float32", zeroed), vector(spec.dtype, spec.bias),
        meta, cutlass.Int32(1), cutlass.Int32(1))


def fake_reduce_args(spec: ReduceSpec) -> ReduceArgs:
    """Compile-time stand-ins for the split-K reduction's arguments."""
    return ReduceArgs(_fake_matrix("float32", 1, batched=True),
                      _fake_matrix(spec.out_dtype, 1))
