"""A roofline from profile data: achieved FLOP/s against DRAM and L2 arithmetic intensity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RooflinePoint:
    """One kernel: its FLOPs, time and bytes moved at each level (from Nsight Compute)."""

    name: str
    flops: float
    seconds: float
    dram_bytes: float
    l2_bytes: float

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def dram_intensity(self) -> float:
        return self.flops / self.dram_bytes

    @property
    def l2_intensity(self) -> float:
        return self.flops / self.l2_bytes


def attainable(intensity: float, bytes_per_s: float, flops_per_s: float) -> float:
    """The roofline: min(matrix rate, intensity x bandwidth)."""
    return min(flops_per_s, intensity * bytes_per_s)


def plot_roofline(points: Sequence[RooflinePoint], dram_bytes_per_s: float,
                  l2_bytes_per_s: float, matmul_flops_per_s: float, path: Path,
                  title: str = "", mma_sync_flops_per_s: float | None = None) -> Path:
    """Log-log roofline with both memory ceilings; each kernel appears at both intensities.
    ``mma_sync_flops_per_s`` adds the lower roof of the ``mma.sync`` instruction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    xs = np.logspace(0, 5, 200)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for bandwidth, label, style in ((dram_bytes_per_s, "DRAM", "-"), (l2_bytes_per_s, "L2", "--")):
        ax.plot(xs, [attainable(x, bandwidth, matmul_flops_per_s) / 1e12 for x in xs],
                style, color="gray", label=f"{label} ceiling ({bandwidth / 1e12:.2f} TB/s)")
    ax.axhline(matmul_flops_per_s / 1e12, color="black", linewidth=0.8,
               label=f"bf16 matmul ({matmul_flops_per_s / 1e12:.0f} TFLOP/s)")
    if mma_sync_flops_per_s is not None:
        ax.axhline(mma_sync_flops_per_s / 1e12, color="black", linewidth=0.8, linestyle=":",
                   label=f"bf16 mma.sync ({mma_sync_flops_per_s / 1e12:.0f} TFLOP/s)")
    for i, p in enumerate(points):
        color = f"C{i}"
        ax.scatter(p.dram_intensity, p.flops_per_s / 1e12, marker="o", color=color,
                   label=f"{p.name} (DRAM)")
        ax.scatter(p.l2_intensity, p.flops_per_s / 1e12, marker="s", color=color,
                   facecolors="none", label=f"{p.name} (L2)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
