"""The Hopper forward table of issue 19, in one run: attnlab's default against FA4, cuDNN and
FA2 (SDPA flash), bf16 and fp16, end to end and device only.

Usage (GPU): python scripts/hopper_table.py [--out DIR] [--runs N] [--quick] [--head-dims 256]
       (no GPU): python scripts/hopper_table.py --summarize OUT/hopper_table.json
Points: hd 64 / 128 / 256 over seq 1k-16k (16k tokens, hidden 2048), causal and not; hd 32 /
96 / 192 at seq 4k (batch 4, 16 heads); GQA 32/8 at hd128 seq 4k; one ragged varlen batch
(hd128, 16 heads, 32k tokens in 16 sequences; FA4 is its only peer: SDPA takes no packed
sequences). Prints one line per point (attnlab, the better of FA4 and cuDNN, the ratio),
writes every number to OUT/hopper_table.json, and ends with the summary against issue 19's
targets (``summary``), which ``--summarize`` prints again from a saved table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import torch

from attnlab.bench.baselines import available_peers
from attnlab.bench.ragged import RaggedBatch
from attnlab.bench.runner import Point, Result, attnlab_impl, measure_point, tokens_grid

PEERS = ("sdpa_flash", "sdpa_cudnn", "fa4")
#: Issue 19's targets: >= 1.05x the better of FA4 and cuDNN at hd 64 / 128 / 256 from seq 2k,
#: >= 1.0x at hd 32 / 96 / 192, GQA and varlen.
MAIN_TARGET, OTHER_TARGET = 1.05, 1.0
_MAIN = re.compile(r"hd(64|128|256) B=\d+ H=\d+ Sq=(2048|4096|8192|16384) ")
_OTHER = re.compile(r"hd(32|96|192) |H=\d+/\d+ |varlen")


def grid(dtypes: list[str], quick: bool, head_dims: list[int] | None = None) -> list[Point]:
    """The table's dense points; ``head_dims``: only the seq 1k-16k rows of these (64, 128,
    256), e.g. after a change to one head dim's kernel."""
    seqlens = [4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384]
    points = tokens_grid(16384, 2048, seqlens, head_dims or [64, 128, 256], dtypes,
                         (False, True))
    if head_dims:
        return points
    points += [Point(4, 4096, 4096, 16, hd, dtype, causal)
               for dtype in dtypes for causal in (False, True) for hd in (32, 96, 192)]
    points += tokens_grid(16384, 4096, [4096], [128], dtypes, (False, True), gqa_group=4)
    return points


def varlen_rows(dtype: str, causal: bool, runs: int) -> dict:
    """attnlab and FA4 on the ragged batch (``bench.ragged``)."""
    batch = RaggedBatch(128, dtype)
    impls = {"attnlab": batch.attnlab(), "fa4": batch.fa4()}
    return batch.measure({n: fn for n, fn in impls.items() if fn is not None}, causal, runs)


def dense_row(results: list[Result]) -> dict:
    row = {"point": results[0].point.label()}
    for r in results:
        row[r.impl] = [r.tflops, r.device_tflops, r.error]
    return row


def line(row: dict) -> str:
    def cell(name: str) -> str:
        value = row.get(name)
        if not value or value[0] is None:
            return f"{name} -"
        return f"{name} {value[0]:.0f}({value[1]:.0f})"

    measured = ratios(row)
    ratio = f"{measured[0]:.3f}" if measured else "-"
    return f"{row['point']}: {'  '.join(cell(n) for n in ('attnlab', *PEERS))}  x{ratio}"


def ratios(row: dict) -> tuple[float, float] | None:
    """attnlab / the better of FA4 and cuDNN, end to end and device only (None: no peer)."""
    out = []
    for i in (0, 1):
        best = max((row[p][i] for p in ("fa4", "sdpa_cudnn") if row.get(p) and row[p][i]),
                   default=None)
        ours = (row.get("attnlab") or [None, None])[i]
        if not best or not ours:
            return None
        out.append(ours / best)
    return out[0], out[1]


def summary(rows: list[dict]) -> list[str]:
    """The geometric means and issue 19's targets over ``rows``: how many points meet each,
    and every miss with its end-to-end (device-only) ratio."""
    measured = {row["point"]: r for row in rows if (r := ratios(row)) is not None}

    def geomean(i: int) -> float:
        return math.exp(sum(math.log(r[i]) for r in measured.values()) / len(measured))

    lines = [f"geomean attnlab / best of FA4 and cuDNN: {geomean(0):.3f} end to end, "
             f"{geomean(1):.3f} device only, over {len(measured)} points"]
    for label, pattern, target in (("hd 64/128/256 from 2k", _MAIN, MAIN_TARGET),
                                   ("hd 32/96/192, GQA, varlen", _OTHER, OTHER_TARGET)):
        points = {p: r for p, r in measured.items() if pattern.search(p)}
        misses = sorted((r[0], p, r[1]) for p, r in points.items() if r[0] < target)
        lines.append(f">= {target:.2f}x at {label}: {len(points) - len(misses)} of {len(points)}")
        lines += [f"  miss {p}: {e2e:.3f} ({device:.3f})" for e2e, p, device in misses]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="seq 4k and 16k only, bf16")
    parser.add_argument("--head-dims", default=None,
                        help="only the seq 1k-16k rows of these head dims (comma-separated "
                             "among 64,128,256; no varlen, GQA or other head dims)")
    parser.add_argument("--summarize", type=Path, default=None,
                        help="print the summary of a saved hopper_table.json and exit")
    args = parser.parse_args()
    if args.summarize is not None:
        print("\n".join(summary(json.loads(args.summarize.read_text())["rows"])))
        return
    dtypes = ["bfloat16"] if args.quick else ["bfloat16", "float16"]
    peers = {name: fn for name, fn in available_peers().items() if name in PEERS}
    impls = {"attnlab": attnlab_impl(), **peers}
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)

    def add(row: dict) -> None:
        # Written after every point: a run cut short keeps what it measured.
        rows.append(row)
        print(line(row), flush=True)
        (args.out / "hopper_table.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))

    head_dims = [int(h) for h in args.head_dims.split(",")] if args.head_dims else None
    if head_dims is None:
        for dtype in dtypes:
            for causal in (False, True):
                add(varlen_rows(dtype, causal, args.runs))
    for point in grid(dtypes, args.quick, head_dims):
        add(dense_row(measure_point(point, impls, runs=args.runs)))
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
