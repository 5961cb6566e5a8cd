"""Summarise an ncu source page (``ncu -i REP --page source --csv --print-source sass``):
warp-stall samples by reason and the instructions with the most samples.

Usage: python scripts/ncu_stalls.py SOURCE.csv [--top 24]
"""

from __future__ import annotations

import argparse
import collections
import csv


def _int(text: str) -> int:
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=24)
    args = parser.parse_args()
    rows = list(csv.reader(open(args.csv)))
    header, data = rows[1], rows[2:]
    reasons = [i for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name]
    samples = header.index("Warp Stall Sampling (All Samples)")
    total = sum(_int(r[samples]) for r in data)
    by_reason = collections.Counter()
    for r in data:
        for i in reasons:
            by_reason[header[i]] += _int(r[i])
    print(f"# warp stall samples: {total}")
    for name, count in by_reason.most_common(10):
        print(f"{name:24s} {count:9d} {count / total:6.3f}")
    print("# instructions with the most samples: samples, address, SASS, top two reasons")
    for r in sorted(data, key=lambda r: -_int(r[samples]))[:args.top]:
        top = sorted(((_int(r[i]), header[i]) for i in reasons), reverse=True)[:2]
        print(f"{_int(r[samples]):8d} {r[0][-5:]} {r[1].strip()[:58]:58s} "
              + ", ".join(f"{name} {count}" for count, name in top))


if __name__ == "__main__":
    main()
