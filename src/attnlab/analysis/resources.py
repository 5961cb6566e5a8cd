"""Per-kernel resource usage read from a cubin: registers, stack frame, shared memory, spills."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.analysis.tools import find_tool

if TYPE_CHECKING:
    from attnlab.compile import Artifacts

_USAGE = re.compile(
    r"REG:(?P<registers>\d+)\s+STACK:(?P<stack>\d+)\s+SHARED:(?P<shared>\d+)\s+"
    r"LOCAL:(?P<local>\d+)"
)
#: Bytes per element of the dtypes the kernels take (for the config's shared-memory size).
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "int8": 1}
#: sm_90 cubins that use the driver's reserved shared-memory window name it with this symbol,
#: and cuobjdump's SHARED then includes the window (1 KiB). The driver does not count it as
#: static shared memory (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES is 0 for our sm_90a kernels) but
#: reserves it per CTA anyway, which the occupancy model adds: counting it twice would move
#: every cliff by 1 KiB. Checked against cuOccupancyMaxActiveBlocksPerMultiprocessor on an H200.
RESERVED_SMEM_SYMBOL = b".nv.reservedSmem"
RESERVED_SMEM_BYTES = 1024


@dataclass(frozen=True)
class Resources:
    """What one thread/CTA of the kernel occupies (static, from the binary).

    ``static_shared_bytes`` is what the driver counts as static (the reserved window is in
    ``reserved_shared_bytes``); ``dynamic_shared_bytes`` is not in the binary: it is what the
    launch asks for, which the caller supplies (``kernel_resources`` takes it from the config).
    """

    registers: int
    stack_bytes: int
    static_shared_bytes: int
    local_bytes: int
    spill_stores: int
    spill_loads: int
    dynamic_shared_bytes: int = 0
    reserved_shared_bytes: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.local_bytes > 0

    @property
    def shared_bytes(self) -> int:
        """Static plus dynamic shared memory of one CTA (what occupancy is computed from; the
        driver's reserved window comes on top, see ``occupancy``)."""
        return self.static_shared_bytes + self.dynamic_shared_bytes

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_resource_usage(text: str) -> Resources:
    """Parse ``cuobjdump --dump-resource-usage`` output of a one-kernel cubin."""
    match = _USAGE.search(text)
    if match is None:
        raise ValueError("no resource usage line (REG:.. STACK:..) in cuobjdump output")
    return Resources(int(match["registers"]), int(match["stack"]), int(match["shared"]),
                     int(match["local"]), 0, 0)


def read_resources(cubin: str | Path, sass_text: str | None = None, *,
                   dynamic_shared_bytes: int = 0) -> Resources:
    """Resources of the kernel in ``cubin``; spill counts from its SASS (STL/LDL)."""
    out = subprocess.run([str(find_tool("cuobjdump")), "--dump-resource-usage", str(cubin)],
                         capture_output=True, text=True, check=True).stdout
    base = parse_resource_usage(out)
    reserved = 0
    if RESERVED_SMEM_SYMBOL in Path(cubin).read_bytes():
        reserved = min(base.static_shared_bytes, RESERVED_SMEM_BYTES)
    if sass_text is None:
        from attnlab.analysis.sass import disassemble

        sass_text = disassemble(cubin)
    stores = len(re.findall(r"\bSTL(?:\.\w+)*\b", sass_text))
    loads = len(re.findall(r"\bLDL(?:\.\w+)*\b", sass_text))
    return dataclasses.replace(base, static_shared_bytes=base.static_shared_bytes - reserved,
                               spill_stores=stores, spill_loads=loads,
                               dynamic_shared_bytes=dynamic_shared_bytes,
                               reserved_shared_bytes=reserved)


def kernel_resources(artifacts: Artifacts, sass_text: str | None = None) -> Resources:
    """Resources of a cross-compiled kernel, with the dynamic shared memory its config asks
    for (the Q, K and V tiles; the kernel has no static tiles)."""
    smem = artifacts.config.smem_bytes(artifacts.head_dim, ELEMENT_BYTES[artifacts.dtype])
    return read_resources(artifacts.cubin, sass_text, dynamic_shared_bytes=smem)
