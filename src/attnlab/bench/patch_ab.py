"""A/B timing of control-code edits: seed 004's CuAssembler experiments (``IMMA S04 -> S02``,
``HMMA S08 -> S04``) on attnlab's own kernels.

A forward config is compiled once; each edit set patches a copy of its binary
(``analysis.cubin_patch``, ``kernel_cache.load_patched``). The original and every patched
kernel then run on the same inputs: each output is compared with the original's (bitwise: an
edit changes when instructions issue, not what they compute, so any difference means a
stall too short for a dependency the hardware does not interlock), and all are timed
round-robin in one run (``timing.sample_interleaved``), device time per call, with a 95 %
confidence interval of each median from the order statistics of the samples.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from attnlab import kernel_cache, runtime
from attnlab.analysis.cubin_patch import StallEdit, patch_stalls
from attnlab.bench.runner import Point, input_sets
from attnlab.bench.timing import sample_interleaved
from attnlab.config import FlashConfig
from attnlab.validation import describe

#: z of a two-sided 95 % interval.
Z95 = 1.96


@dataclass(frozen=True)
class PatchResult:
    """One variant: the edits (``"original"`` for none), instructions changed, the median
    device time and its 95 % interval (ms), and how far its output is from the original's."""

    variant: str
    changed: int
    median_ms: float
    ci_ms: tuple[float, float]
    max_abs_diff: float
    identical: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def median_ci(samples: list[float], z: float = Z95) -> tuple[float, float]:
    """Distribution-free interval of the median: the order statistics ``n/2 -+ z sqrt(n)/2``
    (the binomial's normal approximation), clipped to the samples."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    n = len(ordered)
    half = z * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return ordered[lo], ordered[max(lo, hi)]


def run_ab(point: Point, config: FlashConfig | None, variants: dict[str, list[StallEdit]],
           *, runs: int = 50) -> list[PatchResult]:
    """Time ``config``'s forward kernel (None: the one a call picks) at ``point`` against
    each edited copy of it (the first result is the original)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the A/B timing of control-code edits needs a CUDA GPU")
    sets = input_sets(point)
    q, k, v = sets[0]
    scale = point.head_dim ** -0.5
    window = (-1, 0) if point.causal else (-1, -1)
    problem = describe(q, k, scale, window, None, None, None)
    base = runtime.launch_for(q, k, v, None, problem, config, with_lse=False)
    if base.spec is None:
        raise ValueError(f"{point.label()} has no work to time")
    launches = {"original": (base, 0)}
    with tempfile.TemporaryDirectory() as folder:
        for name, edits in variants.items():
            changed = 0

            def patch(binary: bytes, edits=edits) -> bytes:
                nonlocal changed
                patched, changed = patch_stalls(binary, edits)
                return patched

            kernel = kernel_cache.load_patched(base.spec, patch, Path(folder))
            launches[name] = (runtime.Launch(kernel.fn, base.softmax_scale,
                                             (base.left, base.right), base.max_seqlen_q,
                                             base.num_ctas, base.spec), changed)
        outs = {name: [torch.empty_like(s[0]) for s in sets] for name in launches}

        def call(name: str):
            launch = launches[name][0]
            return lambda i: launch(*sets[i], outs[name][i], None)

        return _compare_and_time({name: call(name) for name in launches},
                                 {name: changed for name, (_, changed) in launches.items()},
                                 outs, runs)


def run_cubin_ab(kernel: str, variants: dict[str, list[StallEdit]], *, runs: int = 50,
                 size: int = 4096) -> list[PatchResult]:
    """The same A/B on a CUDA C++ kernel of the front-end study (``cuda:igemm_tile``,
    ``cuda:hgemm_tile``: nvcc's WMMA tiles, whose IMMA / HMMA are the lab's edits' subject;
    attnlab's own INT8 GEMM issues IGMMA): built by nvcc for this GPU, each edit a patched
    copy of the cubin, a ``size``-cubed GEMM on random operands (small integers for s8: the
    int32 sums are exact, so any change in the output is an error)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the A/B timing of control-code edits needs a CUDA GPU")
    from attnlab import device
    from attnlab.bench.cubin import CubinFunction
    from attnlab.studies.frontend_sources import CUDA_SOURCES
    from attnlab.studies.frontends import build_nvcc, cuda_launch

    if kernel not in ("igemm_tile", "hgemm_tile"):
        raise ValueError(f"cuda:{kernel}: the A/B takes cuda:igemm_tile or cuda:hgemm_tile")
    with tempfile.TemporaryDirectory() as folder:
        build = build_nvcc(kernel, device.info(torch.device("cuda")).arch, Path(folder))
        if build.cubin is None:
            raise RuntimeError(f"nvcc could not build {kernel}: {build.error}")
        original = build.cubin.read_bytes()
    symbol = CUDA_SOURCES[kernel][1]
    functions = {"original": (CubinFunction(original, symbol), 0)}
    for name, edits in variants.items():
        patched, changed = patch_stalls(original, edits)
        functions[name] = (CubinFunction(patched, symbol), changed)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if kernel == "igemm_tile":
        a, b = (torch.randint(-8, 8, (size, size), device="cuda", dtype=torch.int8,
                              generator=gen) for _ in range(2))
        out_dtype = torch.int32
    else:
        a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        out_dtype = torch.float32
    outs = {name: [torch.empty(size, size, device="cuda", dtype=out_dtype)]
            for name in functions}

    def call(name: str):
        function = functions[name][0]
        return lambda i: function.launch(*cuda_launch(kernel, (a, b, outs[name][i])))

    return _compare_and_time({name: call(name) for name in functions},
                             {name: changed for name, (_, changed) in functions.items()},
                             outs, runs)


def _compare_and_time(calls: dict, changed: dict[str, int], outs: dict[str, list],
                      runs: int) -> list[PatchResult]:
    """Time ``calls`` round-robin (``calls[name](i)`` writes ``outs[name][i]``), then write
    every output afresh over poison and compare it with the original's, bitwise."""
    sets = len(outs["original"])
    samples = sample_interleaved(calls, runs=runs, rotations=sets)
    # The round-robin gives each variant only some of the input sets: every output is
    # written afresh, over poison (NaN, or int32's minimum), before the comparison.
    for name, call in calls.items():
        for i in range(sets):
            poison = (float("nan") if outs[name][i].is_floating_point()
                      else torch.iinfo(outs[name][i].dtype).min)
            outs[name][i].fill_(poison)
            call(i)
    torch.cuda.synchronize()
    results = []
    for name in calls:
        diff = max((outs[name][i].float() - outs["original"][i].float()).abs().max().item()
                   for i in range(sets))
        identical = all(torch.equal(outs[name][i], outs["original"][i]) for i in range(sets))
        results.append(PatchResult(name, changed[name], statistics.median(samples[name]),
                                   median_ci(samples[name]), diff, identical))
    return results
