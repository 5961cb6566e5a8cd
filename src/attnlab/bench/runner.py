"""Running implementations over a grid of problems, all in one process on the same inputs.

A *point* is one problem (shape, dtype, mask); an *implementation* is attnlab with a config or
a peer library. For each point every implementation sees the same rotating input sets, so a
ratio to the reference is measured, never assembled from two runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from attnlab.bench.timing import (
    Clock,
    TimedCallError,
    Timing,
    attention_flops,
    calls_per_span,
    sample_back_to_back,
    sample_interleaved,
    summarize,
    tflops,
)
from attnlab.config import FlashConfig

#: Rotate input sets until they span this multiple of the L2 cache.
L2_SPAN = 3
MAX_INPUT_SETS = 8
#: The reference of every ratio: FlashAttention-2 as shipped in torch SDPA.
REFERENCE = "sdpa_flash"

#: A point's mask as implementations take it: causal (True) or not (False), or a sliding
#: window ``(left, right)`` (FlashAttention's ``window_size``; -1 leaves a side unbounded).
Mask = bool | tuple[int, int]
#: ``fn(q, k, v, scale, mask)`` on BSHD tensors (k/v may have fewer heads).
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, Mask], object]

#: What a point times, and its FLOPs in forwards: the backward's five GEMMs of the forward's
#: size against the forward's two (the convention of the FlashAttention papers).
WORK_FLOPS = {"forward": 1.0, "forward+backward": 3.5, "backward": 2.5}


@dataclass(frozen=True)
class Point:
    """One benchmark problem: BSHD shapes, dtype, causal or a sliding ``window`` (left, right),
    and K/V heads for GQA."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    head_dim: int
    dtype: str = "bfloat16"
    causal: bool = False
    heads_kv: int | None = None  # None: as many as the query heads (MHA)
    work: str = "forward"  # a key of WORK_FLOPS
    window: tuple[int, int] | None = None  # a sliding window instead of causal / full

    def __post_init__(self) -> None:
        if self.work not in WORK_FLOPS:
            raise ValueError(f"work must be one of {list(WORK_FLOPS)}, got {self.work!r}")
        if self.window is not None:
            if self.causal:
                raise ValueError("a sliding window replaces causal: give one or the other")
            # A window read back from JSON is a list.
            object.__setattr__(self, "window", tuple(self.window))

    @property
    def mask(self) -> Mask:
        """What implementations take as their mask argument."""
        return self.window if self.window is not None else self.causal

    @property
    def kv_heads(self) -> int:
        return self.heads if self.heads_kv is None else self.heads_kv

    @property
    def flops(self) -> float:
        return WORK_FLOPS[self.work] * attention_flops(
            self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal,
            self.window)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def label(self) -> str:
        mask = f" window {self.window}" if self.window is not None else (
            " causal" if self.causal else "")
        gqa = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        work = "" if self.work == "forward" else f" {self.work}"
        return (f"{self.dtype} hd{self.head_dim} B={self.batch} H={self.heads}{gqa} "
                f"Sq={self.seqlen_q} Sk={self.seqlen_k}{mask}{work}")


@dataclass(frozen=True)
class Result:
    """One implementation timed at one point: ``timing`` end to end (host and device, what an
    eager caller sees: the headline), ``device_timing`` the kernels alone."""

    point: Point
    impl: str
    timing: Timing | None
    error: str | None = None
    device_timing: Timing | None = None

    @property
    def tflops(self) -> float | None:
        return tflops(self.point.flops, self.timing.median_ms) if self.timing else None

    @property
    def device_tflops(self) -> float | None:
        if self.device_timing is None:
            return None
        return tflops(self.point.flops, self.device_timing.median_ms)

    def to_dict(self) -> dict[str, object]:
        return {"point": asdict(self.point), "impl": self.impl,
                "timing": self.timing.to_dict() if self.timing else None,
                "tflops": self.tflops, "error": self.error,
                "device_timing": self.device_timing.to_dict() if self.device_timing else None,
                "device_tflops": self.device_tflops}


def tokens_grid(tokens: int, hidden: int, seqlens: Iterable[int], head_dims: Iterable[int],
                dtypes: Iterable[str], causal: Iterable[bool] = (False,),
                gqa_group: int = 1) -> list[Point]:
    """The FlashAttention papers' grid: ``tokens`` per batch, ``heads = hidden / head_dim``;
    with ``gqa_group`` > 1, each K/V head serves that many query heads."""
    points = []
    for dtype in dtypes:
        for is_causal in causal:
            for head_dim in head_dims:
                heads = hidden // head_dim
                kv_heads = None if gqa_group == 1 else max(1, heads // gqa_group)
                for seqlen in seqlens:
                    points.append(Point(max(1, tokens // seqlen), seqlen, seqlen, heads,
                                        head_dim, dtype, is_causal, kv_heads))
    return points


#: Seed 004's cross-attention shapes (Sq x Sk): image tokens attending to a CLIP-77 text
#: context or to a 256-token latent.
CROSS_SHAPES: tuple[tuple[int, int], ...] = ((256, 77), (1024, 256), (4096, 77))


def cross_grid(batch: int, heads: int, head_dims: Iterable[int], dtypes: Iterable[str]
               ) -> list[Point]:
    """Cross-attention points: every ``CROSS_SHAPES`` (Sq, Sk), head dim and dtype."""
    return [Point(batch, sq, sk, heads, head_dim, dtype)
            for dtype in dtypes for head_dim in head_dims for sq, sk in CROSS_SHAPES]


def attnlab_impl(config: FlashConfig | None = None) -> AttentionFn:
    """attnlab as a user calls it: ``attention()``, which allocates its output, with
    ``config`` or (None) the config it picks for the problem."""
    from attnlab.api import attention

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            mask: Mask = False) -> torch.Tensor:
        if isinstance(mask, tuple):
            return attention(q, k, v, softmax_scale=scale, window_size=mask, config=config)
        return attention(q, k, v, softmax_scale=scale, causal=mask, config=config)

    return run


def training_impl(fn: AttentionFn, work: str) -> AttentionFn:
    """``fn`` as training runs it: ``"forward+backward"`` is one forward on inputs that
    require grad and ``torch.autograd.grad`` of its output for a random dO; ``"backward"``
    is that gradient alone, from a graph built once per input set (``retain_graph``) and
    kept. dO is random, one per output shape. An implementation without a backward fails
    on its first call, which ``measure_point`` records as its row's error."""
    if work not in ("forward+backward", "backward"):
        raise ValueError(f"training_impl times a backward, got work={work!r}")
    grads: dict[tuple, torch.Tensor] = {}
    graphs: dict[tuple, tuple] = {}

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                mask: Mask) -> tuple:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
        out = fn(*leaves, scale, mask)
        key = (out.shape, out.dtype, out.device)
        if key not in grads:
            grads[key] = torch.randn_like(out)
        return out, leaves, grads[key]

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            mask: Mask = False) -> tuple[torch.Tensor, ...]:
        if work == "forward+backward":
            out, leaves, grad = forward(q, k, v, scale, mask)
            return torch.autograd.grad(out, leaves, grad)
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), scale, mask)
        if key not in graphs:
            graphs[key] = forward(q, k, v, scale, mask)
        out, leaves, grad = graphs[key]
        return torch.autograd.grad(out, leaves, grad, retain_graph=True)

    return run


def input_sets(point: Point, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Fresh random q/k/v sets, enough of them to span ``L2_SPAN`` x the L2 cache."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    elem = torch.finfo(point.torch_dtype).bits // 8
    # q and the output, k and v.
    per_set = elem * point.batch * point.heads * point.head_dim * 2 * (
        point.seqlen_q + point.seqlen_k)
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    count = max(1, min(MAX_INPUT_SETS, math.ceil(L2_SPAN * l2 / per_set)))

    def randn(seqlen: int, heads: int) -> torch.Tensor:
        return torch.randn(point.batch, seqlen, heads, point.head_dim, device="cuda",
                           dtype=point.torch_dtype, generator=gen)

    return [(randn(point.seqlen_q, point.heads), randn(point.seqlen_k, point.kv_heads),
             randn(point.seqlen_k, point.kv_heads)) for _ in range(count)]


def measure_point(point: Point, impls: dict[str, AttentionFn], *, runs: int = 30,
                  warmup: int = 5, on_impl: Callable[[str], None] | None = None,
                  sets: list[tuple[torch.Tensor, ...]] | None = None,
                  clock: Clock | None = None) -> list[Result]:
    """Time each implementation at one point, device only and end to end; a failing
    implementation records its error.

    Both timings go round-robin over the implementations (``timing``), so a GPU whose clocks
    drift during the point favours none of them; the end-to-end spans hold as many calls as
    make them last ``timing.SPAN_MS``, judged from the device time. ``on_impl(name)`` is
    called as each implementation is done (progress). ``sets`` (default:
    ``input_sets(point)``) and ``clock`` (default: CUDA events) let tests run it without a GPU.
    """
    sets = input_sets(point) if sets is None else sets
    scale = 1.0 / math.sqrt(point.head_dim)
    errors: dict[str, str] = {}
    active: dict[str, Callable[[int], object]] = {}
    for name, fn in impls.items():
        try:
            fn(*sets[0], scale, point.mask)  # compiles / builds plans: not timed
            active[name] = lambda i, fn=fn: fn(*sets[i], scale, point.mask)
        except Exception as exc:  # a peer that cannot run this shape is a row, not a crash
            errors[name] = f"{type(exc).__name__}: {exc}"
            if on_impl is not None:
                on_impl(name)
    device: dict[str, list[float]] = {}
    end_to_end: dict[str, list[float]] = {}
    while active and not end_to_end:
        try:
            if not device:
                device = sample_interleaved(active, warmup=warmup, runs=runs,
                                            rotations=len(sets), clock=clock)
            calls = {name: calls_per_span(summarize(device[name]).median_ms)
                     for name in active}
            end_to_end = sample_back_to_back(active, calls=calls, rounds=runs, warmup=warmup,
                                             rotations=len(sets), clock=clock)
        except TimedCallError as exc:  # drop it, time the others again
            errors[exc.name] = str(exc)
            del active[exc.name]
            device = {}
            if on_impl is not None:
                on_impl(exc.name)
    for name in end_to_end:
        if on_impl is not None:
            on_impl(name)
    return [Result(point, name, None, errors[name]) if name in errors
            else Result(point, name, summarize(end_to_end[name]),
                        device_timing=summarize(device[name])) for name in impls]


def measure_grid(points: Sequence[Point], impls: dict[str, AttentionFn], *, runs: int = 30,
                 warmup: int = 5, on_point: Callable[[Point], None] | None = None
                 ) -> list[Result]:
    """``measure_point`` over a grid; ``on_point`` is called after each point (progress)."""
    results: list[Result] = []
    for point in points:
        results.extend(measure_point(point, impls, runs=runs, warmup=warmup))
        if on_point is not None:
            on_point(point)
    return results


def ratios(results: Sequence[Result], reference: str = REFERENCE, *, device: bool = False
           ) -> dict[tuple[Point, str], float]:
    """Speed of each (point, implementation) relative to the reference at the same point, end
    to end (or, with ``device``, device only)."""
    def ms(r: Result) -> float | None:
        timing = r.device_timing if device else r.timing
        return timing.median_ms if timing is not None else None

    ref_ms = {r.point: ms(r) for r in results if r.impl == reference and ms(r) is not None}
    return {(r.point, r.impl): ref_ms[r.point] / ms(r) for r in results
            if ms(r) is not None and r.point in ref_ms}


def harmonic_mean(values: Sequence[float]) -> float:
    """The seeds' summary of a ratio over sequence lengths (dominated by the worst point)."""
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"harmonic mean needs positive values, got {list(values)}")
    return len(values) / sum(1.0 / v for v in values)
