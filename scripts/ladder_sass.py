"""Static SASS deltas of every ladder step against its base, for docs/ladder.md.

Usage: python scripts/ladder_sass.py [--head-dim 128] > table.md
Cross-compiles each named config for sm_80 and sm_90a (no GPU needed) and prints one
markdown row per step and arch: registers, stack, and the counts the seeds argue with.
"""

from __future__ import annotations

import argparse
import functools

from attnlab import ladder
from attnlab.analysis.resources import kernel_resources
from attnlab.analysis.sass import build_report, disassemble, histogram, parse
from attnlab.compile import compile_config

COLUMNS = ("regs", "stack", "instr", "HMMA", "LDSM", "LDGSTS", "BAR", "IMAD+IADD3+LEA",
           "LOP3+SHF", "CS2R", "LDSM addr regs", "copies->HMMA")


@functools.cache  # each base is also a step: analyse it once
def row(name: str, arch: str, head_dim: int) -> dict[str, int]:
    art = compile_config(ladder.NAMED[name], arch, head_dim=head_dim)
    text = disassemble(art.cubin)
    instructions = parse(text)
    ops = histogram(instructions)
    report = build_report(instructions, label=name, arch=arch)
    res = kernel_resources(art, text)
    return {"regs": res.registers, "stack": res.stack_bytes, "instr": report.instructions,
            "HMMA": ops["HMMA"], "LDSM": ops["LDSM"], "LDGSTS": ops["LDGSTS"],
            "BAR": ops["BAR"], "IMAD+IADD3+LEA": ops["IMAD"] + ops["IADD3"] + ops["LEA"],
            "LOP3+SHF": ops["LOP3"] + ops["SHF"], "CS2R": report.cs2r,
            "LDSM addr regs": report.distinct_address_registers("LDSM"),
            "copies->HMMA": report.copies_feeding_hmma_total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    print("| step | vs | arch | " + " | ".join(COLUMNS) + " |")
    print("| --- | --- | --- |" + " ---: |" * len(COLUMNS))
    for name, base in ladder.BASES.items():
        for arch in ("sm_80", "sm_90a"):
            new, old = row(name, arch, args.head_dim), row(base, arch, args.head_dim)
            cells = [str(new[c]) if new[c] == old[c] else f"{old[c]} → {new[c]}"
                     for c in COLUMNS]
            print(f"| {name} | {base} | {arch} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
