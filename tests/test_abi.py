"""The launch ABI (kernels/abi.py): one argument list for compilation, launches and both kernel
classes; the spec that keys compiled kernels; 64-bit batch offsets in the compiled code."""

from __future__ import annotations

import inspect
import re

import pytest

from attnlab import ladder, policy
from attnlab.compile import compile_spec
from attnlab.config import FlashConfig
from attnlab.kernels.abi import (
    UNBOUNDED_SIDE,
    ForwardArgs,
    ForwardSpec,
    canonical_strides,
    encode_window,
    fake_forward_args,
)


@pytest.mark.parametrize("module", ["sm80", "sm90"])
def test_kernels_take_exactly_the_abi(module):
    """Both kernel classes' ``__call__`` take ForwardArgs' fields in order, then the stream:
    an argument added to one of them and not to the ABI fails here."""
    import importlib

    kernels = importlib.import_module(f"attnlab.kernels.{module}.forward")
    cls = kernels.FlashForwardSm80 if module == "sm80" else kernels.FlashForwardSm90
    params = list(inspect.signature(cls.__call__).parameters)
    assert params == ["self", *ForwardArgs._fields, "stream"]


def test_fake_args_leave_out_what_the_spec_compiles_out():
    import cutlass

    dense = fake_forward_args(ForwardSpec(ladder.k07, "sm_80", "bfloat16", 128))
    assert dense.lse is not None and dense.cu_seqlens_q is dense.num_ctas is None
    assert dense.q.element_type is cutlass.BFloat16
    assert len(dense.q.shape) == 4 and len(dense.lse.shape) == 3
    packed = fake_forward_args(ForwardSpec(ladder.k07, "sm_80", "float16", 64, varlen=True,
                                           with_lse=False))
    assert packed.lse is None and packed.cu_seqlens_q is not None
    assert len(packed.q.shape) == 3 and packed.q.element_type is cutlass.Float16
    persistent = fake_forward_args(ForwardSpec(ladder.LAB_VARIANTS["persistent"], "sm_80",
                                               "bfloat16", 128))
    assert persistent.num_ctas is not None and persistent.tile_counter is None
    dynamic = fake_forward_args(ForwardSpec(
        policy.default_for("sm_90a", 128, True).replace(dynamic_tiles=True), "sm_90a",
        "bfloat16", 128, windowed=True))
    assert dynamic.num_ctas is not None and dynamic.tile_counter.element_type is cutlass.Int32


def test_static_strides_are_compiled_in():
    """A static_strides spec gets the strides of contiguous tensors unless given others; the
    fake tensors then carry them as constants (TVM-FFI refuses other strides at launch)."""
    spec = ForwardSpec(ladder.k16, "sm_80", "bfloat16", 128)
    assert spec.strides == canonical_strides(128)
    args = fake_forward_args(spec.replace(strides=((1024, 128),) * 4))
    assert tuple(args.q.stride[1:]) == (1024, 128, 1)
    with pytest.raises(ValueError, match="static_strides"):
        ForwardSpec(ladder.k07, "sm_80", "bfloat16", 128, strides=((1024, 128),) * 4)


def test_spec_round_trips_and_rejects_bad_values():
    spec = ForwardSpec(ladder.k16, "sm_90a", "float16", 64, windowed=True, varlen=True,
                       with_lse=False)
    assert ForwardSpec.from_dict(spec.to_dict()) == spec
    assert spec.variant() == "_win_varlen_nolse"
    with pytest.raises(ValueError, match="dtype"):
        ForwardSpec(ladder.k07, "sm_80", "float32", 64)
    with pytest.raises(TypeError, match="FlashConfig"):
        ForwardSpec("k07", "sm_80", "bfloat16", 64)  # type: ignore[arg-type]


def test_encode_window():
    assert encode_window((-1, -1)) == (UNBOUNDED_SIDE, UNBOUNDED_SIDE)
    assert encode_window((-1, 0)) == (UNBOUNDED_SIDE, 0)
    assert encode_window((5, 7)) == (5, 7)


def _multiplies_64(ptx: str) -> int:
    """64-bit integer multiplies (and multiply-adds) in PTX."""
    return len(re.findall(r"\b(?:mul|mad)\.(?:wide\.[su]32|lo\.[su]64)\b", ptx))


@pytest.mark.parametrize("config", [ladder.k07, policy.default_for("sm_90a", 128)],
                         ids=["mma_sync", "wgmma"])
def test_batch_offsets_are_64_bit(config, tmp_path):
    """The batch stride is a 64-bit argument: the kernel scales it with a 64-bit multiply
    (a 32-bit one would wrap past 2**31 elements, the B=64 x 32k x 8 x 128 cache)."""
    art = compile_spec(ForwardSpec(config, "sm_90a", "bfloat16", 128), tmp_path)
    assert _multiplies_64(art.ptx.read_text()) > 0


def test_packed_sequence_start_is_a_64_bit_offset(tmp_path):
    """A packed sequence starts at cu_seqlens[b] rows: the (non-negative) start times the row
    stride is a widening 32 x 32 -> 64-bit multiply, which the dense kernel does not have."""
    def widening(varlen: bool) -> int:
        art = compile_spec(ForwardSpec(ladder.k07, "sm_80", "bfloat16", 64, varlen=varlen),
                           tmp_path)
        return len(re.findall(r"\bmul\.wide\.u32\b", art.ptx.read_text()))

    assert widening(varlen=False) == 0 < widening(varlen=True)


def test_spec_refuses_nothing_that_config_accepts():
    """Specs take any valid config: the config's own checks are the refusals."""
    spec = ForwardSpec(FlashConfig(), "sm_80", "bfloat16", 64)
    assert spec.strides is None and spec.with_lse
