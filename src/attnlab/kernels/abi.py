"""The forward kernels' launch ABI: one definition of what a launch passes and what changes the
binary, used by compilation, by every launch and by both kernel classes.

* :class:`ForwardSpec` is everything that changes the compiled code: the config, the target,
  the dtype, the head dim and the variant (masked, packed, with or without the LSE, compiled-in
  strides). Two launches with equal specs run the same binary; the disk cache keys on it.
* :class:`ForwardArgs` is the argument list, in order. The kernels' ``__call__`` takes exactly
  these parameters (a CPU test holds them to it), compilation passes fake tensors built by
  :func:`fake_forward_args`, and a launch passes torch tensors and Python numbers straight to
  the compiled TVM-FFI function. A feature a spec leaves out is ``None`` in both: compiled
  out, and refused at launch if a tensor is passed for it.

Tensors keep their own layouts: dense q/k/v/out ``[B, S, H, D]``, packed (varlen)
``[total, H, D]``; the LSE ``[B, H, Sq]`` or ``[H, total_q]``. Strides are symbolic multiples
of 8 elements (what validation guarantees, so 16-byte copies vectorise) with a unit last
stride; the batch stride is 64-bit, so a tensor may span more than 2**31 elements as long as
one batch element (one packed sequence) does not. Importing this module does not import the
CuTe DSL: the launch path needs only the spec and the argument order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from attnlab.backward_config import BackwardConfig
from attnlab.config import ConfigError, FlashConfig

#: (row, head) strides of q, k, v and out, in elements: what a ``static_strides`` kernel is
#: specialised on.
Strides = tuple[tuple[int, int], ...]

#: Heads assumed when a ``static_strides`` config is cross-compiled without real tensors
#: (contiguous BSHD, as in the benchmarks).
CANONICAL_HEADS = 16
#: Alignment (bytes) of q/k/v/out: one 16-byte vector copy.
TILE_ALIGN_BYTES = 16
#: Stride divisibility (elements) of q/k/v/out: 16 bytes of 16-bit elements.
STRIDE_DIVISIBILITY = 8
#: The backward's L and D rows per head are a multiple of this (16 bytes of fp32: a TMA
#: copy's stride granularity).
STATS_ROW_MULTIPLE = 4

DTYPES = ("float16", "bfloat16")

#: A window side with no bound, as the kernels take it: a number of keys larger than any
#: sequence (validation keeps lengths below 2**30), so one formula serves every mask.
UNBOUNDED_SIDE = 1 << 30


def _element_type(dtype: str):
    """The CuTe element type of a dtype name: ``float16``, ``bfloat16``, ``float32`` or
    ``int8`` (imports the DSL: compile time only)."""
    import cutlass

    return {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16,
            "float32": cutlass.Float32, "int8": cutlass.Int8, "int32": cutlass.Int32}[dtype]


def canonical_strides(head_dim: int, heads: int = CANONICAL_HEADS) -> Strides:
    """(row, head) strides of contiguous BSHD tensors with ``heads`` heads."""
    return ((heads * head_dim, head_dim),) * 4


def row_head_strides(*tensors: Any) -> Strides:
    """The (row, head) strides of each of q, k, v, out (dense BSHD or varlen THD)."""
    return tuple(tuple(int(x) for x in t.stride()[-3:-1]) for t in tensors)


@dataclass(frozen=True)
class ForwardSpec:
    """What one compiled forward kernel is specialised on.

    Attributes:
        config: the kernel's knobs; ``config.wgmma`` picks the Hopper kernel class.
        arch: the target, e.g. ``"sm_80"`` or ``"sm_90a"``.
        dtype: ``"float16"`` or ``"bfloat16"``.
        head_dim: D, compiled in.
        windowed: causal or sliding-window masking (the band code is compiled in).
        varlen: packed sequences located by ``cu_seqlens``.
        with_lse: the kernel writes the log-sum-exp; without it there is no LSE argument.
        strides: the (row, head) strides compiled in, exactly when ``config.static_strides``
            (kernel 16); ``None`` otherwise.
    """

    config: FlashConfig
    arch: str
    dtype: str
    head_dim: int
    windowed: bool = False
    varlen: bool = False
    with_lse: bool = True
    strides: Strides | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.config, FlashConfig):
            raise TypeError(f"config must be a FlashConfig, got {type(self.config).__name__}")
        if self.strides is not None and not self.config.static_strides:
            raise ValueError("strides are compiled in only for a static_strides config")
        if self.config.cluster_m > 1 and (self.windowed or self.varlen):
            raise ConfigError("cluster_m shares one K/V walk between row blocks: a mask or "
                              "packed sequences give them different walks")
        if self.config.static_strides and self.strides is None:
            object.__setattr__(self, "strides", canonical_strides(self.head_dim))

    def replace(self, **changes: object) -> ForwardSpec:
        return dataclasses.replace(self, **changes)

    @property
    def splits_tail(self) -> bool:
        """``split_tail`` applies: its runs of K/V blocks end a persistent static walk of
        tiles of equal length, which neither a mask nor packed sequences give (elsewhere the
        knob has no effect)."""
        return (self.config.split_tail and self.config.static_persistent_walk
                and not (self.windowed or self.varlen))

    @property
    def label(self) -> str:
        """The config's name (logs and tables)."""
        return self.config.short_name()

    def variant(self) -> str:
        """Short name of the variant flags, for file names and tables."""
        return "".join(name for name, on in (("_win", self.windowed), ("_varlen", self.varlen),
                                             ("_nolse", not self.with_lse)) if on)

    def to_dict(self) -> dict[str, object]:
        return {"config": self.config.to_dict(), "arch": self.arch, "dtype": self.dtype,
                "head_dim": self.head_dim, "windowed": self.windowed, "varlen": self.varlen,
                "with_lse": self.with_lse,
                "strides": [list(s) for s in self.strides] if self.strides else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ForwardSpec:
        strides = data.get("strides")
        return cls(FlashConfig.from_dict(data["config"]), data["arch"], data["dtype"],
                   data["head_dim"], data["windowed"], data["varlen"], data["with_lse"],
                   tuple(tuple(s) for s in strides) if strides else None)


class ForwardArgs(NamedTuple):
    """The forward launch's arguments, in order (a launch passes the CUDA stream implicitly:
    the caller's current torch stream).

    Attributes:
        q, k, v, out: ``[B, S, H, D]`` dense or ``[total, H, D]`` packed.
        lse: fp32 ``[B, Hq, Sq]`` dense or ``[Hq, total_q]`` packed; None without LSE.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]`` offsets (packed); None dense.
        softmax_scale: multiplier of Q K^T.
        window_left, window_right: the band in keys around the diagonal; an unbounded side is
            ``UNBOUNDED_SIDE`` (``encode_window`` converts flash_attn's -1).
        max_seqlen_q: the longest query sequence (dense: Sq); sizes the grid.
        num_ctas: the grid of a ``persistent`` config (CTAs looping over tiles); None
            otherwise.
        tile_counter: int32, at least two elements, zero before the launch and left zero
            (``attnlab.counters``): the tile counter of a ``dynamic_tiles`` config, or a
            ``split_tail`` config's flags (one per CTA); None otherwise.
        scratch: fp32, ``split_tail_scratch(...)`` elements (``attnlab.counters.scratch``):
            where a ``split_tail`` config's split tiles leave their partial results; None
            otherwise.
    """

    q: Any
    k: Any
    v: Any
    out: Any
    lse: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    softmax_scale: Any
    window_left: Any
    window_right: Any
    max_seqlen_q: Any
    num_ctas: Any
    tile_counter: Any = None
    scratch: Any = None


def split_tail_values(config: FlashConfig, head_dim: int) -> int:
    """fp32 values a consumer thread of a ``split_tail`` kernel leaves for a split tile: its
    share of O and the maximum and sum of its two rows (a warpgroup's 64 rows over 128
    threads)."""
    return config.block_m * head_dim // (32 * config.num_warps) + 2 * 2


def split_tail_scratch(config: FlashConfig, head_dim: int, num_ctas: int) -> int:
    """fp32 elements of a ``split_tail`` launch's scratch: one slot per CTA."""
    return split_tail_values(config, head_dim) * 32 * config.num_warps * num_ctas


def fake_forward_args(spec: ForwardSpec) -> ForwardArgs:
    """Compile-time stand-ins for a launch's arguments under ``spec`` (no GPU, no memory)."""
    import cutlass

    elem = _element_type(spec.dtype)
    tiles = [_fake_rows_tensor(elem, spec.head_dim, spec.varlen,
                               spec.strides[i] if spec.strides is not None else None)
             for i in range(4)]
    lse = _fake_row_stats(spec.varlen) if spec.with_lse else None
    cu_q = cu_k = None
    if spec.varlen:
        cu_q, cu_k = _fake_cu_seqlens(), _fake_cu_seqlens()
    return ForwardArgs(
        *tiles, lse, cu_q, cu_k, cutlass.Float32(1.0),
        cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1),
        cutlass.Int32(1) if spec.config.persistent else None,
        _fake_cu_seqlens() if spec.config.dynamic_tiles or spec.splits_tail else None,
        _fake_scratch() if spec.splits_tail else None)


@dataclass(frozen=True)
class BackwardSpec:
    """What one compiled backward kernel is specialised on (as :class:`ForwardSpec`).

    ``deterministic``: dQ's partial sums from the K/V blocks are added in block order (each
    CTA waits for its turn on a per-query-block counter) instead of as they come, so the
    gradients are bitwise repeatable.
    """

    config: BackwardConfig
    arch: str
    dtype: str
    head_dim: int
    windowed: bool = False
    varlen: bool = False
    deterministic: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.config, BackwardConfig):
            raise TypeError(f"config must be a BackwardConfig, got {type(self.config).__name__}")

    @property
    def label(self) -> str:
        return self.config.short_name()

    def variant(self) -> str:
        return "".join(name for name, on in (("_win", self.windowed), ("_varlen", self.varlen),
                                             ("_det", self.deterministic)) if on)

    def to_dict(self) -> dict[str, object]:
        return {"kind": "backward", "config": self.config.to_dict(), "arch": self.arch,
                "dtype": self.dtype, "head_dim": self.head_dim, "windowed": self.windowed,
                "varlen": self.varlen, "deterministic": self.deterministic}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackwardSpec:
        return cls(BackwardConfig.from_dict(data["config"]), data["arch"], data["dtype"],
                   data["head_dim"], data["windowed"], data["varlen"], data["deterministic"])


class FlatSpec:
    """A spec whose fields are all plain values: serialised as its fields and its ``KIND``,
    its ``variant()`` the suffixes of its set ``FLAGS``."""

    KIND: ClassVar[str]
    #: (suffix, field name) of each boolean that names a variant.
    FLAGS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def variant(self) -> str:
        return "".join(suffix for suffix, name in self.FLAGS if getattr(self, name))

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.KIND, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return cls(**{k: v for k, v in data.items() if k != "kind"})


@dataclass(frozen=True)
class PreprocessSpec(FlatSpec):
    """The backward's preprocess kernel (``kernels/common/bwd_preprocess.py``): what it is
    specialised on. ``with_dlse``: the LSE's gradient is subtracted from D."""

    KIND: ClassVar[str] = "preprocess"
    FLAGS: ClassVar[tuple[tuple[str, str], ...]] = (("_varlen", "varlen"),
                                                    ("_dlse", "with_dlse"))

    arch: str
    dtype: str
    head_dim: int
    varlen: bool = False
    with_dlse: bool = False

    @property
    def label(self) -> str:
        return "bwd_preprocess"


class PreprocessArgs(NamedTuple):
    """The preprocess launch's arguments: out and dout as the forward's q/out; lse as the
    forward's LSE; dlse like it or None; dpsum and lse_log2 as ``BackwardArgs``' (written,
    padding included); dq_accum as ``BackwardArgs``' (zeroed)."""

    out: Any
    dout: Any
    lse: Any
    dlse: Any
    dpsum: Any
    lse_log2: Any
    dq_accum: Any


def fake_preprocess_args(spec: PreprocessSpec) -> PreprocessArgs:
    import cutlass

    elem = _element_type(spec.dtype)
    return PreprocessArgs(
        _fake_rows_tensor(elem, spec.head_dim, spec.varlen),
        _fake_rows_tensor(elem, spec.head_dim, spec.varlen), _fake_row_stats(spec.varlen),
        _fake_row_stats(spec.varlen) if spec.with_dlse else None,
        _fake_row_stats(spec.varlen, padded=True), _fake_row_stats(spec.varlen, padded=True),
        _fake_rows_tensor(cutlass.Float32, spec.head_dim, spec.varlen))


@dataclass(frozen=True)
class DecodeSpec(FlatSpec):
    """The split-KV decoding kernel (``kernels/common/decode.py``): what it is specialised
    on. ``paged``: the cache is ``[pages, page_size, Hkv, D]`` read through a block table
    (else ``[B_cache, S_cache, Hkv, D]``, optionally through ``cache_batch_idx``);
    ``batch_idx``: a contiguous cache's rows are chosen by ``cache_batch_idx``;
    ``windowed``: a causal or sliding-window band; ``split``: it writes fp32 partial outputs
    and LSEs for the combine kernel instead of the output; ``serial_merge`` (with ``split``):
    no combine kernel, the split that finishes a query tile last (counted at a per-tile
    counter) merges the tile's partials into the output; ``keys_per_warp``: each warp's
    slice of a K/V block (the block is ``keys_per_warp * DECODE_WARPS`` keys), ``kv_stages``
    the blocks in flight; ``v_strides``: V's first two strides differ from K's, so a row's
    offset is computed for each (else K's serves both); ``tma_rows`` (sm_90a): K and V come
    by the TMA unit in boxes of this many keys (a block, or a page shorter than a block)
    instead of row by row by ``cp.async`` (0); ``cluster_splits`` (sm_90a, without
    ``split``): the grid's splits of a query tile are the CTAs of one cluster of this many,
    which merge their rows in distributed shared memory and write the output (0: none)."""

    KIND: ClassVar[str] = "decode"
    FLAGS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("_paged", "paged"), ("_batch_idx", "batch_idx"), ("_win", "windowed"),
        ("_split", "split"), ("_vstrides", "v_strides"), ("_serial", "serial_merge"),
        ("_tma", "tma_rows"), ("_cluster", "cluster_splits"))

    arch: str
    dtype: str
    head_dim: int
    paged: bool = False
    batch_idx: bool = False
    windowed: bool = False
    split: bool = False
    keys_per_warp: int = 32
    kv_stages: int = 2
    v_strides: bool = False
    serial_merge: bool = False
    tma_rows: int = 0
    cluster_splits: int = 0

    @property
    def label(self) -> str:
        return f"decode({self.keys_per_warp * DECODE_WARPS}, {self.kv_stages})"


#: Warps of a decoding CTA: each takes its own slice of every K/V block.
DECODE_WARPS = 4


class DecodeArgs(NamedTuple):
    """The decoding launch's arguments, in order.

    Attributes:
        q: ``[B, Sq, Hq, D]``.
        k_cache, v_cache: ``[B_cache, S_cache, Hkv, D]``, or ``[pages, page_size, Hkv, D]``
            with ``block_table``.
        cache_seqlens: int32 ``[B]``, the keys each sequence attends to (new ones appended).
        cache_batch_idx: int32 ``[B]``, the cache row of each sequence; None: the identity.
        block_table: int32 ``[B, max_pages]`` (paged), else None.
        out: ``[B, Sq, Hq, D]`` in q's dtype, or fp32 ``[splits * B, Sq, Hq, D]`` partials.
        lse: fp32 ``[B, Hq, Sq]``, or ``[splits * B, Hq, Sq]`` partials.
        softmax_scale, window_left, window_right: as ``ForwardArgs``.
        num_splits: K/V ranges per (query block, sequence, K/V head).
        merged_out, merged_lse: with ``serial_merge``, the output and its LSE (as the unsplit
            ``out`` and ``lse``), written by each tile's last split; else None.
        counters: with ``serial_merge``, int32, one per (query tile, sequence x K/V head),
            zero before the launch and left zero; else None.
    """

    q: Any
    k_cache: Any
    v_cache: Any
    cache_seqlens: Any
    cache_batch_idx: Any
    block_table: Any
    out: Any
    lse: Any
    softmax_scale: Any
    window_left: Any
    window_right: Any
    num_splits: Any
    merged_out: Any = None
    merged_lse: Any = None
    counters: Any = None


def fake_decode_args(spec: DecodeSpec) -> DecodeArgs:
    """Compile-time stand-ins for a decoding launch's arguments under ``spec``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    elem = _element_type(spec.dtype)
    vector = _fake_cu_seqlens
    table = None
    if spec.paged:
        table = make_fake_tensor(cutlass.Int32, (cute.sym_int(), cute.sym_int()),
                                 stride=(cute.sym_int32(), 1), assumed_align=4)
    out_elem = cutlass.Float32 if spec.split else elem
    serial = spec.split and spec.serial_merge
    return DecodeArgs(
        *(_fake_rows_tensor(elem, spec.head_dim, False) for _ in range(3)), vector(),
        vector() if spec.batch_idx else None, table,
        _fake_rows_tensor(out_elem, spec.head_dim, False), _fake_row_stats(False),
        cutlass.Float32(1.0), cutlass.Int32(0), cutlass.Int32(0), cutlass.Int32(1),
        _fake_rows_tensor(elem, spec.head_dim, False) if serial else None,
        _fake_row_stats(False) if serial else None, vector() if serial else None)


@dataclass(frozen=True)
class CombineSpec(FlatSpec):
    """The kernel that merges a split decoding's partial outputs by their LSEs
    (``kernels/common/decode_combine.py``)."""

    KIND: ClassVar[str] = "decode_combine"

    arch: str
    dtype: str
    head_dim: int

    @property
    def label(self) -> str:
        return "decode_combine"


class CombineArgs(NamedTuple):
    """The combine launch's arguments: the partials as ``DecodeArgs``' split ``out`` and
    ``lse``, the output and its LSE as the unsplit ones, and the split count."""

    partial_out: Any
    partial_lse: Any
    out: Any
    lse: Any
    num_splits: Any


def fake_combine_args(spec: CombineSpec) -> CombineArgs:
    """Compile-time stand-ins for a combine launch's arguments under ``spec``."""
    import cutlass

    elem = _element_type(spec.dtype)
    return CombineArgs(_fake_rows_tensor(cutlass.Float32, spec.head_dim, False),
                       _fake_row_stats(False), _fake_rows_tensor(elem, spec.head_dim, False),
                       _fake_row_stats(False), cutlass.Int32(1))


def spec_from_dict(data: dict[str, Any]
                   ) -> ForwardSpec | BackwardSpec | PreprocessSpec | DecodeSpec | CombineSpec:
    """The spec a ``to_dict`` wrote: forward, backward, the backward's preprocess, decoding or
    its combine."""
    from attnlab.kernels.conv.abi import DirectConvSpec, GroupNormSiluSpec, ImplicitConvSpec
    from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec

    kinds = {"backward": BackwardSpec, "preprocess": PreprocessSpec, "decode": DecodeSpec,
             "decode_combine": CombineSpec, "gemm": GemmSpec, "gemm_reduce": ReduceSpec,
             "groupnorm_silu": GroupNormSiluSpec, "conv_direct": DirectConvSpec,
             "conv_implicit": ImplicitConvSpec}
    return kinds.get(data.get("kind"), ForwardSpec).from_dict(data)


class BackwardArgs(NamedTuple):
    """The backward launch's arguments, in order (the stream is the caller's current one).

    Attributes:
        q, k, v, dout: as the forward's q/k/v/out (dout is O's gradient, laid out like q).
        lse_log2, dpsum: fp32 ``[B, Hq, R]`` dense or ``[Hq, R]`` packed, R at least the
            query rows rounded up to a whole query block (packed: ``total_q`` plus one block):
            the forward's LSE times log2(e) (+inf for a row that saw no key) and
            ``rowsum(dO * O)``, both from the preprocess.
        dq_accum: fp32, q's shape, zeroed: dQ, added to by every K/V block.
        dk, dv: k's and v's shape and dtype, written whole.
        cu_seqlens_q, cu_seqlens_k: as the forward's.
        softmax_scale, window_left, window_right: as the forward's.
        max_seqlen_k: the longest key sequence: sizes the grid.
        semaphores: int32, one per (sequence, query head, query block), zeroed, for
            ``deterministic``; None otherwise.
    """

    q: Any
    k: Any
    v: Any
    dout: Any
    lse_log2: Any
    dpsum: Any
    dq_accum: Any
    dk: Any
    dv: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    softmax_scale: Any
    window_left: Any
    window_right: Any
    max_seqlen_k: Any
    semaphores: Any


def _fake_rows_tensor(dtype, head_dim: int, varlen: bool, strides=None):
    """A symbolic q/k/v-like tensor: ``[B, S, H, D]`` or ``[total, H, D]``."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    def row_head_strides() -> tuple:
        if strides is not None:
            return strides
        return (cute.sym_int32(divisibility=STRIDE_DIVISIBILITY),
                cute.sym_int32(divisibility=STRIDE_DIVISIBILITY))

    if varlen:
        shape, stride = (cute.sym_int(), cute.sym_int()), row_head_strides()
    else:
        shape = (cute.sym_int(), cute.sym_int(), cute.sym_int())
        stride = (cute.sym_int64(divisibility=STRIDE_DIVISIBILITY), *row_head_strides())
    return make_fake_tensor(dtype, (*shape, head_dim), stride=(*stride, 1),
                            assumed_align=TILE_ALIGN_BYTES)


def _fake_row_stats(varlen: bool, padded: bool = False):
    """A symbolic fp32 per-row tensor ``[B, H, S]`` or ``[H, total]`` (the LSE's layout);
    ``padded``: the backward's L and D, whose rows are padded to a multiple of 4 and whose
    base is 16-byte aligned, as a TMA copy needs."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    # One symbol per size (a repeated symbol would make TVM-FFI require equal sizes).
    rows = 2 if varlen else 3
    div = STATS_ROW_MULTIPLE if padded else 1
    stride = (cute.sym_int64(divisibility=div),
              *(cute.sym_int32(divisibility=div) for _ in range(rows - 2)), 1)
    return make_fake_tensor(cutlass.Float32, tuple(cute.sym_int() for _ in range(rows)),
                            stride=stride, assumed_align=4 * div)


def _fake_scratch():
    import cutlass

    return _fake_vector(cutlass.Float32, 16)


def _fake_cu_seqlens():
    import cutlass

    return _fake_vector(cutlass.Int32, 4)


def _fake_vector(dtype, align: int):
    """A symbolic contiguous 1-D tensor of ``dtype`` whose base is ``align``-byte aligned."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    return make_fake_tensor(dtype, (cute.sym_int(),), stride=(1,), assumed_align=align)


def fake_backward_args(spec: BackwardSpec) -> BackwardArgs:
    """Compile-time stand-ins for a backward launch's arguments under ``spec``."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    elem = _element_type(spec.dtype)
    tiles = [_fake_rows_tensor(elem, spec.head_dim, spec.varlen) for _ in range(4)]
    dq_accum = _fake_rows_tensor(cutlass.Float32, spec.head_dim, spec.varlen)
    grads = [_fake_rows_tensor(elem, spec.head_dim, spec.varlen) for _ in range(2)]
    cu_q = cu_k = None
    if spec.varlen:
        cu_q, cu_k = _fake_cu_seqlens(), _fake_cu_seqlens()
    semaphores = None
    if spec.deterministic:
        semaphores = make_fake_tensor(cutlass.Int32, (cute.sym_int(),), stride=(1,),
                                      assumed_align=4)
    return BackwardArgs(*tiles, _fake_row_stats(spec.varlen, padded=True),
                        _fake_row_stats(spec.varlen, padded=True),
                        dq_accum, *grads, cu_q, cu_k, cutlass.Float32(1.0), cutlass.Int32(0),
                        cutlass.Int32(0), cutlass.Int32(1), semaphores)


def encode_window(window: tuple[int, int]) -> tuple[int, int]:
    """flash_attn's ``(left, right)`` (-1 unbounded) as the kernels take it."""
    left, right = window
    return (UNBOUNDED_SIDE if left < 0 else left, UNBOUNDED_SIDE if right < 0 else right)
