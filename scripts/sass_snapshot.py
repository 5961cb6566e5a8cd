"""Digest the SASS of every named config and every default, to show a refactor changes no binary.

Usage:
    python scripts/sass_snapshot.py snapshot before.json     # at the old commit
    python scripts/sass_snapshot.py snapshot --family gemm before.json  # the GEMM kernels
    python scripts/sass_snapshot.py snapshot after.json      # at the new one
    python scripts/sass_snapshot.py compare before.json after.json

Each kernel is cross-compiled (no GPU), disassembled, and reduced to its instruction stream
(opcodes and operands, without addresses, the kernel's name or the constant-bank offsets of its
parameters): equal digests mean the same machine code doing the same work. Kernels are
matched by their spec (config, arch, dtype, head dim, variant), so a default that a policy
change moved to another config is reported as such, not as a changed binary.
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
    """Every ladder step and lab variant at hd128 (plain, and windowed), per arch, the
    defaults of both architecture families (every head dim, dtype and mask; packed too), and
    on sm_90a the ``mma.sync`` kernel's defaults as well."""
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
                        variant = (f"{arch} {dtype} hd{head_dim}{' win' if windowed else ''}"
                                   f"{' varlen' if varlen else ''}")
                        found[f"default {variant}"] = ForwardSpec(config, arch, dtype,
                                                                  head_dim, windowed, varlen)
                        if arch == "sm_90a":
                            found[f"mma.sync default {variant}"] = ForwardSpec(
                                policy.mma_sync_default_for(arch, head_dim, windowed, dtype,
                                                            varlen),
                                arch, dtype, head_dim, windowed, varlen)
    return found


def gemm_specs() -> dict[str, object]:
    """The GEMM family's kernels: the dispatch's sm_90a list and the ladder's steps."""
    from attnlab.gemm.dispatch import default_specs
    from attnlab.gemm.ladder import steps_for
    from attnlab.kernels.gemm.abi import GemmSpec

    found = {f"{spec.label}{spec.variant()} {spec.dtype}->{getattr(spec, 'out_dtype', '')}":
             spec for spec in default_specs("sm_90a")}
    for name, (config, _) in steps_for("sm_90a").items():
        found[f"ladder {name}"] = GemmSpec(config, "sm_90a", "bfloat16", "bfloat16", "k", "k")
    return found


def spec_key(spec) -> str:
    """What identifies a kernel across commits: its config's fields and the variant (a
    field added since with its default value left out)."""
    if isinstance(spec, ForwardSpec):
        config = {k: v for k, v in spec.config.to_dict().items() if v is not False}
        return json.dumps([config, spec.arch, spec.dtype, spec.head_dim, spec.windowed,
                           spec.varlen], sort_keys=True)
    return json.dumps({k: v for k, v in spec.to_dict().items() if v is not False},
                      sort_keys=True, default=str)


_CONSTANT = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def digest(spec: ForwardSpec, folder: Path) -> dict[str, object]:
    art = compile_spec(spec, folder)
    instructions = parse(disassemble(art.cubin))
    stream = "\n".join(
        f"{i.predicate} {i.opcode} {_CONSTANT.sub('c[param]', ' '.join(i.operand_list))}"
        for i in instructions)
    return {"sha": hashlib.sha256(stream.encode()).hexdigest()[:16],
            "instructions": len(instructions), "spec": spec_key(spec)}


def snapshot(path: Path, family: str) -> None:
    result = {}
    digests: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, spec in (gemm_specs() if family == "gemm" else specs()).items():
            key = spec_key(spec)
            if key not in digests:  # a default that is also a named config: compile once
                digests[key] = digest(spec, Path(folder))
            result[label] = digests[key]
            print(f"{label}: {result[label]}", flush=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    """Kernels of equal spec with another instruction stream (the refactor's differences to
    explain), then the labels whose spec changed or exists on one side only."""
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    by_spec = {entry["spec"]: (label, entry) for label, entry in new.items()}
    matched = [(label, entry, by_spec[entry["spec"]]) for label, entry in old.items()
               if entry["spec"] in by_spec]
    changed = [(label, entry, twin) for label, entry, twin in matched
               if entry["sha"] != twin[1]["sha"]]
    for label, entry, (_, twin) in changed:
        print(f"CHANGED {label}: {entry['instructions']} -> {twin['instructions']} instructions")
    moved = [label for label in old if label in new and old[label]["spec"] != new[label]["spec"]]
    for label in moved:
        print(f"another config now: {label}")
    for label in sorted(set(old) ^ set(new)):
        print(f"only in {'before' if label in old else 'after'}: {label}")
    print(f"{len(matched) - len(changed)} identical, {len(changed)} changed, {len(moved)} "
          f"labels on another config")
    return 1 if changed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["snapshot", "compare"])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--family", choices=["attention", "gemm"], default="attention")
    args = parser.parse_args()
    if args.command == "snapshot":
        snapshot(args.paths[0], args.family)
    else:
        sys.exit(compare(*args.paths[:2]))


if __name__ == "__main__":
    main()
