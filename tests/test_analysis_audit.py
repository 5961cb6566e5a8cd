"""The static audit (seed 004's Observations AA and CC) on CPU: the inventory, one kernel's
counts, the family summary, and the command on a two-kernel inventory."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnlab.analysis import audit
from attnlab.cli import app
from attnlab.kernels.abi import BackwardSpec, ForwardSpec, PreprocessSpec


def test_the_inventory_holds_every_family_attnlab_builds():
    for arch in ("sm_80", "sm_90a"):
        families = audit.inventory(arch)
        assert list(families) == ["forward ladder", "forward defaults", "backward",
                                  "backward preprocess", "decode", "gemm", "gemm ladder",
                                  "conv"]
        # The TMA implicit GEMM (its five tiles and a 1 x 1 stride 2) only on sm_90a; the
        # mma.sync one, GroupNorm's two stages at six widths and the direct conv everywhere.
        assert len(families["conv"]) == (6 if arch == "sm_90a" else 0) + 1 + 12 + 1
        # The lab's nine mma.sync steps (g01-g08 with g07x) on every arch; the sm_90a GEMM
        # kernels only there.
        assert len(families["gemm ladder"]) == 9
        assert bool(families["gemm"]) == (arch == "sm_90a")
        # Each of six head dims' decoding variants (contiguous / paged x whole / split merged
        # by the combine / split merged serially, and on sm_90a merged in clusters of two)
        # and its combine.
        assert len(families["decode"]) == 6 * (7 + 2 * (arch == "sm_90a"))
        assert all(v for name, v in families.items() if name != "gemm" or arch == "sm_90a")
        assert all(isinstance(s, ForwardSpec) for s in families["forward defaults"].values())
        assert all(isinstance(s, BackwardSpec) for s in families["backward"].values())
        assert all(isinstance(s, PreprocessSpec)
                   for s in families["backward preprocess"].values())
        assert all(s.arch == arch for f in families.values() for s in f.values())
    # The Hopper steps only where they run.
    assert "wgmma hd128" in audit.inventory("sm_90a")["forward ladder"]
    assert "wgmma hd128" not in audit.inventory("sm_80")["forward ladder"]


@pytest.fixture(scope="module")
def two_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("audit")
    families = audit.inventory("sm_80")
    spec = next(iter(families["backward preprocess"].values()))
    ladder_label, ladder_spec = next(iter(families["forward ladder"].items()))
    return [audit.audit_kernel("backward preprocess", "pre", spec, folder),
            audit.audit_kernel("forward ladder", ladder_label, ladder_spec, folder)]


def test_one_kernel_is_counted_and_families_summarised(two_rows, tmp_path):
    pre, forward = two_rows
    assert pre.instructions > 0 and 0 < pre.registers <= 255 and pre.spill_stores == 0
    assert forward.useful_pct > pre.useful_pct > 0  # HMMA-dense against a memory pass
    summaries = audit.summarize(two_rows)
    assert [s.family for s in summaries] == ["backward preprocess", "forward ladder"]
    assert summaries[1].useful_pct_max == forward.useful_pct and summaries[0].kernels == 1
    assert audit.plot(two_rows, tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_audit_command_writes_table_json_and_png(monkeypatch, tmp_path):
    real = audit.inventory
    monkeypatch.setattr(audit, "inventory", lambda arch: {
        "backward preprocess": dict(list(real(arch)["backward preprocess"].items())[:2])})
    result = CliRunner().invoke(app, ["audit", "--arch", "sm_80", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "audit_sm_80.json").read_text())
    assert len(payload["kernels"]) == 2 and payload["families"][0]["kernels"] == 2
    assert (tmp_path / "audit_sm_80.png").read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["audit", "--family", "conv", "--out", str(tmp_path)])
    assert bad.exit_code == 2
