"""``attnlab cache``: the compiled-kernel cache on disk (show, clear, warm)."""

from __future__ import annotations

import os

import typer
from rich.table import Table

from attnlab.cli import app
from attnlab.cli.measure import console, progress_bar


@app.command()
def cache(
    show: bool = typer.Option(False, help="List the compiled kernels on disk."),
    clear: bool = typer.Option(False, help="Delete every compiled kernel on disk."),
    warm: bool = typer.Option(False, help="Compile this GPU's default kernels (every head dim, "
                              "mask, dtype and query-length bucket, dense and packed, with and "
                              "without the LSE; the backward's; on sm_90a the GEMM "
                              "dispatch's) into the cache."),
    arch: str = typer.Option(None, help="Target of --warm (default: this GPU's), e.g. sm_90a: "
                             "warming needs no GPU."),
    jobs: int = typer.Option(0, help="Compile processes for --warm (0: up to 8, one per CPU)."),
) -> None:
    """The compiled-kernel cache: $ATTNLAB_CACHE_DIR or the per-user cache directory."""
    from attnlab import kernel_cache

    if not (show or clear or warm):
        show = True
    if clear:
        console.print(f"removed {kernel_cache.clear()} kernels from {kernel_cache.cache_root()}")
    if warm:
        _warm(arch, jobs or min(8, os.cpu_count() or 1))
    if show:
        console.print(_entries_table())


def _warm(arch: str | None, jobs: int) -> None:
    from attnlab import kernel_cache
    from attnlab.gemm.dispatch import default_specs as gemm_specs
    from attnlab.policy import default_backward_specs, default_specs

    if arch is None:
        import torch

        if not torch.cuda.is_available():
            raise typer.BadParameter("no GPU here to take the target from: name one, e.g. "
                                     "--arch sm_90a", param_hint="--arch")
        from attnlab.device import arch_of

        arch = arch_of()
    specs = default_specs(arch) + default_backward_specs(arch) + gemm_specs(arch)
    compiled = 0
    with progress_bar() as progress:
        task = progress.add_task(f"warm {arch} ({jobs} jobs)", total=len(specs))

        def done(spec, seconds: float | None) -> None:
            nonlocal compiled
            compiled += seconds is not None
            progress.advance(task)

        kernel_cache.warm(specs, jobs, done)
    console.print(f"{compiled} kernels compiled, {len(specs) - compiled} already cached, in "
                  f"{kernel_cache.cache_dir()}")


def _entries_table() -> Table:
    from attnlab import kernel_cache

    found = kernel_cache.entries()
    table = Table(title=f"compiled kernels in {kernel_cache.cache_root()}")
    for column in ("kernel", "registers", "compile s", "KiB", "installation"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for entry in found:
        row = entry.to_dict()
        table.add_row(str(row["kernel"]), str(row["registers"]),
                      f"{entry.compile_seconds:.1f}", f"{entry.bytes / 1024:.0f}",
                      "this one" if entry.current else "stale")
    if not found:
        table.caption = "empty: kernels are cached as attention() first needs them"
    return table
