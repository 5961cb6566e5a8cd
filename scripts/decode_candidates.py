"""Time decoding-kernel candidates (split counts, merges) on the GPU.

Usage (GPU): python scripts/decode_candidates.py [--combine | --merge | --paged | --tma]
[--layout paged] [--points B:KEYS:HQ:HKV,...] [--out DIR]
For a few points of ``attnlab bench --decode``'s grid (or ``--points``, hd128 bf16), the
default (what ``attention_with_kvcache`` picks) against twice, a half, a quarter and an eighth
of its split count, each merged as the call would merge it (``--layout paged``: on the paged
copy, the contiguous default beside), all through the same kernels
(``kernels/common/decode.py`` and the combine), round-robin on the same inputs; GB/s of K/V
read, median of the runs, device only and end to end (back-to-back calls). ``--combine``: instead,
the split decoding alone against it followed by the combine, at the default and at twice the
split count (what the merge costs). ``--merge``: instead, the combine kernel against the
serial merge (the last split merges) and, on sm_90a up to 16 splits, the cluster merge (the
splits' CTAs merge in distributed shared memory) at the default split count, contiguous and paged,
device only and end to end (back-to-back calls). ``--paged``: instead, the default on the
contiguous cache against it on the paged copy (``bench.decode.PAGE_SIZE`` keys a page,
shuffled), on a copy whose pages are in order, on copies shuffled only inside windows of 2
and 32 MiB of the pool, on one of 256-key pages, and (at half a wave) on the paged copy at
the split count a GPU on the other side of ``decode.PAGED_WHOLE_DRAM_PER_SM`` would take.
``--tma``: instead, K/V by TMA boxes (``DecodeSpec.tma_rows``, sm_90a) against the row
gathers, contiguous and paged, at the call's split counts, device only and end to end.
Results go to OUT/decode_candidates.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from attnlab import device, kernel_cache
from attnlab.bench.decode import PAGE_SIZE, decode_sets, kv_bytes, parse_points
from attnlab.bench.runner import Point
from attnlab.bench.timing import (
    MAX_CALLS_PER_SPAN,
    sample_back_to_back,
    sample_interleaved,
    summarize,
)
from attnlab.decode import choose_splits, decode_tile, serial_merge, tma_rows
from attnlab.kernels.abi import DECODE_WARPS, CombineSpec, DecodeSpec, encode_window

POINTS = [Point(64, 1, 4096, 8, 128, heads_kv=1), Point(8, 1, 32768, 8, 128, heads_kv=1),
          Point(1, 1, 131072, 8, 128, heads_kv=1), Point(1, 1, 4096, 32, 128, heads_kv=8),
          Point(8, 1, 4096, 32, 128, heads_kv=8), Point(8, 1, 32768, 32, 128, heads_kv=8),
          Point(1, 1, 32768, 8, 128, heads_kv=1), Point(1, 1, 4096, 8, 128, heads_kv=1),
          Point(1, 1, 32768, 32, 128, heads_kv=8), Point(1, 1, 131072, 32, 128, heads_kv=8)]


def runner(point: Point, sets: list, paged: bool, splits: int, stages: int, kpw: int,
           merge: str | None = "kernel", tma_rows: int = 0):
    """One variant's call; ``merge``: how a split decoding's partials are merged (by the
    combine ``"kernel"``, by the last split: ``"serial"``, in a cluster of the splits' CTAs:
    ``"cluster"``; None: not at all); ``tma_rows``:
    K/V by TMA boxes of that many keys (0: row gathers)."""
    info = device.info(torch.device("cuda"))
    serial = merge == "serial" and splits > 1
    cluster = splits if merge == "cluster" and splits > 1 else 0
    spec = DecodeSpec(info.arch, point.dtype, point.head_dim, paged, False, False,
                      splits > 1 and not cluster, kpw, stages, serial_merge=serial,
                      tma_rows=tma_rows, cluster_splits=cluster)
    decode = kernel_cache.get(spec).fn
    combine = (kernel_cache.get(CombineSpec(info.arch, point.dtype, point.head_dim)).fn
               if merge == "kernel" else None)
    b, sq, hq, d = point.batch, point.seqlen_q, point.heads, point.head_dim
    counters = torch.zeros(b * point.kv_heads * math.ceil(hq // point.kv_heads * sq / 16),
                           dtype=torch.int32, device="cuda")
    out = torch.empty(b, sq, hq, d, dtype=point.torch_dtype, device="cuda")
    lse = torch.empty(b, hq, sq, dtype=torch.float32, device="cuda")
    part = torch.empty(splits * b, sq, hq, d, dtype=torch.float32, device="cuda")
    part_lse = torch.empty(splits * b, hq, sq, dtype=torch.float32, device="cuda")
    left, right = encode_window((-1, -1))
    scale = d ** -0.5

    def run(i):
        q, k, v, kp, vp, table, seqlens = sets[i]
        kc, vc = (kp, vp) if paged else (k, v)
        table_ = table if paged else None
        if splits == 1 or cluster:
            decode(q, kc, vc, seqlens, None, table_, out, lse, scale, left, right, splits, None,
                   None, None)
        elif serial:
            decode(q, kc, vc, seqlens, None, table_, part, part_lse, scale, left, right, splits,
                   out, lse, counters)
        else:
            decode(q, kc, vc, seqlens, None, table_, part, part_lse, scale, left, right, splits,
                   None, None, None)
            if combine is not None:
                combine(part, part_lse, out, lse, splits)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--combine", action="store_true",
                        help="time the split decoding alone and with each combine")
    parser.add_argument("--paged", action="store_true",
                        help="time the default on the contiguous and on the paged cache")
    parser.add_argument("--tma", action="store_true",
                        help="time K/V by TMA boxes against the row gathers, contiguous and "
                             "paged, device only and end to end")
    parser.add_argument("--merge", action="store_true",
                        help="time the combine kernel against the serial merge, contiguous "
                             "and paged, device only and end to end")
    parser.add_argument("--layout", choices=("contiguous", "paged"), default="contiguous",
                        help="the split sweep's cache (paged: the contiguous default beside)")
    parser.add_argument("--cluster", action="store_true",
                        help="the split sweep also merges each count of up to 16 splits in a "
                             "cluster")
    parser.add_argument("--points", type=parse_points, default=None,
                        help="B:KEYS:HQ:HKV, comma-separated (default: the ten points)")
    args = parser.parse_args()
    info = device.info(torch.device("cuda"))
    rows = []
    points = POINTS if args.points is None else [
        Point(b, 1, keys, hq, 128, heads_kv=hkv) for b, keys, hq, hkv in args.points]
    for point in points:
        sets = decode_sets(point, info.l2_bytes, paged=True)
        kpw, stages = decode_tile(point.head_dim, info.arch)
        tiles = math.ceil(point.heads // point.kv_heads / 16)
        blocks = math.ceil(point.seqlen_k / (kpw * DECODE_WARPS))
        # The call's split count, contiguous and paged (a paged cache keeps two at half a
        # wave where the DRAM is fast for its SMs), and what the paged rule gives either way.
        ctas = tiles * point.batch * point.kv_heads
        auto_for = {paged: choose_splits(ctas, blocks, info.multiprocessors, paged,
                                         info.dram_bytes_per_s) for paged in (False, True)}
        paged_either = {choose_splits(ctas, blocks, info.multiprocessors, True, dram)
                        for dram in (0.0, math.inf)}
        auto = auto_for[False]
        variants = {}
        if args.combine:
            for splits in sorted({max(2, auto), min(128, 2 * max(2, auto))}):
                for combine in (False, True):
                    name = "combine" if combine else "no combine"
                    variants[f"splits={splits} {name}"] = runner(
                        point, sets, False, splits, stages, kpw, "kernel" if combine else None)
        if args.merge:
            for paged in (False, True):
                for merge in ("kernel", "serial", "cluster"):
                    if merge == "cluster" and not (1 < auto_for[paged] <= 16):
                        continue
                    variants[f"{'paged' if paged else 'contiguous'} {merge}"] = runner(
                        point, sets, paged, auto_for[paged], stages, kpw, merge)
        if args.paged:
            for paged in (False, True):
                variants["paged" if paged else "contiguous"] = runner(
                    point, sets, paged, auto_for[paged], stages, kpw)
            # The same pages in order: what the pages' scatter costs, apart from the walk's
            # page lookups.
            in_order = decode_sets(point, info.l2_bytes, paged=True, shuffled=False)
            variants["paged in order"] = runner(point, in_order, True, auto_for[True], stages,
                                                kpw)
            # Shuffled only inside windows of the pool (how many distinct 2 MiB translation
            # pages a walk touches), and in pages of 256 keys (fewer page starts a block).
            page_bytes = PAGE_SIZE * point.kv_heads * point.head_dim * 2
            for mib in (2, 32):
                window = max(1, (mib << 20) // page_bytes)
                local = decode_sets(point, info.l2_bytes, paged=True, window=window)
                variants[f"paged in {mib} MiB windows"] = runner(point, local, True,
                                                                 auto_for[True], stages, kpw)
            large = decode_sets(point, info.l2_bytes, paged=True, page_size=256)
            variants["paged 256-key pages"] = runner(point, large, True, auto_for[True], stages,
                                                     kpw)
            for splits in sorted(paged_either - {auto_for[True]}):
                # The paged cache at the split count of the GPUs on the rule's other side.
                variants[f"paged splits={splits}"] = runner(point, sets, True, splits, stages,
                                                            kpw)
        if args.tma:
            for paged in (False, True):
                layout = "paged" if paged else "contiguous"
                splits = auto_for[paged]
                merge = "serial" if serial_merge(splits, blocks) else "kernel"
                box_rows = {"gathers": 0, "tma": tma_rows(
                    info.arch, kpw * DECODE_WARPS, PAGE_SIZE if paged else None, enabled=True)}
                for how, n in box_rows.items():
                    variants[f"{layout} {how}"] = runner(point, sets, paged, splits, stages,
                                                         kpw, merge, n)
        if not (args.combine or args.paged or args.merge or args.tma):
            # The default tile at the chosen split count, at twice it and at a half, a
            # quarter and an eighth of it, each merged as ``attention_with_kvcache`` would
            # merge it; on the paged copy, the contiguous call's default beside.
            paged = args.layout == "paged"
            if paged:
                merge = "serial" if serial_merge(auto, blocks) else "kernel"
                variants[f"contiguous splits={auto}"] = runner(point, sets, False, auto,
                                                               stages, kpw, merge)
            chosen = auto_for[paged]
            counts = {max(1, chosen // f) for f in (1, 2, 4, 8)} | {min(128, 2 * chosen)}
            for splits in sorted(counts, reverse=True):
                merge = "serial" if serial_merge(splits, blocks) else "kernel"
                variants[f"{args.layout} splits={splits} {merge}"] = runner(
                    point, sets, paged, splits, stages, kpw, merge)
                if args.cluster and 1 < splits <= 16:
                    variants[f"{args.layout} splits={splits} cluster"] = runner(
                        point, sets, paged, splits, stages, kpw, "cluster")
        samples = sample_interleaved(variants, runs=args.runs, rotations=len(sets))
        spans = (sample_back_to_back(variants, calls=dict.fromkeys(variants, MAX_CALLS_PER_SPAN),
                                     rounds=args.runs, rotations=len(sets))
                 if not (args.combine or args.paged) else {})
        line = [f"{point.label()} (auto splits {auto}):"]
        for name, ms in samples.items():
            gbs = kv_bytes(point) / (summarize(ms).median_ms * 1e-3) / 1e9
            row = {"point": point.label(), "variant": name, "gbs": gbs}
            line.append(f"{name} {gbs:.0f}")
            if name in spans:
                row["end_to_end_gbs"] = kv_bytes(point) / (summarize(spans[name]).median_ms
                                                           * 1e-3) / 1e9
                line[-1] += f" ({row['end_to_end_gbs']:.0f} e2e)"
            rows.append(row)
        print("  ".join(line), flush=True)
        del sets
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_candidates.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
