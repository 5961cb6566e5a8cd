"""``attnlab bench --family gemm``: attnlab's GEMMs against cuBLAS.

A point is ``M x N x K`` in one dtype, B row-major (``"n"``) or a transposed ``[N, K]`` weight
(``"k"``, as ``F.linear`` holds it). fp16/bf16 points time ``attnlab.gemm.matmul`` against
``torch.matmul``; int8 points (B always a transposed weight) time ``attnlab.gemm.int8_matmul``
with per-row scales and per-column scales and zero points, dequantized to bf16, against
``torch._int_mm`` (cuBLASLt, int32 out, no dequantization: the issue's peer). Both
implementations see the same rotating input sets (together larger than L2) and are timed in
the same rounds: end to end (calls back to back, host included: the headline) and device only
(CUDA events around each call).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from attnlab.bench.timing import (
    TimedCallError,
    Timing,
    calls_per_span,
    sample_back_to_back,
    sample_interleaved,
    summarize,
    tflops,
)

#: The lab's square and skinny shapes (Observations DD-FF) and one LLM projection set
#: (tokens x hidden 4096 -> 4096 / 14336).
LAB_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (1024, 1024, 1024),
              (512, 512, 4096), (256, 256, 4096), (256, 256, 8192), (128, 128, 8192))
LLM_SHAPES = tuple((t, n, 4096) for t in (1, 16, 4096) for n in (4096, 14336))
#: Input sets rotate until they span this multiple of L2.
L2_SPAN = 3
MAX_SETS = 8


@dataclass(frozen=True)
class GemmPoint:
    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    b_major: str = "n"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def label(self) -> str:
        weight = " B^T" if self.b_major == "k" else ""
        return f"{self.m}x{self.n}x{self.k}{weight}"


@dataclass(frozen=True)
class GemmResult:
    point: GemmPoint
    impl: str
    timing: Timing | None
    device_timing: Timing | None = None
    error: str | None = None

    @property
    def tflops(self) -> float | None:
        return tflops(self.point.flops, self.timing.median_ms) if self.timing else None

    @property
    def device_tflops(self) -> float | None:
        return (tflops(self.point.flops, self.device_timing.median_ms)
                if self.device_timing else None)

    def to_dict(self) -> dict[str, object]:
        return {"point": asdict(self.point), "impl": self.impl, "tflops": self.tflops,
                "device_tflops": self.device_tflops, "error": self.error,
                "timing": self.timing.to_dict() if self.timing else None,
                "device_timing": self.device_timing.to_dict() if self.device_timing else None}


def gemm_sets(point: GemmPoint, l2_bytes: int, seed: int = 0) -> list[tuple]:
    """Input sets, as many as span ``L2_SPAN`` x L2 (at least one): ``(a, b)``, or for int8
    ``(a_q, b_q, scale_a, scale_b, zero_b)``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = 1 if point.dtype == "int8" else 2
    size = width * (point.m * point.k + point.k * point.n)
    count = max(1, min(MAX_SETS, math.ceil(L2_SPAN * l2_bytes / size)))
    if point.dtype == "int8":
        return [int8_operands(point.m, point.n, point.k, gen) for _ in range(count)]
    dt = getattr(torch, point.dtype)
    sets = []
    for _ in range(count):
        a = torch.randn(point.m, point.k, device="cuda", dtype=dt, generator=gen)
        if point.b_major == "k":
            b = torch.randn(point.n, point.k, device="cuda", dtype=dt, generator=gen).t()
        else:
            b = torch.randn(point.k, point.n, device="cuda", dtype=dt, generator=gen)
        sets.append((a, b))
    return sets


def int8_operands(m: int, n: int, k: int, gen: torch.Generator) -> tuple:
    """Random int8 ``a_q [M, K]``, ``b_q = w_q.t()`` of a ``[N, K]`` weight, positive fp32
    scales and zero points in [-8, 8]."""
    def ints(*shape):
        return torch.randint(-128, 128, shape, device="cuda", dtype=torch.int8, generator=gen)

    def uniform(length, low, high):
        return low + (high - low) * torch.rand(length, device="cuda", generator=gen)

    return (ints(m, k), ints(n, k).t(), uniform(m, 0.01, 0.02), uniform(n, 0.01, 0.02),
            uniform(n, -8, 8).round())


#: The 2:4 sparse bench's shapes: the issue's 8192^3 target, the lab's squares, a projection.
SPARSE_SHAPES = ((8192, 8192, 8192), (4096, 4096, 4096), (2048, 2048, 2048),
                 (4096, 14336, 4096))


def sparse_sets(point: GemmPoint, l2_bytes: int, seed: int = 0) -> list[tuple]:
    """Input sets of the 2:4 sparse bench, as many as span ``L2_SPAN`` x L2: ``(a, sparse,
    semi, b)``: a pruned random A (``prune_2_4``), its ``Sparse24``, torch's semi-structured
    form of it (None where this torch or GPU has none) and B as a transposed weight."""
    from attnlab.gemm import compress_2_4, prune_2_4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, point.dtype)
    size = 2 * (point.m * point.k + point.k * point.n)
    sets = []
    for _ in range(max(1, min(MAX_SETS, math.ceil(L2_SPAN * l2_bytes / size)))):
        a = prune_2_4(torch.randn(point.m, point.k, device="cuda", dtype=dt, generator=gen))
        b = torch.randn(point.n, point.k, device="cuda", dtype=dt, generator=gen).t()
        sets.append((a, compress_2_4(a), _semi_structured(a), b))
    return sets


def _semi_structured(a: torch.Tensor) -> object | None:
    """torch's semi-structured sparse form of ``a`` (cuSPARSELt or CUTLASS), or None."""
    try:
        from torch.sparse import to_sparse_semi_structured

        return to_sparse_semi_structured(a)
    except Exception:  # no such support in this build or on this GPU: the peer is left out
        return None


def sparse_impls() -> dict[str, Callable]:
    """On one pruned A: ``cublas`` and ``attnlab`` (``matmul``, the wgmma kernel) on it dense,
    ``sparse24`` (``sparse_matmul``: on sm_90 the ``wgmma.mma_async.sp`` kernel),
    ``torch_semi_structured`` (``torch.mm`` of torch's form), and the ``mma.sync`` forms:
    ``dense_mma_sync`` (the ``mma.sp`` kernel's own tile and ring with dense MMAs),
    ``sparse24_mma_sync`` (``mma.sp``) and ``online_int8`` (``online_int8_matmul``, dense
    A)."""
    from attnlab.gemm import matmul, online_int8_matmul, sparse_matmul
    from attnlab.gemm.ladder import sparse_step

    def semi_structured(a, sparse, semi, b):
        if semi is None:
            raise RuntimeError("torch has no semi-structured sparse here")
        return torch.mm(semi, b)

    return {"cublas": lambda a, sparse, semi, b: torch.matmul(a, b),
            "attnlab": lambda a, sparse, semi, b: matmul(a, b),
            "dense_mma_sync": sparse_step("s01"),
            "sparse24": lambda a, sparse, semi, b: sparse_matmul(sparse, b),
            "sparse24_mma_sync": sparse_step("s02"),
            "torch_semi_structured": semi_structured,
            "online_int8": lambda a, sparse, semi, b: online_int8_matmul(a, b)}


def int8_impls() -> dict[str, Callable]:
    """``int_mm`` (``torch._int_mm``, int32 out) and ``attnlab`` (``int8_matmul``, bf16 out
    with the zero-point term)."""
    from attnlab.gemm import int8_matmul

    return {"int_mm": lambda a, b, *_: torch._int_mm(a, b),
            "attnlab": lambda a, b, sa, sb, zb: int8_matmul(a, b, sa, sb, zero_b=zb)}


def gemm_impls(configs: dict[str, object] | None = None) -> dict[str, Callable]:
    """``cublas`` (``torch.matmul``) and ``attnlab`` (``attnlab.gemm.matmul``, default
    dispatch), plus ``attnlab[name]`` for each named ``GemmConfig`` in ``configs``."""
    from attnlab.gemm import matmul

    impls: dict[str, Callable] = {"cublas": torch.matmul, "attnlab": matmul}
    for name, cfg in (configs or {}).items():
        impls[f"attnlab[{name}]"] = lambda a, b, cfg=cfg: matmul(a, b, config=cfg)
    return impls


def measure_gemm(points: list, impls: dict[str, Callable], l2_bytes: int, *,
                 runs: int = 30, on_point: Callable[[object], None] | None = None,
                 make_sets: Callable[[object, int], list[tuple]] = gemm_sets
                 ) -> list[GemmResult]:
    """Every implementation at every point, each called on ``make_sets(point, l2_bytes)``'s
    input sets in turn (any point with ``flops`` and ``label()``: the conv bench's too); an
    implementation that fails at a point is reported with its error and left out of that
    point's timing."""
    results: list[GemmResult] = []
    for point in points:
        sets = make_sets(point, l2_bytes)
        fns = {name: (lambda i, fn=fn, sets=sets: fn(*sets[i % len(sets)]))
               for name, fn in impls.items()}
        failed: dict[str, str] = {}
        for name in list(fns):
            try:
                fns[name](0)
            except Exception as exc:  # reported per implementation, not fatal to the bench
                failed[name] = f"{type(exc).__name__}: {exc}"
                del fns[name]
        try:
            device = sample_interleaved(fns, runs=runs, rotations=len(sets))
            first = {name: summarize(ms).median_ms for name, ms in device.items()}
            e2e = sample_back_to_back(
                fns, calls={name: calls_per_span(ms) for name, ms in first.items()},
                rotations=len(sets))
        except TimedCallError as exc:
            failed[exc.name] = str(exc)
            device, e2e = {}, {}
        for name in impls:
            if name in failed or name not in device:
                results.append(GemmResult(point, name, None, error=failed.get(name)))
            else:
                results.append(GemmResult(point, name, summarize(e2e[name]),
                                          summarize(device[name])))
        del sets
        torch.cuda.empty_cache()
        if on_point is not None:
            on_point(point)
    return results


def best_lines(results: list[GemmResult], points: list, peer: str, top: int = 5,
               also: str | None = None) -> list[str]:
    """Per point, the ``top`` fastest implementations end to end as ratios to ``peer`` (device
    only in brackets), and ``also``'s ratio wherever it ranked: a candidate sweep's summary."""
    lines = []
    for point in points:
        mine = [r for r in results if r.point == point and r.tflops]
        ref = next(r for r in mine if r.impl == peer)
        best = sorted(mine, key=lambda r: -r.tflops)[:top]
        line = f"{point.label()} {peer} {ref.tflops:.0f} ({ref.device_tflops:.0f}) " + " | ".join(
            f"{r.impl} {r.tflops / ref.tflops:.2f}x ({r.device_tflops / ref.device_tflops:.2f})"
            for r in best)
        if also is not None:
            line += " | " + also + " " + next((f"{r.tflops / ref.tflops:.2f}x" for r in mine
                                               if r.impl == also), "-")
        lines.append(line)
    return lines
