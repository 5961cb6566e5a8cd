"""The control-code patcher on CPU: cross-compiled kernels, patched as a bare cubin and inside
the kernel cache's host object, re-read by nvdisasm, loaded from a patched copy; the A/B
command's checks (its timing runs on a GPU: tests/test_cli_gpu.py)."""

from __future__ import annotations

import statistics
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from attnlab import kernel_cache
from attnlab.analysis.control_codes import CONTROL_SHIFT, control_codes, decode
from attnlab.analysis.cubin_patch import (
    StallEdit,
    embedded_cubins,
    patch_stalls,
    stall_census,
    with_stall,
)
from attnlab.analysis.sass import disassemble, parse
from attnlab.bench.patch_ab import median_ci
from attnlab.cli import app
from attnlab.compile import compile_spec
from attnlab.config import FlashConfig
from attnlab.kernels.abi import ForwardSpec

SPEC = ForwardSpec(FlashConfig(), "sm_80", "bfloat16", 64, False, False)


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> bytes:
    return compile_spec(SPEC, tmp_path_factory.mktemp("cubin")).cubin.read_bytes()


def _lab_edit(blob: bytes) -> tuple[StallEdit, int]:
    """Seed 004's HMMA S08 -> S04 (or the most common HMMA stall, halved), and how many
    instructions it should touch."""
    census = stall_census(blob, "HMMA")
    stall = 8 if 8 in census else max(census, key=census.get)
    return StallEdit("HMMA", stall, max(stall // 2, 1)), census[stall]


def test_no_edit_gives_the_same_bytes(cubin):
    assert embedded_cubins(cubin) == [0]
    assert patch_stalls(cubin, []) == (cubin, 0)
    # An edit that matches nothing changes nothing either.
    assert patch_stalls(cubin, [StallEdit("NOSUCHOP", 8, 4)]) == (cubin, 0)


def test_an_edit_changes_only_the_stall_bits_of_its_instructions(cubin, tmp_path):
    edit, count = _lab_edit(cubin)
    stall, target = edit.from_stall, edit.to_stall
    patched, changed = patch_stalls(cubin, [edit])
    assert changed == count > 0
    assert len(patched) == len(cubin)
    census = stall_census(patched, "HMMA")
    assert census.get(stall, 0) == 0 and census[target] >= count
    # Byte by byte: every difference lies in the stall field of an instruction word.
    differing = {i // 16 * 16 for i in range(len(cubin)) if cubin[i] != patched[i]}
    for at in differing:
        before = struct.unpack_from("<QQ", cubin, at)
        after = struct.unpack_from("<QQ", patched, at)
        word_before = before[1] << 64 | before[0]
        word_after = after[1] << 64 | after[0]
        assert (word_before ^ word_after) & ~(0xF << CONTROL_SHIFT) == 0
        assert decode(word_after).stall == target
    # nvdisasm reads the same program: the plain text (no encodings) is unchanged.
    original, edited = tmp_path / "a.cubin", tmp_path / "b.cubin"
    original.write_bytes(cubin)
    edited.write_bytes(patched)
    assert ([(i.address, i.opcode, i.operands) for i in parse(disassemble(original))]
            == [(i.address, i.opcode, i.operands) for i in parse(disassemble(edited))])


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path) -> Path:
    """An empty disk cache, and no kernel of this process remembered."""
    monkeypatch.setenv(kernel_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_cache, "_memory", {})
    return tmp_path / "cache"


def test_the_kernel_caches_host_object_is_patched_in_place(fresh_cache):
    """The ``.so`` the runtime loads embeds the cubin uncompressed: the same edit applies
    there, so a patched copy loads as the original does."""
    kernel_cache.get(SPEC)
    shared = next(fresh_cache.rglob("*.so")).read_bytes()
    assert len(embedded_cubins(shared)) >= 1
    edit, count = _lab_edit(shared)
    patched, changed = patch_stalls(shared, [edit])
    assert changed == count > 0 and len(patched) == len(shared)
    assert stall_census(patched, "HMMA").get(edit.from_stall, 0) == 0


def test_an_edit_the_disassembler_rejects_is_refused(cubin):
    """sm_80's HMMA decodes only with stalls 1 to 11 (its stall bits are part of the
    opcode's extension table): S08 -> S00 is refused, not written."""
    with pytest.raises(ValueError, match="nvdisasm rejects"):
        patch_stalls(cubin, [StallEdit("HMMA", 8, 0)])


def test_edits_say_what_they_need():
    assert StallEdit.parse("hmma:8:4") == StallEdit("HMMA", 8, 4)
    with pytest.raises(ValueError, match="OPCODE:FROM:TO"):
        StallEdit.parse("HMMA-8-4")
    with pytest.raises(ValueError, match="stall count from 0 to 15"):
        StallEdit("HMMA", 8, 16)
    assert with_stall(0, 5) == 5 << CONTROL_SHIFT
    assert decode(with_stall((1 << 128) - 1, 3)).stall == 3


def test_the_cache_loads_a_patched_copy_and_keeps_its_own(fresh_cache, tmp_path):
    """``kernel_cache.load_patched``: the patch sees the exported binary, the copy loads, the
    cache's entry is untouched; a patch that changes the length is refused."""
    kernel_cache.get(SPEC)
    entry = next(fresh_cache.rglob("*.json"))
    binaries = sorted(entry.parent.glob(entry.stem + ".*o"))
    before = [b.read_bytes() for b in binaries]
    seen = []

    def lab_edit(binary: bytes) -> bytes:
        seen.append(binary)
        return patch_stalls(binary, [_lab_edit(binary)[0]])[0]

    kernel = kernel_cache.load_patched(SPEC, lab_edit, tmp_path / "patched")
    assert callable(kernel.fn) and kernel.spec == SPEC
    assert embedded_cubins(seen[0])
    copies = list((tmp_path / "patched").iterdir())
    assert len(copies) == 1 and copies[0].read_bytes() != seen[0]
    assert [b.read_bytes() for b in binaries] == before
    with pytest.raises(ValueError, match="length"):
        kernel_cache.load_patched(SPEC, lambda b: b + b"\0", tmp_path / "patched")


def test_patching_needs_the_disk_cache(monkeypatch):
    monkeypatch.setenv(kernel_cache.DISK_CACHE_ENV, "0")
    with pytest.raises(RuntimeError, match="disk cache"):
        kernel_cache.load_patched(SPEC, lambda b: b, Path("unused"))


@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=200))
def test_median_interval_brackets_the_median(samples):
    lo, hi = median_ci(samples)
    assert min(samples) <= lo <= statistics.median(samples) <= hi <= max(samples)


def test_patch_command_checks_its_edits_then_needs_a_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    runner = CliRunner()
    bad = runner.invoke(app, ["patch", "k16", "--edit", "HMMA-8-4"])
    assert bad.exit_code == 2 and "OPCODE:FROM:TO" in bad.output
    no_gpu = runner.invoke(app, ["patch", "k16", "--edit", "HMMA:8:4"])
    assert no_gpu.exit_code == 2 and "needs a CUDA GPU" in no_gpu.output


def test_the_lab_imma_edit_lands_on_nvccs_wmma_int8_tile(tmp_path):
    """The front-end study's s8 WMMA tile (nvcc) is the IMMA edit's subject: ptxas gives its
    back-to-back IMMAs 4 cycles; ``IMMA:4:2`` rewrites those and nothing else."""
    import shutil

    from attnlab.analysis.cubin_patch import SEED_IMMA_EDIT
    from attnlab.studies.frontends import build_nvcc

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here")
    build = build_nvcc("igemm_tile", "sm_90a", tmp_path)
    original = build.cubin.read_bytes()
    patched, changed = patch_stalls(original, [StallEdit.parse(SEED_IMMA_EDIT["sm_90a"])])
    assert changed == 31 and len(patched) == len(original)
    out = tmp_path / "patched.cubin"
    out.write_bytes(patched)

    def stalls(path):
        instructions = parse(disassemble(path, encodings=True))
        return Counter(cc.stall for i, cc in control_codes(instructions)
                       if i.opcode.startswith("IMMA"))

    assert stalls(build.cubin) == Counter({4: 31, 1: 1})
    assert stalls(out) == Counter({2: 31, 1: 1})


@pytest.mark.gpu
def test_the_cubin_ab_times_and_checks_an_edited_nvcc_kernel():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from attnlab.bench.patch_ab import run_cubin_ab

    results = run_cubin_ab("igemm_tile", {"none": [], "IMMA:4:2": [StallEdit(
        "IMMA", 4, 2)]}, runs=5, size=1024)
    assert [r.variant for r in results] == ["original", "none", "IMMA:4:2"]
    # No edit: the same binary, bitwise the same output (exact int32 sums).
    assert results[1].changed == 0 and results[1].identical
    assert results[2].changed > 0 and all(r.median_ms > 0 for r in results)
