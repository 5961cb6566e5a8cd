"""``attnlab sass``, ``attnlab banks``, ``attnlab occupancy`` through typer's test runner (no GPU:
the configs are cross-compiled)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    # Shared with the analysis tests' compile cache (same session folder).
    path = tmp_path_factory.getbasetemp() / "attnlab-artifacts"
    path.mkdir(exist_ok=True)
    return str(path)


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_help_lists_the_commands():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("sass", "banks", "occupancy"):
        assert command in result.output
    sass_help = invoke("sass", "--help")
    assert sass_help.exit_code == 0 and "--vs" in sass_help.output and "--controls" in \
        sass_help.output


def test_sass_vs(artifacts):
    result = invoke("sass", "k02", "--arch", "sm_80", "--vs", "k01", "--head-dim", "64",
                    "--artifacts", artifacts, "--gpu", "A100")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "static (build-time) counts" in out
    for heading in ("Instruction groups", "Seed evidence", "Largest opcode changes",
                    "Stall cycles per opcode", "Resources and occupancy (A100"):
        assert heading in out
    for row in ("LDSM address registers", "LDGSTS address registers", "copies feeding HMMA",
                "CS2R", "useful_pct", "HMMA -> HMMA cycles", "min 8", "CTAs/SM on A100"):
        assert row in out
    assert "next cliff (k02)" in out and "next cliff (k01)" in out
    assert "ratio" in out and "x │" in out


def test_sass_json_and_controls(artifacts):
    result = runner.invoke(app, ["sass", "k01", "--arch", "sm_80", "--head-dim", "64", "--json",
                                 "--controls", "--artifacts", artifacts])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["counts"] == "static (build-time)"
    (kernel,) = data["kernels"]
    assert kernel["label"] == "k01" and kernel["config"]["swizzle"] == "none"
    assert kernel["sass"]["opcodes"]["HMMA"] > 0
    assert kernel["resources"]["dynamic_shared_bytes"] == 3 * 64 * 64 * 2
    assert kernel["occupancy"]["gpu"] == "H100 SXM"
    controls = kernel["controls"]
    assert len(controls) == kernel["sass"]["instructions"]
    assert all(c["text"].startswith("[B") for c in controls)
    assert "diff" not in data


def test_sass_masked_builds_the_masked_kernel(artifacts):
    """``--masked``: the causal / sliding-window kernel, whose mask compares and selects the
    unmasked kernel does not have; refused for a GEMM config."""
    counts = {}
    for flags in ((), ("--masked",)):
        result = runner.invoke(app, ["sass", "k07", "--arch", "sm_80", "--head-dim", "64",
                                     "--json", "--artifacts", artifacts, *flags])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["masked"] == bool(flags)
        counts[bool(flags)] = data["kernels"][0]["sass"]["opcodes"]
    assert counts[True].get("FSEL", 0) > counts[False].get("FSEL", 0)
    assert sum(counts[True].values()) > sum(counts[False].values())
    refused = invoke("sass", "gemm", "--masked", "--artifacts", artifacts)
    assert refused.exit_code != 0 and "not an attention config" in refused.output


def test_sass_controls_listing(artifacts):
    result = invoke("sass", "k01", "--arch", "sm_80", "--head-dim", "64", "--controls",
                    "--artifacts", artifacts)
    assert result.exit_code == 0, result.output
    assert "Control codes of k01 (sm_80)" in result.output
    assert "[B------:R-:W-:-:S02]" in result.output and "HMMA.16816.F32.BF16" in result.output


def test_banks_vs():
    result = invoke("banks", "k01", "--vs", "k02")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "row-major, 256-byte rows" in out and "XOR swizzle" in out
    ldmatrix = next(line for line in out.splitlines() if "Q ldmatrix.x4" in line)
    assert "32 (4)" in ldmatrix and "8/8/8/8" in ldmatrix and "1/1/1/1" in ldmatrix
    assert "0.125x" in ldmatrix
    store = next(line for line in out.splitlines() if "O fragment" in line)
    assert "8 (1)" in store and "1 (1)" in store


def test_banks_json_and_config_file(tmp_path):
    path = tmp_path / "padded.json"
    path.write_text(json.dumps({"swizzle": "pad8", "async_copy": False,
                                "eager_kv_loads": False}))
    result = runner.invoke(app, ["banks", str(path), "--head-dim", "64", "--json"])
    assert result.exit_code == 0, result.output
    (kernel,) = json.loads(result.stdout)["kernels"]
    assert kernel["label"] == "padded"
    assert {a["max_ways"] for a in kernel["accesses"]} == {1}
    assert kernel["accesses"][0]["name"] == "Q st.shared (16 B)"


def test_occupancy(artifacts):
    result = invoke("occupancy", "k01", "--gpu", "RTX3090", "--gpu", "A100", "--arch", "sm_80",
                    "--head-dim", "64", "--artifacts", artifacts)
    assert result.exit_code == 0, result.output
    assert "RTX 3090" in result.output and "A100" in result.output
    assert "next cliff on RTX 3090" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (("sass", "k99"), "neither a ladder config"),
    (("banks", "nope.json"), "neither a ladder config"),
    (("banks", "k01", "--vs", "k42"), "k42"),
    (("banks", "k01", "--head-dim", "80"), "head_dim=80"),
    (("sass", "k01", "--arch", "sm_70"), "sm_70"),
    (("sass", "k01", "--dtype", "float32"), "float32"),
    (("sass", "k01", "--gpu", "B200"), "unknown GPU"),
    (("occupancy", "k01", "--gpu", "B200"), "unknown GPU"),
])
def test_argument_errors(args, message):
    result = invoke(*args)
    assert result.exit_code != 0
    assert message in result.output


def test_bad_config_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"block_m": 48}))
    result = invoke("banks", str(path))
    assert result.exit_code != 0 and "block_m" in result.output


def test_sass_and_occupancy_take_gemm_configs():
    """The explain tools on the GEMM kernel (issue 22): its SASS holds the wgmma (HGMMA /
    IGMMA) and TMA instructions, and its 384 threads and ~225 KiB fit one CTA per H100 SM."""
    result = runner.invoke(app, ["sass", "gemm", "--vs", "igemm", "--arch", "sm_90a",
                                 "--json"])
    assert result.exit_code == 0, result.output
    kernels = json.loads(result.output)["kernels"]
    opcodes = [set(k["sass"]["opcodes"]) for k in kernels]
    assert any(op.startswith("HGMMA") for op in opcodes[0])
    assert any(op.startswith("IGMMA") for op in opcodes[1])
    result = runner.invoke(app, ["occupancy", "gemm:128x128x64", "--gpu", "H100", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["ctas_per_sm"] == 1
    result = runner.invoke(app, ["sass", "gemm:128x256", "--arch", "sm_90a"])
    assert result.exit_code != 0 and "BMxBNxBK" in result.output


def test_sass_takes_the_implicit_gemm_convolution_and_refuses_its_other_steps():
    """``conv[:...]`` and the conv ladder's implicit steps compile the implicit-GEMM kernels
    (issue 23): A by the TMA unit's im2col mode, or (c03) by cp.async gathers from coordinate
    tables; the direct step has no config."""
    result = runner.invoke(app, ["sass", "conv:128x160x64", "--vs", "c04", "--arch", "sm_90a",
                                 "--json"])
    assert result.exit_code == 0, result.output
    for kernel in json.loads(result.output)["kernels"]:
        opcodes = set(kernel["sass"]["opcodes"])
        assert "UTMALDG" in opcodes and any(op.startswith("HGMMA") for op in opcodes), opcodes
    # c03, the coordinate tables on mma.sync: cp.async gathers feeding HMMAs, on sm_80 too.
    result = runner.invoke(app, ["sass", "c03", "--arch", "sm_80", "--json"])
    assert result.exit_code == 0, result.output
    opcodes = set(json.loads(result.output)["kernels"][0]["sass"]["opcodes"])
    assert {"LDGSTS", "HMMA", "LDSM"} <= opcodes and "UTMALDG" not in opcodes, opcodes
    result = runner.invoke(app, ["sass", "c01", "--arch", "sm_90a"])
    assert result.exit_code != 0 and "implicit-GEMM" in result.output


def test_roofline_and_profile_families_check_their_options_before_asking_for_a_gpu():
    result = runner.invoke(app, ["roofline", "--family", "sparse"])
    assert result.exit_code != 0 and "attention, gemm, conv" in result.output
    result = runner.invoke(app, ["roofline", "--family", "conv", "--shape", "4,320"])
    assert result.exit_code != 0 and "three positive sizes" in result.output
    result = runner.invoke(app, ["profile", "--family", "gemm", "--shape", "8192,x,1"])
    assert result.exit_code != 0 and "three positive sizes" in result.output
    result = runner.invoke(app, ["profile", "--family", "conv", "--stalls"])
    assert result.exit_code != 0 and "attention configs" in result.output
