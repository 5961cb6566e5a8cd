"""The convolution family's launch ABI (no CuTe DSL import): specs (the disk cache's keys)
and argument lists with their compile-time stand-ins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from attnlab.kernels.abi import FlatSpec, _element_type


@dataclass(frozen=True)
class GroupNormSiluSpec(FlatSpec):
    """GroupNorm followed by SiLU in one kernel (``kernels/conv/groupnorm.py``)."""

    KIND: ClassVar[str] = "groupnorm_silu"

    arch: str
    dtype: str

    @property
    def label(self) -> str:
        return "groupnorm_silu"


class GroupNormSiluArgs(NamedTuple):
    """``x`` and ``y``: ``[N, H W, C]`` (a channels-last image's view); ``weight``, ``bias``:
    fp32 ``[C]``; ``groups``: channel groups (C a multiple of it); ``eps``."""

    x: Any
    y: Any
    weight: Any
    bias: Any
    groups: Any
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

    return GroupNormSiluArgs(image(), image(), vector(), vector(), cutlass.Int32(32),
                             cutlass.Float32(1e-5))


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
