"""``attnlab bench|ladder|tune``: help, argument errors and the GPU-less paths."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.tune.cache import TuneCache, TuneKey

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide(wide_console):
    """Every command's table with whole cells (``conftest.wide_console``)."""


@pytest.mark.parametrize("command", ["bench", "ladder", "tune"])
def test_help(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "--seqlens" in result.output


@pytest.mark.parametrize("args,message", [
    (["bench", "--seqlens", "512,x"], "comma-separated integers"),
    (["bench", "--seqlens", "0"], "positive integers"),
    (["bench", "--dtypes", "fp8"], "unknown dtype 'fp8'"),
    (["bench", "--mode", "diagonal"], "expected one of full, causal, both"),
    (["bench", "--gqa", "0"], "greater than or equal to 1"),
    (["bench", "--window", "512"], "expected LEFT,RIGHT"),
    (["bench", "--window", "-1,-1"], "one is bounded"),
    (["bench", "--window", "-2,0"], "-1 (unbounded) or a key count"),
    (["bench", "--window", "64,0", "--host"], "--decode and --host time other problems"),
    (["bench", "--window", "64,0", "--decode"], "--decode and --host time other problems"),
    (["bench", "--window", "64,0", "--mode", "full"], "replaces --mode"),
    (["bench", "--impls", "sdpa_flash,nope"], "unknown ['nope']"),
    (["bench", "--config", "k99"], "neither a ladder config"),
    (["bench", "--runs", "5"], "greater than or equal to 20"),
    (["ladder", "--anchor", "4000"], "4000 is not one of --seqlens"),
    (["ladder", "--family", "sm70"], "not one of seeds, sm90"),
    (["tune", "--dtype", "int8"], "unknown dtype"),
])
def test_argument_errors(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command", [["bench", "--quick"], ["ladder"], ["tune"]])
def test_timing_commands_need_a_gpu(command):
    result = runner.invoke(app, command)
    assert result.exit_code == 2
    assert "needs a CUDA GPU" in result.output


def test_tune_show_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_TUNE_CACHE", str(tmp_path / "tune.json"))
    cache = TuneCache()
    from attnlab import ladder

    cache.put(TuneKey("NVIDIA H200", "90", "bfloat16", 128, False, 4096), ladder.k06,
              best_ms=1.25, default_ms=1.5)
    cache.save()
    shown = runner.invoke(app, ["tune", "--show"])
    assert shown.exit_code == 0
    assert "NVIDIA H200" in shown.output and "1.250" in shown.output
    cleared = runner.invoke(app, ["tune", "--clear"])
    assert cleared.exit_code == 0 and "removed 1 entries" in cleared.output
    assert "empty" in runner.invoke(app, ["tune", "--show"]).output


def test_bench_decode_reports_a_skipped_point_once_and_the_rest(tmp_path, monkeypatch):
    """The decode report on stand-in results: a point whose inputs did not fit shows as
    dashes and one line with the reason; a measured point shows GB/s, the roof share, the
    ratio to FA2 and paged over contiguous; both reach the JSON."""
    from attnlab import device
    from attnlab.bench import baselines, ceilings
    from attnlab.bench import decode as decode_bench
    from attnlab.bench.runner import Result
    from attnlab.bench.timing import summarize
    from attnlab.cli import measure

    def fake_measure(points, peers, l2_bytes, runs, on_point):
        results = []
        for point in points:
            names = ["attnlab", "attnlab_paged", *peers]
            if point.batch == 64:
                results += [Result(point, name, None, error="skipped: too large")
                            for name in names]
            else:
                ms = decode_bench.kv_bytes(point) / 1e9  # the milliseconds of 1,000 GB/s
                results += [Result(point, name, summarize([ms]), device_timing=summarize([ms]))
                            for name in names]
            on_point(point)
        return results

    monkeypatch.setattr(measure, "require_gpu", lambda: None)
    monkeypatch.setattr(baselines, "available_peers", lambda: {"sdpa_flash": None})
    monkeypatch.setattr(ceilings, "dram_read_rate", lambda: 2000e9)
    monkeypatch.setattr(decode_bench, "measure_decode", fake_measure)
    monkeypatch.setattr(device, "info", lambda dev: type("Info", (), {"l2_bytes": 1})())
    result = runner.invoke(app, ["bench", "--decode", "--batches", "1,64", "--cache-lens", "4096",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.count("skipped: too large") == 2  # one line per skipped point
    assert "1000 (1000) 50% 1.00x" in result.output
    assert "1.000 (1.000)" in result.output  # paged / contiguous, end to end (device only)
    saved = json.loads((tmp_path / "decode.json").read_text())["results"]
    assert {r["error"] for r in saved} == {None, "skipped: too large"}
