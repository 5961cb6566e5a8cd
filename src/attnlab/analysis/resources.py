"""Per-kernel resource usage read from a cubin: registers, stack frame, shared memory, spills."""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab.analysis.tools import find_tool

_USAGE = re.compile(
    r"REG:(?P<registers>\d+)\s+STACK:(?P<stack>\d+)\s+SHARED:(?P<shared>\d+)\s+"
    r"LOCAL:(?P<local>\d+)"
)


@dataclass(frozen=True)
class Resources:
    """What one thread/CTA of the kernel occupies (static, from the binary)."""

    registers: int
    stack_bytes: int
    static_shared_bytes: int
    local_bytes: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.local_bytes > 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_resource_usage(text: str) -> Resources:
    """Parse ``cuobjdump --dump-resource-usage`` output of a one-kernel cubin."""
    match = _USAGE.search(text)
    if match is None:
        raise ValueError("no resource usage line (REG:.. STACK:..) in cuobjdump output")
    return Resources(int(match["registers"]), int(match["stack"]), int(match["shared"]),
                     int(match["local"]), 0, 0)


def read_resources(cubin: str | Path, sass_text: str | None = None) -> Resources:
    """Resources of the kernel in ``cubin``; spill counts from its SASS (STL/LDL)."""
    out = subprocess.run([str(find_tool("cuobjdump")), "--dump-resource-usage", str(cubin)],
                         capture_output=True, text=True, check=True).stdout
    base = parse_resource_usage(out)
    if sass_text is None:
        from attnlab.analysis.sass import disassemble

        sass_text = disassemble(cubin)
    stores = len(re.findall(r"\bSTL(?:\.\w+)*\b", sass_text))
    loads = len(re.findall(r"\bLDL(?:\.\w+)*\b", sass_text))
    return Resources(base.registers, base.stack_bytes, base.static_shared_bytes,
                     base.local_bytes, stores, loads)
