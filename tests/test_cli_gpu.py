"""GPU smoke tests of the measuring commands: they run and write table, JSON and PNG."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app

pytestmark = pytest.mark.gpu


def test_bench_quick_writes_table_json_png(tmp_path, wide_console):
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "sdpa_flash" in result.output and "attnlab" in result.output, result.output
    payload = json.loads((tmp_path / "bench.json").read_text())
    impls = {r["impl"] for r in payload["results"]}
    assert {"attnlab", "sdpa_flash"} <= impls, result.output
    short = [(r["impl"], r["timing"]["runs"]) for r in payload["results"]
             if r["timing"] and r["timing"]["runs"] < 20]
    assert not short, short
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_window_times_attnlab_and_fa4_without_torch_sdpa(tmp_path, wide_console):
    """``--window``: every point takes the sliding window; torch SDPA, which has none, is left
    out; its FLOPs are the window's pairs."""
    from attnlab.bench.timing import window_pairs

    result = CliRunner().invoke(app, ["bench", "--window", "64,0", "--seqlens", "1024",
                                      "--head-dims", "64", "--dtypes", "bf16", "--runs", "20",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "window (64, 0)" in result.output, result.output
    payload = json.loads((tmp_path / "bench.json").read_text())
    rows = {r["impl"]: r for r in payload["results"]}
    assert "attnlab" in rows and not any(name.startswith("sdpa_") for name in rows), rows
    for row in rows.values():
        assert row["point"]["window"] == [64, 0] and row["tflops"] > 0, row["error"]
    point, timing = rows["attnlab"]["point"], rows["attnlab"]["timing"]
    flops = 4.0 * point["batch"] * point["heads"] * 64 * window_pairs(1024, 1024, (64, 0))
    assert rows["attnlab"]["tflops"] == pytest.approx(flops / timing["median_ms"] / 1e9)


def test_bench_backward_times_training_of_attnlab_and_its_peers(tmp_path, wide_console):
    """``--backward``: forward + backward and the backward alone per point, attnlab and the
    peers timed."""
    result = CliRunner().invoke(app, ["bench", "--backward", "--seqlens", "1024",
                                      "--head-dims", "64", "--dtypes", "bf16", "--mode",
                                      "causal", "--runs", "20", "--impls", "attnlab,sdpa_cudnn",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "bench.json").read_text())
    rows = {(r["point"]["work"], r["impl"]): r for r in payload["results"]}
    for work in ("forward+backward", "backward"):
        for impl in ("sdpa_flash", "attnlab"):
            assert rows[work, impl]["tflops"] > 0, rows[work, impl]["error"]
    # The backward alone does 2.5 of the 3.5 forwards' worth of work: it takes less time.
    for impl in ("sdpa_flash", "attnlab"):
        assert (rows["backward", impl]["timing"]["median_ms"]
                < rows["forward+backward", impl]["timing"]["median_ms"])


def test_profile_reads_counters_for_ours_and_the_reference():
    from attnlab.analysis.ncu import profile

    target = ["--config", "k07", "--shape", "2,1024,1024,8,128"]
    for impl in ("attnlab", "sdpa_flash"):
        result = profile(impl, target)
        assert result.metrics["duration_ns"] > 0
        assert result.metrics["wavefronts_ld"] > 0
        opcodes = result.metrics["per_opcode_with_modifier"]
        assert isinstance(opcodes, dict) and any(op.startswith("HMMA") for op in opcodes)


def test_patch_times_edited_kernels_against_the_original(tmp_path, wide_console):
    """``attnlab patch``: the original, an edit that matches nothing (the same binary: its
    output identical) and seed 004's HMMA edit for this GPU (S08 -> S04 on sm_80, S06 ->
    S03 on sm_90a), each timed, output compared."""
    import torch

    from attnlab import device
    from attnlab.analysis.cubin_patch import SEED_HMMA_EDIT

    seed_edit = SEED_HMMA_EDIT.get(device.info(torch.device("cuda")).arch, "HMMA:8:4")
    result = CliRunner().invoke(app, ["patch", "k16", "--edit", "HMMA:15:1", "--edit",
                                      seed_edit, "--shape", "2,1024,1024,8,128",
                                      "--runs", "10", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    payload = json.loads(next(tmp_path.glob("patch_k16_*.json")).read_text())
    rows = {r["variant"]: r for r in payload["results"]}
    assert list(rows) == ["original", "HMMA:15:1", seed_edit]
    assert rows["HMMA:15:1"]["changed"] == 0 and rows["HMMA:15:1"]["identical"]
    assert rows[seed_edit]["changed"] > 0
    assert all(r["median_ms"] > 0 and r["ci_ms"][0] <= r["median_ms"] <= r["ci_ms"][1]
               for r in rows.values())


def test_study_cymatic_times_both_layouts(tmp_path):
    """``attnlab study cymatic`` on a small grid: every trace timed through both address maps,
    and the gather kernel's sum equal to torch's on the same trace."""
    import numpy as np
    import torch

    from attnlab import device
    from attnlab.kernels.common.gather import THREADS, compile_gather
    from attnlab.studies import cymatic

    result = CliRunner().invoke(app, ["study", "cymatic", "--grids", "256", "--modes", "6x4",
                                      "--runs", "3", "--fa", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "cymatic.json").read_text())
    assert len(rows) == 15 + 3 and all(r["row_ms"] > 0 and r["cymatic_ms"] > 0 for r in rows)
    assert (tmp_path / "cymatic.png").stat().st_size > 0
    gather = compile_gather(device.info(torch.device("cuda")).arch)
    data = torch.randn(51468, device="cuda")
    cells = cymatic.traces(256)["radial_mid_pi6"]
    index = torch.from_numpy(cymatic.cymatic_addresses(256, 6, 4).ravel()[cells]
                             .astype(np.int32)).cuda()
    out = torch.full((4 * THREADS,), float("nan"), device="cuda")
    gather(data, index, out)
    assert torch.allclose(out.sum(), data[index.long()].sum(), rtol=1e-4)
