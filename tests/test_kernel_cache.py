"""The compiled-kernel cache (kernel_cache.py) on CPU: CuTe DSL 4.8 compiles and exports
without a GPU, and TVM-FFI loads the exported library without one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnlab import kernel_cache, ladder
from attnlab.kernels.abi import ForwardSpec

#: A small kernel (kernel 2 at hd64) that compiles in a few seconds.
SPEC = ForwardSpec(ladder.k02, "sm_80", "bfloat16", 64)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(kernel_cache.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(kernel_cache.DISK_CACHE_ENV, "1")
    kernel_cache.clear_memory()
    yield tmp_path
    kernel_cache.clear_memory()


def _load_in_fresh_process(spec: ForwardSpec, cache_root) -> dict:
    """``kernel_cache.get`` in a new interpreter: what it returned, and whether it imported
    the CuTe DSL."""
    code = (
        "import json, sys\n"
        "from attnlab import kernel_cache\n"
        "from attnlab.kernels.abi import ForwardSpec\n"
        f"spec = ForwardSpec.from_dict(json.loads({json.dumps(json.dumps(spec.to_dict()))}))\n"
        "kernel = kernel_cache.get(spec)\n"
        "print(json.dumps({'compile_seconds': kernel.compile_seconds, "
        "'registers': kernel.registers, 'callable': callable(kernel.fn), "
        "'cutlass': 'cutlass' in sys.modules}))\n"
    )
    env = {kernel_cache.CACHE_DIR_ENV: str(cache_root), kernel_cache.DISK_CACHE_ENV: "1"}
    import os

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, **env})
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_compiled_kernel_is_published_and_loads_without_the_dsl(cache_dir, caplog):
    with caplog.at_level("INFO", logger="attnlab"):
        kernel = kernel_cache.get(SPEC)
    assert kernel.compile_seconds > 0 and kernel.registers > 0
    assert [r.message for r in caplog.records if "compiled" in r.message]  # logged once
    assert kernel_cache.get(SPEC) is kernel  # memory first
    (entry,) = kernel_cache.entries()
    assert entry.spec == SPEC and entry.current and entry.registers == kernel.registers
    folder = kernel_cache.cache_dir()
    assert folder.parent == cache_dir
    suffixes = {p.suffix for p in folder.iterdir()}
    assert {".o", ".json"} <= suffixes
    loaded = _load_in_fresh_process(SPEC, cache_dir)
    assert loaded["compile_seconds"] is None and loaded["callable"]
    assert loaded["registers"] == kernel.registers
    if ".so" in suffixes:  # linked (a C compiler was found): loading needs no CuTe DSL
        assert not loaded["cutlass"]


def test_concurrent_processes_compile_a_spec_once(cache_dir):
    """Two processes asking for the same kernel at once: one compiles, the other waits on the
    entry's lock and loads what the first published."""
    seconds = []
    kernel_cache.warm([SPEC, SPEC], jobs=2, on_done=lambda spec, s: seconds.append(s))
    assert sorted(s is None for s in seconds) == [False, True]
    assert len(kernel_cache.entries()) == 1


def test_a_damaged_entry_is_compiled_again(cache_dir):
    kernel_cache.get(SPEC)
    kernel_cache.clear_memory()
    for path in kernel_cache.cache_dir().iterdir():
        if path.suffix in (".so", ".o"):
            path.write_bytes(b"truncated")
    kernel = kernel_cache.get(SPEC)
    assert kernel.compile_seconds is not None  # recompiled, and the entry replaced
    assert _load_in_fresh_process(SPEC, cache_dir)["compile_seconds"] is None


def test_disk_cache_can_be_turned_off(cache_dir, monkeypatch):
    monkeypatch.setenv(kernel_cache.DISK_CACHE_ENV, "0")
    assert kernel_cache.get(SPEC).compile_seconds is not None
    assert kernel_cache.entries() == []


def test_clear_removes_every_entry(cache_dir):
    kernel_cache.get(SPEC)
    (cache_dir / "0000stale").mkdir()  # another installation's folder
    assert kernel_cache.clear() == 1
    assert kernel_cache.entries() == [] and not any(cache_dir.iterdir())


def test_digest_covers_every_field_of_the_spec():
    variants = [SPEC, SPEC.replace(arch="sm_90a"), SPEC.replace(dtype="float16"),
                SPEC.replace(head_dim=128), SPEC.replace(windowed=True),
                SPEC.replace(varlen=True), SPEC.replace(with_lse=False),
                SPEC.replace(config=ladder.k03)]
    assert len({kernel_cache.spec_digest(s) for s in variants}) == len(variants)
    assert kernel_cache.spec_digest(SPEC) == kernel_cache.spec_digest(
        ForwardSpec.from_dict(SPEC.to_dict()))


def test_cache_command_shows_and_clears(cache_dir):
    from typer.testing import CliRunner

    from attnlab.cli import app

    kernel_cache.get(SPEC)
    shown = CliRunner().invoke(app, ["cache", "--show"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "this one" in shown.output and "hd64" in shown.output
    cleared = CliRunner().invoke(app, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed 1 kernels" in cleared.output
    assert kernel_cache.entries() == []
