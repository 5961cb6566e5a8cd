"""The ``attnlab`` command line: thin typer commands over library functions that tests call too.

Commands live in one module per concern and register themselves on ``app``:
``measure`` (bench, ladder, tune), ``explain`` (sass, banks, occupancy, audit), ``profile``
(profile, roofline, patch: Nsight Compute and timing on a GPU), ``cache`` (the compiled-kernel
cache) and ``study`` (the lab's studies).
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="attnlab",
    help="Attention kernels in the CuTe DSL: measure them against their peers and explain them.",
    no_args_is_help=True,
    add_completion=False,
)

# Imported for their side effect of registering commands on ``app``.
from attnlab.cli import cache, explain, gemm, measure, profile, study  # noqa: E402,F401

__all__ = ["app"]
