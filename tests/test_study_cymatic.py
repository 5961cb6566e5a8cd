"""The cymatic memory-layout study (issue 24, seed 004 Observation T) on CPU: the Bessel
zeros, the mode's regions, both address maps and the traces; and the gather kernel's SASS."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab.studies import cymatic

GRID = 192


def test_bessel_zeros_match_the_tables():
    assert np.allclose(cymatic.bessel_zeros(0, 3), [2.404826, 5.520078, 8.653728], atol=1e-5)
    assert np.allclose(cymatic.bessel_zeros(6, 2), [9.936110, 13.589290], atol=1e-5)
    with pytest.raises(ValueError, match="n >= 0 and m >= 1"):
        cymatic.regions(16, 6, 0)


@pytest.mark.parametrize("n, m", [(6, 4), (5, 4), (0, 3), (2, 1)])
def test_regions_are_the_modes_bands_and_sectors(n, m):
    region = cymatic.regions(GRID, n, m)
    r, _ = cymatic.polar(GRID)
    assert ((region >= 0) == (r < 1.0)).all()
    assert len(np.unique(region[region >= 0])) == m * max(1, 2 * n)
    # The first band is the disc inside J_n's first zero scaled to the m-th.
    zeros = cymatic.bessel_zeros(n, m)
    inner = r < 0.99 * zeros[0] / zeros[-1]
    assert (region[inner] < max(1, 2 * n)).all()


def test_cymatic_addresses_number_each_region_contiguously_in_raster_order():
    n, m = 6, 4
    cym = cymatic.cymatic_addresses(GRID, n, m)
    row = cymatic.rowmajor_addresses(GRID)
    inside = row >= 0
    assert ((cym >= 0) == inside).all()
    assert np.array_equal(np.sort(cym[inside]), np.arange(inside.sum()))
    assert np.array_equal(row[inside], np.arange(inside.sum()))
    region = cymatic.regions(GRID, n, m)
    r, _ = cymatic.polar(GRID)
    starts = []
    for rid in np.unique(region[inside]):
        cells = np.nonzero((region == rid).ravel())[0]  # raster order
        addresses = cym.ravel()[cells]
        assert np.array_equal(addresses, np.arange(addresses[0], addresses[0] + len(cells)))
        starts.append((addresses[0], r.ravel()[cells].mean()))
    # Regions in order of their centroid radius: the band structure is monotone.
    radii = [radius for _, radius in sorted(starts)]
    assert radii[0] == min(radii) and radii[-1] == max(radii)


def test_traces_read_inside_cells_and_follow_the_geometry():
    tr = cymatic.traces(GRID)
    assert len(tr) == 15
    inside = (cymatic.rowmajor_addresses(GRID) >= 0).ravel()
    for name, cells in tr.items():
        assert len(cells) > 0 and inside[cells].all(), name
    assert np.array_equal(tr["rowmajor_full"], np.nonzero(inside)[0])
    # A ray along mode 6's sector midline at pi/6 stays (beyond the centre) in one sector.
    region = cymatic.regions(GRID, 6, 4).ravel()
    r, theta = (a.ravel() for a in cymatic.polar(GRID))
    ray = tr["radial_mid_pi6"]
    outer = ray[r[ray] > 0.25]
    assert len(np.unique(region[outer] % 12)) == 1
    assert np.allclose(np.median(theta[outer]), math.pi / 6, atol=0.05)
    # Its cymatic addresses change far less often than a nodal line's.
    cym = cymatic.cymatic_addresses(GRID, 6, 4).ravel()

    def jumps(cells):
        return np.mean(np.abs(np.diff(cym[cells])) > GRID)

    assert jumps(tr["radial_mid_pi6"]) < jumps(tr["radial_bnd_pi4"])


def test_gather_kernel_is_one_index_load_and_one_data_load_per_access(tmp_path):
    from attnlab.analysis.sass import disassemble, histogram, parse
    from attnlab.jit import dumped_binary
    from attnlab.kernels.common.gather import compile_gather

    compile_gather("sm_90a", dump_dir=tmp_path)
    cubin, _ = dumped_binary(tmp_path)
    ops = histogram(parse(disassemble(cubin)))
    # Unrolled 4x: per access an index load, then the data load it addresses.
    assert ops["LDG"] == 2 * 4 and ops["STG"] == 1


def test_sweep_summary_finds_the_best_mode_overall_and_per_trace(tmp_path):
    rows = [{"grid": 64, "mode": [n, m], "trace": t, "speedup": s}
            for (n, m), per_trace in {(5, 4): {"a": 2.0, "b": 0.5},
                                      (6, 4): {"a": 1.5, "b": 1.5},
                                      (2, 1): {"a": 0.9, "b": 1.8}}.items()
            for t, s in per_trace.items()]
    summary = cymatic.sweep_summary(rows, 64)
    assert summary["best_universal"] == "6x4"  # geomean 1.5 beats 1.0 and 1.27
    assert summary["best_per_trace"] == {"a": ("5x4", 2.0), "b": ("2x1", 1.8)}
    assert math.isclose(summary["geomean"]["5x4"][0], 1.0) and summary["geomean"]["5x4"][1] == 0.5
    assert len(cymatic.SWEEP_MODES) == 54
    assert cymatic.plot_sweep(rows, 64, tmp_path / "sweep.png").stat().st_size > 0


def test_a_resumed_sweep_measures_only_the_modes_its_file_lacks(monkeypatch, tmp_path):
    """``--resume`` keeps OUT/cymatic.json's rows, measures the rest and saves after each
    mode (the GPU part stubbed: a mode's 15 rows)."""
    from typer.testing import CliRunner

    import attnlab.cli.study as study
    from attnlab.cli import app

    measured = []

    def fake_measure(grid, modes, runs, on_trace=None, on_mode=None, fa=False):
        rows = []
        for n, m in modes:
            measured.append((n, m))
            rows += [{"grid": grid, "mode": [n, m], "trace": f"t{i}", "accesses": 1,
                      "row_ms": 1.0, "cymatic_ms": 1.0, "speedup": 1.0} for i in range(15)]
            on_mode(rows)
        return rows

    monkeypatch.setattr(study, "require_gpu", lambda: None)
    monkeypatch.setattr(cymatic, "measure", fake_measure)
    monkeypatch.setattr(cymatic, "plot", lambda *a: tmp_path / "c.png")
    args = ["study", "cymatic", "--grids", "64", "--modes", "6x4,5x4", "--out", str(tmp_path)]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert measured == [(6, 4), (5, 4)]
    result = CliRunner().invoke(app, [*args[:5], "6x4,5x4,3x2", *args[6:], "--resume"])
    assert result.exit_code == 0, result.output
    assert measured == [(6, 4), (5, 4), (3, 2)]
    import json

    saved = json.loads((tmp_path / "cymatic.json").read_text())
    assert len(saved) == 3 * 15


def test_a_sweep_plots_the_default_and_the_best_mode(monkeypatch, tmp_path):
    """After ``--sweep`` the bar chart shows the seed's default (6, 4) and the best universal
    mode, not 54 series; the heatmap gets every mode (the GPU part stubbed)."""
    from typer.testing import CliRunner

    import attnlab.cli.study as study
    from attnlab.cli import app

    def fake_measure(grid, modes, runs, on_trace=None, on_mode=None, fa=False):
        return [{"grid": grid, "mode": [n, m], "trace": f"t{i}", "accesses": 1, "row_ms": 1.0,
                 "cymatic_ms": 1.0, "speedup": 2.0 if (n, m) == (3, 2) else 1.0}
                for n, m in modes for i in range(15)]

    plotted = {}
    monkeypatch.setattr(study, "require_gpu", lambda: None)
    monkeypatch.setattr(cymatic, "measure", fake_measure)
    monkeypatch.setattr(cymatic, "plot", lambda rows, grid, mode, path: plotted.update(
        modes={tuple(r["mode"]) for r in rows}, mode=mode) or path)
    monkeypatch.setattr(cymatic, "plot_sweep", lambda rows, grid, path: plotted.update(
        sweep=len(rows)) or path)
    result = CliRunner().invoke(app, ["study", "cymatic", "--grids", "64", "--sweep", "--out",
                                      str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "best mode over all traces 3x2: geomean 2.000x" in result.output
    assert plotted == {"sweep": 54 * 15, "modes": {(6, 4), (3, 2)}, "mode": (6, 4)}


def test_fa_traces_visit_every_key_block_once_per_query_block_in_their_order():
    grid, head_dim, block = 256, 16, 8
    fa = cymatic.fa_traces(grid, head_dim, block)
    assert list(fa) == list(cymatic.FA_TRACES)
    blocks = int(grid / math.sqrt(2)) // block
    size = block * head_dim
    r, _ = cymatic.polar(grid)
    strip = np.zeros((grid, grid), bool)
    strip[:, (grid - head_dim) // 2:(grid + head_dim) // 2] = True
    sequences = {}
    for name, cells in fa.items():
        assert len(cells) == blocks * blocks * size
        assert (r.ravel()[cells] < 1).all() and strip.ravel()[cells].all()
        visits = cells.reshape(-1, size)
        # A visit is one key block: block rows of head_dim contiguous cells, raster order.
        assert (np.diff(visits.reshape(-1, block, head_dim), axis=2) == 1).all()
        assert (np.diff(visits.reshape(-1, block, head_dim)[:, :, 0], axis=1) == grid).all()
        key = (visits[:, 0] - visits[0].min()) // (block * grid)
        sequences[name] = key
        assert (np.bincount(key, minlength=blocks) == blocks).all()
    n = blocks
    assert list(sequences["fa_rowmajor"][:n + 1]) == [*range(n), 0]
    assert list(sequences["fa_zigzag"][n:2 * n]) == list(range(n - 1, -1, -1))
    assert list(sequences["fa_diagonal"][:6]) == [0, 1, 0, 2, 1, 0]
    with pytest.raises(ValueError, match="strip"):
        cymatic.fa_traces(64, 64)
