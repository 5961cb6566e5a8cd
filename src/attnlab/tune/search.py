"""The tuning loop: inspect candidates in parallel, prune, time the survivors, keep the best."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from attnlab.bench.runner import Point, Result, attnlab_impl, measure_point
from attnlab.config import FlashConfig
from attnlab.tune.prune import Inspection, inspect_config, prune

DEFAULT_NAME = "default"


@dataclass(frozen=True)
class TuneOutcome:
    """The result of tuning one point."""

    point: Point
    default: FlashConfig
    best: FlashConfig
    best_ms: float
    default_ms: float
    timed: list[Result]

    @property
    def speedup(self) -> float:
        return self.default_ms / self.best_ms


def inspect_all(space: Sequence[FlashConfig], arch: str, dtype: str, head_dim: int,
                artifact_dir: Path, workers: int,
                on_done: Callable[[], None] | None = None,
                windowed: bool = False) -> list[Inspection]:
    """Cross-compile every candidate in worker processes (compilation is CPU-bound)."""
    # spawn: the parent may hold a CUDA context and DSL state that must not be forked.
    context = multiprocessing.get_context("spawn")
    results = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(inspect_config, cfg, arch, dtype, head_dim, str(artifact_dir),
                               windowed) for cfg in space]
        for future in as_completed(futures):
            results.append(future.result())
            if on_done is not None:
                on_done()
    order = {cfg: i for i, cfg in enumerate(space)}
    return sorted(results, key=lambda item: order[item.config])


def select_for_timing(survivors: list[Inspection], max_timed: int
                      ) -> tuple[list[FlashConfig], int]:
    """At most ``max_timed`` survivors; also returns how many were left out.

    Every tile shape (block_m, block_n, warps) is timed once before any is timed twice: the
    refinement round only varies the winner's knobs, so a shape left out here is never timed.
    Within a round, bigger tiles first (more work per loaded byte), then fewer registers.
    """
    ranked = sorted(survivors, key=lambda item: (-item.config.block_m * item.config.block_n,
                                                 item.registers))
    seen: Counter[tuple[int, int, int]] = Counter()

    def timing_round(item: Inspection) -> int:
        shape = (item.config.block_m, item.config.block_n, item.config.num_warps)
        seen[shape] += 1
        return seen[shape]

    # sorted() computes the keys in list order, and is stable: each round keeps that order.
    chosen = [item.config for item in sorted(ranked, key=timing_round)[:max_timed]]
    return chosen, max(0, len(ranked) - max_timed)


def time_candidates(point: Point, default: FlashConfig, candidates: Sequence[FlashConfig], *,
                    runs: int, on_impl: Callable[[str], None] | None = None) -> TuneOutcome:
    """Time the default and every candidate on the same inputs; the fastest kernel (device
    time: the host side is the same for every config) wins.

    The default is always timed, so the winner is at least as fast as the default as measured.
    """
    impls = {DEFAULT_NAME: attnlab_impl(default)}
    names = {DEFAULT_NAME: default}
    for cfg in candidates:
        if cfg != default:
            name = cfg.short_name()
            impls[name] = attnlab_impl(cfg)
            names[name] = cfg
    timed = measure_point(point, impls, runs=runs, on_impl=on_impl)
    ok = [r for r in timed if r.device_timing is not None]
    if not any(r.impl == DEFAULT_NAME for r in ok):
        raise RuntimeError(f"the default config failed at {point.label()}: "
                           f"{next(r.error for r in timed if r.impl == DEFAULT_NAME)}")
    best = min(ok, key=lambda r: r.device_timing.median_ms)
    default_ms = next(r.device_timing.median_ms for r in ok if r.impl == DEFAULT_NAME)
    return TuneOutcome(point, default, names[best.impl], best.device_timing.median_ms,
                       default_ms, timed)


def summarize_pruning(total: int, reasons: Counter[str], left_out: int) -> dict[str, int]:
    summary = {"candidates": total, **dict(reasons)}
    if left_out:
        summary["over the timing budget"] = left_out
    summary["timed"] = total - sum(reasons.values()) - left_out
    return summary


def prune_space(space: Sequence[FlashConfig], spec, arch: str, dtype: str, head_dim: int,
                artifact_dir: Path, workers: int, max_timed: int,
                on_done: Callable[[], None] | None = None, windowed: bool = False
                ) -> tuple[list[FlashConfig], dict[str, int]]:
    """Inspect, prune and select: the configs worth timing and the pruning summary
    (``windowed``: of the causal / sliding-window kernel)."""
    inspections = inspect_all(space, arch, dtype, head_dim, artifact_dir, workers, on_done,
                              windowed)
    survivors, reasons = prune(inspections, spec)
    chosen, left_out = select_for_timing(survivors, max_timed)
    return chosen, summarize_pruning(len(space), reasons, left_out)
