"""SASS of a cubin: disassembly and static instruction histograms (build-time counts)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from attnlab.analysis.tools import find_tool

# "/*0a30*/  @!P4 LDGSTS.E.BYPASS.LTC128B.128 [R2+0x1000], [R18.64] ;"
_INSTRUCTION = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]+)\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)"
    r"(?P<operands>[^;]*);",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str
    opcode: str  # with modifiers, e.g. IMAD.MOV.U32
    operands: str

    @property
    def base(self) -> str:
        """The opcode without modifiers (IMAD.MOV.U32 -> IMAD)."""
        return self.opcode.split(".", 1)[0]


def disassemble(cubin: str | Path) -> str:
    """``nvdisasm -c`` text of a cubin (code sections only)."""
    result = subprocess.run([str(find_tool("nvdisasm")), "-c", str(cubin)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin}: {result.stderr.strip()}")
    return result.stdout


def parse(sass_text: str) -> list[Instruction]:
    """Instructions of a disassembly, in address order."""
    return [Instruction(int(m["addr"], 16), (m["pred"] or "").strip(), m["op"],
                        m["operands"].strip()) for m in _INSTRUCTION.finditer(sass_text)]


def histogram(instructions: list[Instruction], *, modifiers: bool = False) -> Counter[str]:
    """Static count per opcode (or per opcode with modifiers)."""
    return Counter(i.opcode if modifiers else i.base for i in instructions)
