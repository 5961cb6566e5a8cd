"""The occupancy calculator against the seeds' known cases (seed 003's register/smem table,
seed 004's GA104 cliffs) and the CUDA rules it encodes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnlab import ladder
from attnlab.analysis import occupancy as occ
from attnlab.analysis.occupancy import GPU_SPECS, get_spec, occupancy
from attnlab.analysis.resources import kernel_resources
from attnlab.compile import compile_config

KIB = 1024
THREADS = 128  # four warps, as in every seed kernel below


@pytest.mark.parametrize(("gpu", "regs", "smem_kib", "warps"), [
    # Seed 003, "Registers per Thread / SMEM per CTA / Warps per SM".
    ("RTX3090", 229, 48, 8),   # (64, 64, 4)
    ("RTX3090", 168, 32, 12),  # (64, 32, 4)
    ("RTX3090", 255, 48, 8),   # (128, 32, 4)
    ("RTX3090", 255, 64, 4),   # (128, 64, 4) on the RTX 3090 ...
    ("A100", 255, 64, 8),      # ... and on the A100
])
def test_seed_003_table(gpu, regs, smem_kib, warps):
    result = occupancy(get_spec(gpu), THREADS, regs, smem_kib * KIB)
    assert result.warps_per_sm == warps
    assert result.ctas_per_sm == warps // 4


def test_seed_003_first_row_is_register_bound():
    """229 registers: 7424 per warp, two warps per register-file partition, 8 warps. (The
    48 KiB of shared memory happens to allow two CTAs as well.)"""
    result = occupancy(get_spec("RTX 3090"), THREADS, 229, 48 * KIB)
    assert "registers" in result.limited_by
    assert result.limits["registers"] == 2
    registers = result.cliffs[0]
    assert registers.resource == "registers" and registers.gain == 168  # seed 003's row 2
    assert "shared memory" in registers.also


def test_128_64_4_is_smem_bound_on_the_rtx_3090_only():
    args = (THREADS, 255, 64 * KIB)
    assert occupancy(get_spec("RTX3090"), *args).limited_by == ("shared_memory",)
    assert occupancy(get_spec("A100"), *args).limits["shared_memory"] == 2


@pytest.mark.parametrize(("smem_kib", "ctas"), [
    (48, 2),   # seed 004 Observation 3: 100 KB / 48 KB = 2 blocks
    (45, 2),   # Observation W: 40 -> 45 KB, "still under the 50 KB cliff"
    (49, 2),   # the last size that fits twice: 2 x (49 + 1 reserved) = 100 KiB
    (50, 1),
    (52, 1),   # "52 KB -> 1 block"
    (56, 1),   # "confirmed: 48 KB -> 2 blocks, 56 KB -> 1 block"
    (32, 3),   # Observation O: "3 x 32.0 KB = 96 KB fits"
    (33, 2),   # "3 x 33.0 KB = 99 KB rounds to over" (with the reservation: 102 KiB)
])
def test_ga104_shared_memory_cliffs(smem_kib, ctas):
    result = occupancy(get_spec("GA104"), THREADS, 64, smem_kib * KIB)
    assert result.ctas_per_sm == ctas
    assert result.limited_by == ("shared_memory",)


def test_ga104_next_cliff_is_the_50_kb_cliff():
    result = occupancy(get_spec("RTX 3070 Ti"), THREADS, 64, 48 * KIB)
    smem = result.cliffs[1]
    assert smem.resource == "shared memory"
    assert smem.loss == 49 * KIB  # one byte more and the second CTA is gone
    assert smem.gain == 100 * KIB // 3 // 128 * 128 - KIB  # three CTAs
    assert "49 KiB" in result.next_cliff and "-> 1 CTAs/SM" in result.next_cliff
    assert result.cliffs[0].gain is None and result.cliffs[0].loss is None  # regs not in the way


def test_register_cliffs_on_h100():
    result = occupancy(get_spec("H100"), THREADS, 168, 48 * KIB)
    assert (result.ctas_per_sm, result.limited_by) == (3, ("registers",))
    registers = result.cliffs[0]
    assert (registers.gain, registers.loss, registers.also) == (128, 168, ())
    assert occupancy(get_spec("H100"), THREADS, registers.gain, 48 * KIB).ctas_per_sm == 4
    assert occupancy(get_spec("H100"), THREADS, registers.loss + 1, 48 * KIB).ctas_per_sm == 2


@pytest.mark.parametrize(("threads", "regs", "smem", "binding"), [
    (2048, 32, 0, "warps"),               # more threads than a CTA may have
    (128, 256, 0, "registers"),           # more registers than a thread may have
    (1024, 128, 0, "registers"),          # 1024 x 128 > 64 K registers per CTA
    (128, 32, 228 * KIB, "shared_memory"),  # over the per-CTA opt-in maximum
])
def test_kernels_that_cannot_launch(threads, regs, smem, binding):
    result = occupancy(get_spec("H100"), threads, regs, smem)
    assert result.ctas_per_sm == 0 and binding in result.limited_by


def test_cta_slots_and_warps_bind_small_kernels():
    tiny = occupancy(get_spec("H100"), 32, 16, 0)
    assert (tiny.ctas_per_sm, tiny.limited_by) == (32, ("cta_slots",))
    wide = occupancy(get_spec("A100"), 1024, 16, 0)
    assert (wide.ctas_per_sm, wide.warps_per_sm, wide.limited_by) == (2, 64, ("warps",))
    assert wide.occupancy_pct == 100.0


@given(threads=st.sampled_from([32, 64, 128, 256, 512]), regs=st.integers(1, 254),
       smem=st.integers(0, 200 * KIB))
def test_more_resources_never_fit_more_ctas(threads, regs, smem):
    spec = GPU_SPECS["H100"]
    here = occupancy(spec, threads, regs, smem).ctas_per_sm
    assert occupancy(spec, threads, regs + 1, smem).ctas_per_sm <= here
    assert occupancy(spec, threads, regs, smem + 128).ctas_per_sm <= here


def test_get_spec_names():
    assert get_spec("rtx-3090") is GPU_SPECS["RTX3090"]
    assert get_spec("ga104") is GPU_SPECS["RTX3070Ti"]
    assert get_spec("H200").smem_per_sm == 228 * KIB
    assert GPU_SPECS["A100"].max_warps_per_sm == 64 and GPU_SPECS["RTX3090"].max_warps_per_sm == 48
    with pytest.raises(KeyError, match="unknown GPU 'B200'"):
        get_spec("B200")


A100_PROPERTIES = SimpleNamespace(
    name="NVIDIA A100-SXM4-80GB", major=8, minor=0, multi_processor_count=108,
    max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
    shared_memory_per_multiprocessor=167936, shared_memory_per_block_optin=166912)


def test_spec_from_torch_properties_matches_the_table():
    spec = occ.spec_from_properties(A100_PROPERTIES)
    table = GPU_SPECS["A100"]
    assert spec.arch == "sm_80" and spec.name == A100_PROPERTIES.name
    assert {k: v for k, v in spec.to_dict().items() if k != "name"} == \
           {k: v for k, v in table.to_dict().items() if k != "name"}


def test_current_device_spec(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert occ.current_device_spec() is None
    with pytest.raises(KeyError, match="no CUDA GPU"):
        get_spec("current")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: A100_PROPERTIES)
    assert get_spec("current").smem_per_cta_optin == 163 * KIB


def test_kernel_resources_leave_the_reserved_window_to_the_model(tmp_path_factory):
    """sm_90 cubins carry the driver's 1 KiB reserved window in cuobjdump's SHARED; the driver
    does not count it as static shared memory and neither do we (the model adds it per CTA)."""
    artifact_dir = tmp_path_factory.getbasetemp() / "attnlab-artifacts"
    artifact_dir.mkdir(exist_ok=True)
    hopper = kernel_resources(compile_config(ladder.k02, "sm_90a", head_dim=64,
                                             out_dir=artifact_dir))
    assert (hopper.static_shared_bytes, hopper.reserved_shared_bytes) == (0, KIB)
    assert hopper.shared_bytes == hopper.dynamic_shared_bytes == ladder.k02.smem_bytes(64)
    ampere = kernel_resources(compile_config(ladder.k02, "sm_80", head_dim=64,
                                             out_dir=artifact_dir))
    assert (ampere.static_shared_bytes, ampere.reserved_shared_bytes) == (0, 0)
