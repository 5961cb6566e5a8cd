"""The convolution family's launch ABI (no CuTe DSL import): specs (the disk cache's keys)
and argument lists with their compile-time stand-ins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from attnlab.config import ConfigError
from attnlab.gemm_config import GemmConfig, MmaGemmConfig
from attnlab.kernels.abi import FlatSpec, _element_type
from attnlab.kernels.gemm.abi import GEMM_ALIGN_BYTES, GemmSpec, fake_gemm_args


def output_size(size, kernel: int, stride: int, padding: int):
    """Output rows (or columns) of a convolution along one image axis (host ints or the
    DSL's integers)."""
    return (size + 2 * padding - kernel) // stride + 1


#: Widest channel group the GroupNorm kernels take (a thread's group row is unrolled).
MAX_GROUP_WIDTH = 64
#: Threads of a GroupNorm CTA (a chunk holds at least one pixel per thread).
GROUPNORM_THREADS = 128
#: The GroupNorm kernels' two stages: per-chunk statistics, then the merged ones applied
#: with SiLU.
GROUPNORM_STAGES = ("stats", "apply")


@dataclass(frozen=True)
class GroupNormSiluSpec(FlatSpec):
    """One stage of GroupNorm + SiLU (``kernels/conv/groupnorm.py``): ``group_width`` channels
    per group (compile time: a pixel's group row is unrolled), ``stage`` one of
    ``GROUPNORM_STAGES``."""

    KIND: ClassVar[str] = "groupnorm_silu"

    arch: str
    dtype: str
    group_width: int = 10
    stage: str = "apply"

    def __post_init__(self):
        if not 1 <= self.group_width <= MAX_GROUP_WIDTH:
            raise ConfigError(f"group_width must be in [1, {MAX_GROUP_WIDTH}], got "
                              f"{self.group_width}")
        if self.stage not in GROUPNORM_STAGES:
            raise ConfigError(f"stage must be one of {GROUPNORM_STAGES}, got {self.stage!r}")

    def variant(self) -> str:
        return f"_w{self.group_width}_{self.stage}"

    @property
    def label(self) -> str:
        return "groupnorm_silu"


class GroupNormSiluArgs(NamedTuple):
    """``x`` and ``y``: ``[N, H W, C]`` (a channels-last image's view); ``weight``, ``bias``:
    fp32 ``[C]``; ``partials``: fp32 ``[N groups, chunks, 2]``, each pixel chunk's mean and
    sum of squared deviations (written by ``stats``, read by ``apply``); ``chunk_pixels``:
    pixels per chunk (the grid is ``N groups x chunks``); ``eps``."""

    x: Any
    y: Any
    weight: Any
    bias: Any
    partials: Any
    chunk_pixels: Any
    eps: Any


def fake_groupnorm_args(spec: GroupNormSiluSpec) -> GroupNormSiluArgs:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    element = _element_type(spec.dtype)

    def image():
        return make_fake_tensor(element, (cute.sym_int(), cute.sym_int(), cute.sym_int()),
                                stride=(cute.sym_int64(), cute.sym_int32(), 1),
                                assumed_align=2)

    def vector():
        return make_fake_tensor(cutlass.Float32, (cute.sym_int(),), stride=(1,),
                                assumed_align=4)

    partials = make_fake_tensor(cutlass.Float32, (cute.sym_int(), cute.sym_int(), 2),
                                stride=(cute.sym_int32(), 2, 1), assumed_align=8)
    return GroupNormSiluArgs(image(), image(), vector(), vector(), partials,
                             cutlass.Int32(1), cutlass.Float32(1e-5))


@dataclass(frozen=True)
class DirectConvSpec(FlatSpec):
    """The lab's direct convolution (``kernels/conv/direct.py``): FFMA, one output a thread."""

    KIND: ClassVar[str] = "conv_direct"

    arch: str
    dtype: str

    @property
    def label(self) -> str:
        return "conv_direct"


class DirectConvArgs(NamedTuple):
    """``x [N, H, W, C]``, ``w [K, R, S, C]``, ``out [N, P, Q, K]`` (NHWC views, channels
    contiguous); the strides and paddings of the two image axes."""

    x: Any
    w: Any
    out: Any
    stride_h: Any
    stride_w: Any
    pad_h: Any
    pad_w: Any


def fake_direct_conv_args(spec: DirectConvSpec) -> DirectConvArgs:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    element = _element_type(spec.dtype)

    def nhwc():
        shape = (cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int())
        stride = (cute.sym_int64(), cute.sym_int32(), cute.sym_int32(), 1)
        return make_fake_tensor(element, shape, stride=stride, assumed_align=2)

    one = cutlass.Int32(1)
    return DirectConvArgs(nhwc(), nhwc(), nhwc(), one, one, one, one)


@dataclass(frozen=True)
class ImplicitConvSpec(FlatSpec):
    """The implicit-GEMM convolution (``kernels/conv/implicit.py``): the sm_90a HGEMM of a
    ``GemmConfig`` whose A tiles the TMA unit gathers from the image in its im2col mode, or
    the ``mma.sync`` HGEMM of an ``MmaGemmConfig`` whose threads gather them by ``cp.async``
    from per-row coordinate tables (the lab's Insight 9; no bias, no split, whole tiles).

    Attributes:
        config: the GEMM's tile and ring.
        arch, dtype: the target and the operands' (and output's) dtype.
        filter_r, filter_s: the filter's rows and columns.
        stride_h, stride_w, pad_h, pad_w: the convolution's strides and zero paddings.
        split: ``"none"``, ``"serial"`` split-K (partials in a workspace, the last slice
            of a tile sums them) or ``"cluster"`` (a tile's slices meet in a cluster's shared
            memory: ``GemmSpec``).
        bias: the epilogue adds a per-output-channel bias.
    """

    KIND: ClassVar[str] = "conv_implicit"

    config: GemmConfig | MmaGemmConfig
    arch: str
    dtype: str
    filter_r: int = 3
    filter_s: int = 3
    stride_h: int = 1
    stride_w: int = 1
    pad_h: int = 1
    pad_w: int = 1
    split: str = "none"
    bias: bool = False

    def __post_init__(self):
        if self.split not in ("none", "serial", "cluster"):
            raise ConfigError(f"the implicit convolution splits K in one kernel: split "
                              f"\"none\", \"serial\" or \"cluster\", got {self.split!r}")
        if isinstance(self.config, MmaGemmConfig) and (
                self.split != "none" or self.bias or not self.config.async_copy):
            raise ConfigError("the mma.sync implicit convolution gathers A by cp.async "
                              "(async_copy) and has no split-K or bias epilogue")

    def variant(self) -> str:
        return (f"_r{self.filter_r}s{self.filter_s}_u{self.stride_h}v{self.stride_w}"
                f"_p{self.pad_h}q{self.pad_w}{self.gemm.variant().removeprefix('_kk')}")

    @property
    def label(self) -> str:
        return f"conv_implicit({self.config.label()})"

    @property
    def gemm(self) -> GemmSpec:
        """The GEMM this convolution is: A ``[N P Q, R S C]`` row-major (gathered), B the
        filters ``[K, R S C]`` as a transposed weight, C ``[N P Q, K]`` (the NHWC output)."""
        return GemmSpec(self.config, self.arch, self.dtype, self.dtype, "k", "k", self.split,
                        bias=self.bias)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImplicitConvSpec:
        fields = {k: v for k, v in data.items() if k != "kind"}
        knobs = fields["config"]
        config_class = MmaGemmConfig if "warps_m" in knobs else GemmConfig
        return cls(**{**fields, "config": config_class(**knobs)})


def fake_implicit_conv_args(spec: ImplicitConvSpec):
    """Compile-time stand-ins: ``GemmArgs`` whose A is the NHWC image ``[N, H, W, C]``
    (channels contiguous, the other strides multiples of 16 bytes)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    div = GEMM_ALIGN_BYTES * 8 // _element_type(spec.dtype).width
    gemm = fake_gemm_args(spec.gemm)
    image = make_fake_tensor(
        _element_type(spec.dtype), (cute.sym_int(), cute.sym_int(), cute.sym_int(),
                                    cute.sym_int()),
        stride=(cute.sym_int64(divisibility=div), cute.sym_int32(divisibility=div),
                cute.sym_int32(divisibility=div), 1), assumed_align=GEMM_ALIGN_BYTES)
    return gemm._replace(a=image)
