"""GPU smoke tests of the measuring commands: they run and write table, JSON and PNG."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app

pytestmark = pytest.mark.gpu


def test_bench_quick_writes_table_json_png(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "sdpa_flash" in result.output and "attnlab" in result.output
    payload = json.loads((tmp_path / "bench.json").read_text())
    impls = {r["impl"] for r in payload["results"]}
    assert {"attnlab", "sdpa_flash"} <= impls
    assert all(r["timing"]["runs"] >= 20 for r in payload["results"] if r["timing"])
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
