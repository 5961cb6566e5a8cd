"""The front-end study on CPU (issue 24): the CuTe DSL and nvcc builds of each kernel, their
SASS counts and registers, the table's JSON and plot. Triton and the timed run need a GPU."""

from __future__ import annotations

import json
import shutil

import pytest

from attnlab.studies import frontends


@pytest.fixture(scope="module")
def rows():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here")
    return frontends.run("sm_80", on_gpu=False)


def test_every_kernel_builds_from_both_front_ends_with_its_sass_counted(rows):
    assert [(r["kernel"], r["frontend"]) for r in rows] == [
        (k, f) for k in frontends.KERNELS for f in ("cute", "nvcc")]
    for r in rows:
        assert r["error"] is None and r["instructions"] > 0 and r["registers"] > 0, r
        assert r["spill_stores"] == 0 and r["build_s"] > 0
    by = {(r["kernel"], r["frontend"]): r for r in rows}
    # The add: two loads and a store from both; the HGEMM tile: 2 x 4 WMMA tiles of two
    # k16 steps, the same 32 HMMAs (m16n8k16) from both front-ends.
    for frontend in ("cute", "nvcc"):
        assert by["vector_add", frontend]["groups"]["global memory"] == 3
        assert by["hgemm_tile", frontend]["groups"]["tensor"] == 32
        assert "tensor" not in by["gather_sum", frontend]["groups"]
    # The attention tile: S and P V per 64-key block, 2 x 32 HMMAs a loop body; the CuTe DSL
    # kernel (the ladder's k02) has a second, masked body for a ragged last block.
    assert by["attention_tile", "nvcc"]["groups"]["tensor"] == 64
    assert by["attention_tile", "cute"]["groups"]["tensor"] == 128


def test_the_study_command_writes_its_table_json_and_plot(rows, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from attnlab.cli import app

    monkeypatch.setattr(frontends, "run", lambda arch, gpu, runs, on_step: rows)
    result = CliRunner().invoke(app, ["study", "frontends", "--arch", "sm_80", "--out",
                                      str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "frontends_sm_80.json").read_text()) == rows
    assert (tmp_path / "frontends_sm_80.png").stat().st_size > 0


@pytest.mark.gpu
def test_the_timed_run_checks_every_front_ends_output_against_the_cute_dsl():
    """On a GPU: Triton joins, every build is timed and its output compared with the CuTe
    DSL's (the add exactly; the sums within reordering error)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from attnlab import device

    arch = device.info(torch.device("cuda")).arch
    rows = frontends.run(arch, on_gpu=True, runs=5)
    bound = {"vector_add": 0.0, "gather_sum": 1e-3, "hgemm_tile": 5e-2, "attention_tile": 2e-2}
    for r in rows:
        if r["frontend"] == "triton" and r.get("error"):
            continue  # Triton not installed here
        assert r["ms"] > 0 and r["rate"] > 0, r
        assert r["max_abs_diff"] is not None and r["max_abs_diff"] <= bound[r["kernel"]], r
