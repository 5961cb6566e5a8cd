"""``attnlab bench --decode``: decoding steps against a KV cache, in GB/s of K/V read.

A point is (batch, cache length, query/K-V heads, query rows). Every implementation reads the
same keys: the peers (SDPA flash and cuDNN, FA4) take the cache as contiguous ``[B, L, Hkv,
D]`` tensors of exactly ``L`` keys, attnlab the same tensors (``attention_with_kvcache`` with
``cache_seqlens = L``) and, as ``attnlab_paged``, a paged copy of them (pages in shuffled
order, ``PAGE_SIZE`` keys each). Decoding is bound by reading K and V once, so beside time
and TFLOP/s the report gives the bandwidth ``2 B L Hkv D`` bytes / time and its share of the
measured DRAM read rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnlab.bench.runner import Point, Result, measure_point

PAGE_SIZE = 64
#: Input sets per point: enough copies that the sets together overflow L2.
MAX_SETS = 6


def decode_points(batches: list[int], cache_lens: list[int], groups: list[tuple[int, int]],
                  head_dim: int = 128, seqlen_q: int = 1, dtype: str = "bfloat16"
                  ) -> list[Point]:
    """The grid: every batch x cache length x (query heads, K/V heads)."""
    return [Point(b, seqlen_q, n, hq, head_dim, dtype, False, hkv)
            for hq, hkv in groups for n in cache_lens for b in batches]


def parse_points(text: str) -> tuple[tuple[int, int, int, int], ...]:
    """The scripts' ``--points``: ``"1:32768:8:1,1:131072:8:1"`` (batch, keys, query heads,
    K/V heads) -> ((1, 32768, 8, 1), (1, 131072, 8, 1))."""
    return tuple(tuple(int(v) for v in point.split(":")) for point in text.split(","))


def kv_bytes(point: Point) -> int:
    """Bytes of K and V one step reads."""
    return 2 * point.batch * point.seqlen_k * point.kv_heads * point.head_dim * 2


def decode_sets(point: Point, l2_bytes: int, paged: bool, seed: int = 0,
                shuffled: bool = True, window: int = 0, page_size: int = PAGE_SIZE
                ) -> list[tuple]:
    """Input sets ``(q, k, v, k_pages, v_pages, block_table, seqlens)``, as many as overflow
    L2 together (at least one); ``page_size`` keys a page, the pages in shuffled order (with
    ``window``, only within runs of that many consecutive pages of the pool), or
    (``shuffled`` off) each sequence's in order, one after another."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = point.torch_dtype
    sets = []
    for _ in range(set_count(point, l2_bytes)):
        q = torch.randn(point.batch, point.seqlen_q, point.heads, point.head_dim,
                        device="cuda", dtype=dt, generator=gen)
        k, v = (torch.randn(point.batch, point.seqlen_k, point.kv_heads, point.head_dim,
                            device="cuda", dtype=dt, generator=gen) for _ in range(2))
        seqlens = torch.full((point.batch,), point.seqlen_k, dtype=torch.int32, device="cuda")
        pages = table = None
        if paged:
            per_seq = -(-point.seqlen_k // page_size)
            order = page_order(point.batch * per_seq, shuffled, window, gen)
            table = order.view(point.batch, per_seq).to(torch.int32)
            pages = []
            for x in (k, v):
                pad = per_seq * page_size - point.seqlen_k
                flat = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).view(
                    point.batch * per_seq, page_size, point.kv_heads, point.head_dim)
                pool = torch.empty_like(flat)
                pool[order] = flat
                pages.append(pool)
        sets.append((q, k, v, *(pages or (None, None)), table, seqlens))
    return sets


def page_order(count: int, shuffled: bool, window: int, gen: torch.Generator) -> torch.Tensor:
    """Where each of ``count`` pages goes in the pool: in order, a permutation of the whole
    pool, or (``window``) a permutation inside each run of ``window`` pages."""
    if not shuffled:
        return torch.arange(count, device="cuda")
    if not window:
        return torch.randperm(count, device="cuda", generator=gen)
    keys = torch.rand(count, device="cuda", generator=gen)
    keys += torch.arange(count, device="cuda") // window
    return torch.argsort(keys)


def decode_impls(peers: dict[str, Callable]) -> dict[str, Callable]:
    """attnlab (contiguous and paged) and the peers, each taking a ``decode_sets`` set."""
    import attnlab

    def ours(q, k, v, k_pages, v_pages, table, seqlens, scale, causal):
        return attnlab.attention_with_kvcache(q, k, v, cache_seqlens=seqlens,
                                              softmax_scale=scale)

    def ours_paged(q, k, v, k_pages, v_pages, table, seqlens, scale, causal):
        return attnlab.attention_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                              block_table=table, softmax_scale=scale)

    impls = {"attnlab": ours, "attnlab_paged": ours_paged}
    for name, fn in peers.items():
        impls[name] = (lambda q, k, v, *_, fn=fn: fn(q, k, v, _[-2], _[-1]))
    return impls


def set_count(point: Point, l2_bytes: int) -> int:
    """How many input sets ``decode_sets`` builds for ``point``."""
    return max(1, min(MAX_SETS, math.ceil(3 * l2_bytes / max(kv_bytes(point), 1))))


def inputs_too_large(point: Point, l2_bytes: int, free_bytes: int) -> str | None:
    """Why ``point``'s inputs cannot be built in ``free_bytes`` of GPU memory, or None. Each
    set holds K and V twice (contiguous and paged) and, while a paged copy is made, one padded
    temporary of K's size: 2.5x ``kv_bytes`` a set (the queries are negligible)."""
    need = set_count(point, l2_bytes) * 5 * kv_bytes(point) // 2
    if need <= free_bytes:
        return None
    return (f"skipped: its {set_count(point, l2_bytes)} input set(s) need about "
            f"{need / 2**30:.1f} GiB of GPU memory, {free_bytes / 2**30:.1f} GiB are free")


def measure_decode(points: list[Point], peers: dict[str, Callable], l2_bytes: int, *,
                   runs: int = 30, on_point: Callable[[Point], None] | None = None
                   ) -> list[Result]:
    """Every implementation at every point (one point's inputs alive at a time); a point
    whose inputs do not fit in the free GPU memory is reported as skipped, with the sizes,
    and the others still run."""
    results: list[Result] = []
    impls = decode_impls(peers)
    for point in points:
        reason = inputs_too_large(point, l2_bytes, torch.cuda.mem_get_info()[0])
        if reason is not None:
            results += [Result(point, name, None, error=reason) for name in impls]
            if on_point is not None:
                on_point(point)
            continue
        sets = decode_sets(point, l2_bytes, paged=True)
        results += measure_point(point, impls, runs=runs, sets=sets)
        del sets
        torch.cuda.empty_cache()
        if on_point is not None:
            on_point(point)
    return results


def bandwidth_gbs(result: Result, device: bool = False) -> float | None:
    """GB/s of K/V read (end to end, or device only)."""
    timing = result.device_timing if device else result.timing
    if timing is None:
        return None
    return kv_bytes(result.point) / (timing.median_ms * 1e-3) / 1e9


def paged_over_contiguous(results: dict[str, Result]) -> tuple[float, float] | None:
    """``attnlab_paged``'s GB/s over ``attnlab``'s at one point, end to end and device only
    (issue 21's "paged within 5 %" target), from the unrounded timings; None where either
    did not run."""
    paged, contiguous = results.get("attnlab_paged"), results.get("attnlab")
    if paged is None or contiguous is None:
        return None
    ratios = []
    for device in (False, True):
        mine, theirs = bandwidth_gbs(paged, device), bandwidth_gbs(contiguous, device)
        if mine is None or theirs is None:
            return None
        ratios.append(mine / theirs)
    return ratios[0], ratios[1]
