"""Seed 004's memory-layout study (Observations T, II, JJ): a "cymatic" layout of a disc.

The cells of a ``grid x grid`` image inside the unit disc are given 1-D addresses in two ways:
row-major (the raster order of the inside cells) and cymatic: the disc is cut into the
antinode regions of a clamped circular membrane's mode ``u(r, t) = J_n(k r) cos(n t)`` (``k``
the ``m``-th zero of ``J_n``: ``m`` radial bands between the zeros of ``J_n(k r)``, ``2 n``
angular sectors between the zeros of ``cos(n t)``), the regions are ordered by their
centroids ``(r, t)``, and each region's cells are numbered in raster order. A gather kernel
(``kernels/common/gather.py``) then reads the same access traces (rays, rings, wedges, random
and full scans) through both address maps; the seed measured +1.53x on rays along a sector's
midline and 0.53x on rays along a nodal line, on a 13 MB buffer in a 4 MB L2.

``J_n`` comes from its integral form and its zeros from sign changes refined by bisection
(numpy only); the regions are exact, not traced on the grid.
"""

from __future__ import annotations

import functools
import math

import numpy as np

#: Quadrature points of J_n's integral (accurate to ~1e-12 for the arguments used here).
_QUADRATURE = 2048
#: The seed's default mode (n, m).
DEFAULT_MODE = (6, 4)
#: The seed's traces (``traces``) and the FlashAttention block traces (``fa_traces``).
SEED_TRACE_COUNT = 15
FA_TRACES = ("fa_rowmajor", "fa_diagonal", "fa_zigzag")
#: Observation II's sweep: n in 2..10, m in 1..6 (54 modes).
SWEEP_MODES: tuple[tuple[int, int], ...] = tuple((n, m) for n in range(2, 11)
                                                 for m in range(1, 7))


def bessel_j(n: int, x: np.ndarray | float) -> np.ndarray:
    """``J_n(x) = (1 / pi) int_0^pi cos(n t - x sin t) dt`` (midpoint rule)."""
    t = (np.arange(_QUADRATURE) + 0.5) * (math.pi / _QUADRATURE)
    x = np.asarray(x, dtype=np.float64)[..., None]
    return np.cos(n * t - x * np.sin(t)).mean(axis=-1)


def bessel_zeros(n: int, count: int) -> np.ndarray:
    """The first ``count`` positive zeros of ``J_n``."""
    step = 0.05
    x = np.arange(step, 10.0 + 4.0 * count + n, step)
    values = bessel_j(n, x)
    crossings = np.nonzero(np.signbit(values[:-1]) != np.signbit(values[1:]))[0][:count]
    if len(crossings) < count:
        raise ValueError(f"found {len(crossings)} zeros of J_{n}, wanted {count}")
    zeros = []
    for i in crossings:
        lo, hi = x[i], x[i + 1]
        f_lo = bessel_j(n, lo)
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            f_mid = bessel_j(n, mid)
            if np.signbit(f_mid) == np.signbit(f_lo):
                lo, f_lo = mid, f_mid
            else:
                hi = mid
        zeros.append(0.5 * (lo + hi))
    return np.array(zeros)


@functools.lru_cache(maxsize=2)
def polar(grid: int) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's radius (1 at the disc's edge) and angle, ``[grid, grid]`` (row i, col j);
    remembered for the last two grids (a sweep asks 54 times), so read-only."""
    center = (grid - 1) / 2
    i, j = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    y, x = center - i, j - center
    r, theta = np.hypot(x, y) / (grid / 2), np.arctan2(y, x)
    r.flags.writeable = theta.flags.writeable = False
    return r, theta


def regions(grid: int, n: int, m: int) -> np.ndarray:
    """The antinode region of every cell of mode ``(n, m)``: ``band * sectors + sector``,
    -1 outside the disc (``m`` bands, ``max(1, 2 n)`` sectors)."""
    if n < 0 or m < 1:
        raise ValueError(f"a mode needs n >= 0 and m >= 1, got ({n}, {m})")
    r, theta = polar(grid)
    zeros = bessel_zeros(n, m)
    band = np.searchsorted(zeros[:-1] / zeros[-1], r, side="right")
    sectors = max(1, 2 * n)
    sector = (np.floor((n * theta + math.pi / 2) / math.pi).astype(np.int64) % sectors
              if n else np.zeros_like(band))
    region = band * sectors + sector
    return np.where(r < 1.0, region, -1)


def cymatic_addresses(grid: int, n: int, m: int) -> np.ndarray:
    """Each inside cell's address in the cymatic layout (regions ordered by centroid radius,
    then angle; raster order within a region); -1 outside."""
    region = regions(grid, n, m).ravel()
    inside = np.nonzero(region >= 0)[0]
    r, theta = (a.ravel()[inside] for a in polar(grid))
    ids = region[inside]
    count = int(ids.max()) + 1
    size = np.bincount(ids, minlength=count)
    used = size > 0
    centroid_r = np.bincount(ids, weights=r, minlength=count)[used] / size[used]
    # The circular mean: a sector straddling t = +-pi is not averaged to 0.
    centroid_t = np.arctan2(np.bincount(ids, weights=np.sin(theta), minlength=count)[used],
                            np.bincount(ids, weights=np.cos(theta), minlength=count)[used])
    rank = np.full(count, -1, dtype=np.int16)
    rank[np.nonzero(used)[0][np.lexsort((centroid_t, centroid_r))]] = np.arange(used.sum())
    # By region rank, raster order within (``inside`` ascends and the sort is stable; on
    # 16-bit keys numpy's stable sort is a radix sort: linear in the 53 M cells of 8192^2).
    order = np.argsort(rank[ids], kind="stable")
    addresses = np.full(grid * grid, -1, dtype=np.int64)
    addresses[inside[order]] = np.arange(len(inside))
    return addresses.reshape(grid, grid)


def rowmajor_addresses(grid: int) -> np.ndarray:
    """Each inside cell's address in raster order of the inside cells; -1 outside."""
    inside = (polar(grid)[0] < 1.0).ravel()
    addresses = np.full(grid * grid, -1, dtype=np.int64)
    addresses[inside] = np.arange(int(inside.sum()))
    return addresses.reshape(grid, grid)


def traces(grid: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The seed's 15 access traces as flat cell indices (row * grid + col) of inside cells, in
    access order: rays ``grid / 64`` cells thick along sector midlines and nodal lines of mode
    (6, *) (read outward), rings at radius 0.3 and 0.6, wedges of pi/6 and pi/4 (raster order),
    random cells (uniform over the disc; and with radii of density ``r ** 0`` and ``r **
    0.7``, i.e. crowded towards the centre), row- and column-major scans."""
    r, theta = polar(grid)
    inside = r < 1.0
    flat = np.arange(grid * grid).reshape(grid, grid)
    half = grid / 2
    width = max(grid / 64, 1.0) / half
    out: dict[str, np.ndarray] = {}

    def ray(angle: float) -> np.ndarray:
        along = r * np.cos(theta - angle)
        across = r * np.sin(theta - angle)
        cells = inside & (along >= 0) & (np.abs(across) <= width / 2)
        order = np.lexsort((across[cells], along[cells]))
        return flat[cells][order]

    for name, angle in (("radial_mid_0", 0.0), ("radial_mid_pi6", math.pi / 6),
                        ("radial_mid_pi3", math.pi / 3), ("radial_bnd_pi12", math.pi / 12),
                        ("radial_bnd_pi4", math.pi / 4), ("radial_bnd_5pi12", 5 * math.pi / 12)):
        out[name] = ray(angle)
    for name, radius in (("circular_r030", 0.3), ("circular_r060", 0.6)):
        cells = inside & (np.abs(r - radius) <= width / 2)
        out[name] = flat[cells][np.lexsort((r[cells], theta[cells]))]
    for name, span in (("polar_tile_pi6", math.pi / 6), ("polar_tile_pi4", math.pi / 4)):
        out[name] = flat[inside & (theta >= 0) & (theta < span)]
    rng = np.random.default_rng(seed)
    cells = flat[inside]
    count = len(cells) // 4
    out["random"] = rng.choice(cells, count)
    # Radii drawn with density r ** a along the radius: a cell's weight r ** (a - 1).
    radius = np.maximum(r[inside], 0.5 / half)
    for name, power in (("radial_bias_00", 0.0), ("radial_bias_07", 0.7)):
        weights = radius ** (power - 1.0)
        out[name] = rng.choice(cells, count, p=weights / weights.sum())
    out["rowmajor_full"] = cells
    out["colmajor_full"] = flat.T[inside.T]
    return out


def fa_traces(grid: int, head_dim: int = 128, block: int = 64) -> dict[str, np.ndarray]:
    """Observation JJ's FlashAttention block traces: one head's K (``S x head_dim``, ``S`` the
    inscribed square's side in whole blocks) is the strip of the grid's ``head_dim`` middle
    columns, a K row per grid row; the forward visits every (query block, key block) pair and
    reads the key block's ``block x head_dim`` cells in raster order. The pairs in the kernel's
    order (``fa_rowmajor``: query block outer), by anti-diagonal (``fa_diagonal``: q + k, then
    q) and snaking (``fa_zigzag``: key blocks reversed on odd query blocks)."""
    if not 0 < head_dim <= grid // 2:
        raise ValueError(f"head_dim {head_dim} does not fit a strip of the {grid}^2 disc")
    blocks = int(grid / math.sqrt(2)) // block
    if blocks < 2:
        raise ValueError(f"a {grid}^2 grid holds fewer than two {block}-row blocks")
    row0, col0 = (grid - blocks * block) // 2, (grid - head_dim) // 2
    rows = row0 + np.arange(block)[:, None]
    cells = (rows * grid + col0 + np.arange(head_dim)).ravel()
    key_block = [cells + k * block * grid for k in range(blocks)]
    q, k = np.meshgrid(np.arange(blocks), np.arange(blocks), indexing="ij")
    orders = (k.ravel(), k.ravel()[np.lexsort((q.ravel(), (q + k).ravel()))],
              np.where(q % 2, blocks - 1 - k, k).ravel())
    return {name: np.concatenate([key_block[j] for j in order])
            for name, order in zip(FA_TRACES, orders, strict=True)}


def measure(grid: int, modes: list[tuple[int, int]], runs: int = 11,
            on_trace=None, on_mode=None, fa: bool = False) -> list[dict[str, object]]:
    """On the current GPU: every trace read through the row-major and each mode's cymatic
    address map by the gather kernel, round-robin, median device time; one row per (mode,
    trace) with both times and the cymatic layout's speedup (row time / cymatic time).
    ``on_mode(rows)`` follows each mode with the rows so far (a sweep saves as it goes);
    ``fa`` adds the FlashAttention block traces (``fa_traces``)."""
    import torch

    from attnlab import device
    from attnlab.bench.timing import sample_interleaved, summarize
    from attnlab.kernels.common.gather import THREADS, compile_gather

    gather = compile_gather(device.info(torch.device("cuda")).arch)
    cuda = torch.device("cuda")
    row = rowmajor_addresses(grid).ravel()
    data = torch.randn(int(row.max()) + 1, device=cuda)
    out = torch.empty(device.info(cuda).multiprocessors * 8 * THREADS, device=cuda)
    rows = []
    # The traces' cells and their row-major addresses go to the GPU once; a mode's address
    # map is looked up there (a sweep's 54 modes x 160 M accesses at 8192^2).
    every = traces(grid) | (fa_traces(grid) if fa else {})
    cells_of = {name: torch.from_numpy(cells).to(cuda) for name, cells in every.items()}
    row_map = torch.from_numpy(row.astype(np.int32)).to(cuda)
    row_index = {name: row_map[cells] for name, cells in cells_of.items()}
    for n, m in modes:
        cym_map = torch.from_numpy(cymatic_addresses(grid, n, m).ravel().astype(np.int32)).to(
            cuda)
        for name, cells in cells_of.items():
            index = {"row": row_index[name], "cymatic": cym_map[cells]}
            fns = {layout: (lambda i, x=x: gather(data, x, out)) for layout, x in index.items()}
            samples = sample_interleaved(fns, warmup=3, runs=runs)
            row_ms, cym_ms = (summarize(samples[k]).median_ms for k in ("row", "cymatic"))
            rows.append({"grid": grid, "mode": [n, m], "trace": name, "accesses": len(cells),
                         "row_ms": row_ms, "cymatic_ms": cym_ms, "speedup": row_ms / cym_ms})
            if on_trace is not None:
                on_trace()
        if on_mode is not None:
            on_mode(rows)
    return rows


def plot(rows: list[dict[str, object]], grid_for_map: int, mode: tuple[int, int], path):
    """A PNG: the regions of ``mode`` (colour = address order), and per grid and mode the
    cymatic layout's speedup on each trace (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))
    addresses = cymatic_addresses(grid_for_map, *mode).astype(float)
    addresses[addresses < 0] = np.nan
    left.imshow(addresses, cmap="viridis")
    left.set_title(f"cymatic addresses, mode {mode}, {grid_for_map}^2 (colour = address)")
    left.axis("off")
    names = list(dict.fromkeys(r["trace"] for r in rows))
    series = list(dict.fromkeys((r["grid"], tuple(r["mode"])) for r in rows))
    width = 0.8 / max(len(series), 1)
    for k, (grid, m) in enumerate(series):
        values = [next(r["speedup"] for r in rows if r["trace"] == name and r["grid"] == grid
                       and tuple(r["mode"]) == m) for name in names]
        right.bar(np.arange(len(names)) + k * width, values, width, label=f"{grid}^2, mode {m}")
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_yscale("log")
    right.set_xticks(np.arange(len(names)) + 0.4, names, rotation=60, ha="right")
    right.set_ylabel("row-major time / cymatic time")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def sweep_summary(rows: list[dict[str, object]], grid: int) -> dict[str, object]:
    """Observation II's tables for one grid: each mode's geometric-mean speedup over the
    traces (and its worst trace), the best universal mode, and each trace's best mode."""
    mine = [r for r in rows if r["grid"] == grid]
    modes = list(dict.fromkeys(tuple(r["mode"]) for r in mine))
    per_mode = {}
    for mode in modes:
        speedups = [float(r["speedup"]) for r in mine if tuple(r["mode"]) == mode]
        per_mode[mode] = (math.exp(np.mean(np.log(speedups))), min(speedups))
    best = max(per_mode, key=lambda mode: per_mode[mode][0])
    per_trace = {}
    for name in dict.fromkeys(r["trace"] for r in mine):
        top = max((r for r in mine if r["trace"] == name), key=lambda r: r["speedup"])
        per_trace[name] = (tuple(top["mode"]), float(top["speedup"]))
    return {"grid": grid, "geomean": {f"{n}x{m}": v for (n, m), v in per_mode.items()},
            "best_universal": f"{best[0]}x{best[1]}", "best_per_trace": {
                name: (f"{m[0]}x{m[1]}", v) for name, (m, v) in per_trace.items()}}


def plot_sweep(rows: list[dict[str, object]], grid: int, path):
    """A PNG heatmap of each mode's geometric-mean speedup over the traces (n across, m
    down), as Observation II's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = sweep_summary(rows, grid)["geomean"]
    ns = sorted({int(k.split("x")[0]) for k in summary})
    ms = sorted({int(k.split("x")[1]) for k in summary})
    grid_values = np.full((len(ms), len(ns)), np.nan)
    for key, (geomean, _) in summary.items():
        n, m = map(int, key.split("x"))
        grid_values[ms.index(m), ns.index(n)] = geomean
    fig, ax = plt.subplots(figsize=(8, 5))
    image = ax.imshow(grid_values, cmap="RdBu", vmin=0.5, vmax=1.5, origin="lower")
    ax.set_xticks(range(len(ns)), ns)
    ax.set_yticks(range(len(ms)), ms)
    ax.set_xlabel("n (angular)")
    ax.set_ylabel("m (radial)")
    ax.set_title(f"cymatic over row-major, geomean of the traces, {grid}^2")
    fig.colorbar(image)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

