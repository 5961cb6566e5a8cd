"""Digest the SASS of every named config and every default, to show a refactor changes no binary.

Usage:
    python scripts/sass_snapshot.py snapshot before.json     # at the old commit
    python scripts/sass_snapshot.py snapshot after.json      # at the new one
    python scripts/sass_snapshot.py compare before.json after.json

Each kernel is cross-compiled (no GPU), disassembled, and reduced to its instruction stream
(opcodes and operands, without addresses, the kernel's name or the constant-bank offsets of its
parameters): equal digests mean the same machine code doing the same work.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path

from attnlab import ladder, policy
from attnlab.analysis.sass import disassemble, parse
from attnlab.compile import compile_spec
from attnlab.config import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from attnlab.kernels.abi import ForwardSpec


def specs() -> dict[str, ForwardSpec]:
    """Every ladder step and lab variant at hd128 (plain, and windowed), per arch, and the
    defaults of both architecture families (every head dim, dtype and mask; packed too)."""
    found: dict[str, ForwardSpec] = {}
    for arch in ("sm_80", "sm_90a"):
        for name, config in ladder.named_for(arch, 128).items():
            for windowed in (False, True):
                found[f"{name} {arch}{' win' if windowed else ''}"] = ForwardSpec(
                    config, arch, "bfloat16", 128, windowed)
        for head_dim in SUPPORTED_HEAD_DIMS:
            for dtype in SUPPORTED_DTYPES:
                for windowed in (False, True):
                    for varlen in (False, True):
                        config = policy.default_for(arch, head_dim, windowed, dtype, varlen)
                        found[f"default {arch} {dtype} hd{head_dim}"
                              f"{' win' if windowed else ''}{' varlen' if varlen else ''}"] = (
                            ForwardSpec(config, arch, dtype, head_dim, windowed, varlen))
    return found


_CONSTANT = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def digest(spec: ForwardSpec, folder: Path) -> dict[str, object]:
    art = compile_spec(spec, folder)
    instructions = parse(disassemble(art.cubin))
    stream = "\n".join(
        f"{i.predicate} {i.opcode} {_CONSTANT.sub('c[param]', ' '.join(i.operand_list))}"
        for i in instructions)
    return {"sha": hashlib.sha256(stream.encode()).hexdigest()[:16],
            "instructions": len(instructions)}


def snapshot(path: Path) -> None:
    result = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, spec in specs().items():
            result[label] = digest(spec, Path(folder))
            print(f"{label}: {result[label]}", flush=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    changed = [label for label in old if label in new and old[label] != new[label]]
    for label in changed:
        print(f"CHANGED {label}: {old[label]} -> {new[label]}")
    for label in sorted(set(old) ^ set(new)):
        print(f"only in {'before' if label in old else 'after'}: {label}")
    print(f"{len(set(old) & set(new)) - len(changed)} identical, {len(changed)} changed")
    return 1 if changed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["snapshot", "compare"])
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args()
    if args.command == "snapshot":
        snapshot(args.paths[0])
    else:
        sys.exit(compare(*args.paths[:2]))


if __name__ == "__main__":
    main()
