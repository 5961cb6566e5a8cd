"""Per-instruction control codes of Volta-and-later SASS (sm_80 and sm_90 here), decoded
from the 128-bit instruction encoding.

Since Volta every instruction carries the compiler's scheduling decisions in bits [105, 126)
of its encoding, i.e. bits [41, 62) of the high 64-bit word:

===============  ===========  ==================================================================
high-word bits   field        meaning
===============  ===========  ==================================================================
[41, 45)         stall        cycles before this warp may issue its next instruction (S00-S15)
45               yield        *cleared* = hint the scheduler to switch warps ("Y")
[46, 49)         write bar.   scoreboard 0-5 signalled when a variable-latency result lands
[49, 52)         read bar.    scoreboard signalled once the source registers have been read
[52, 58)         wait mask    scoreboards to wait on before issuing (bit i = scoreboard i)
[58, 62)         reuse        operand-reuse-cache flags for source slots a, b, c, d
===============  ===========  ==================================================================

A barrier field of 7 means "none". ``str(ControlCode)`` uses CuAssembler's notation, which
seed 004 quotes: ``[B--2---:R-:W-:-:S08] HMMA ...`` waits on scoreboard 2, stalls 8 cycles.

How the positions were checked against this nvdisasm (``tests/test_analysis_control_codes.py``):
the reuse bits match the ``.reuse`` flags nvdisasm prints, on every instruction of real cubins
and on hand-modified encodings fed back through ``nvdisasm --binary``; every LDSM result is
waited on (wait mask) through the scoreboard its write-barrier field names before an HMMA reads
it; S2R always sets a write barrier and fixed-latency instructions (FFMA, IADD3, HMMA) never
do; the stall fields between consecutive HMMAs add up to at least 8 cycles on sm_80 (exactly 8
most of the time: seed 004's S08) and 6 on sm_90; and ``MOV R1, c[0x0][0x28]``, the first
instruction of every kernel, decodes to CuAssembler's familiar ``[B------:R-:W-:-:S02]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlab.analysis.sass import Instruction

#: Bit offset of the control field in the 128-bit encoding (bit 41 of the high word).
CONTROL_SHIFT = 64 + 41
CONTROL_BITS = 21
NO_BARRIER = 7
SCOREBOARDS = 6


@dataclass(frozen=True)
class ControlCode:
    """The scheduling bits of one instruction."""

    stall: int
    yield_hint: bool
    write_barrier: int | None
    read_barrier: int | None
    wait_mask: int
    reuse: int

    @property
    def waits(self) -> tuple[int, ...]:
        """Scoreboards this instruction waits on."""
        return tuple(i for i in range(SCOREBOARDS) if self.wait_mask >> i & 1)

    def __str__(self) -> str:
        def bar(index: int | None) -> str:
            return "-" if index is None else str(index)

        waits = "".join(str(i) if self.wait_mask >> i & 1 else "-" for i in range(SCOREBOARDS))
        return (f"[B{waits}:R{bar(self.read_barrier)}:W{bar(self.write_barrier)}:"
                f"{'Y' if self.yield_hint else '-'}:S{self.stall:02d}]")

    def to_dict(self) -> dict[str, object]:
        return {"stall": self.stall, "yield": self.yield_hint,
                "write_barrier": self.write_barrier, "read_barrier": self.read_barrier,
                "wait": list(self.waits), "reuse": self.reuse, "text": str(self)}


def _field(control: int, lo: int, width: int) -> int:
    return control >> lo & ((1 << width) - 1)


def decode(encoding: int) -> ControlCode:
    """The control code of one 128-bit instruction encoding (high word << 64 | low word)."""
    if not 0 <= encoding < 1 << 128:
        raise ValueError(f"not a 128-bit instruction encoding: {encoding:#x}")
    control = _field(encoding, CONTROL_SHIFT, CONTROL_BITS)

    def barrier(lo: int) -> int | None:
        value = _field(control, lo, 3)
        return None if value == NO_BARRIER else value

    return ControlCode(
        stall=_field(control, 0, 4),
        yield_hint=not _field(control, 4, 1),
        write_barrier=barrier(5),
        read_barrier=barrier(8),
        wait_mask=_field(control, 11, SCOREBOARDS),
        reuse=_field(control, 17, 4),
    )


def control_codes(instructions: Iterable[Instruction]) -> list[tuple[Instruction, ControlCode]]:
    """Each instruction with its decoded control code (needs ``disassemble(encodings=True)``)."""
    pairs = []
    for instr in instructions:
        if instr.encoding is None:
            raise ValueError(f"no encoding for the instruction at {instr.address:#x}: "
                             "disassemble with encodings=True")
        pairs.append((instr, decode(instr.encoding)))
    return pairs


def stall_summary(instructions: Iterable[Instruction], *,
                  modifiers: bool = False) -> dict[str, Counter[int]]:
    """Per opcode, how many instructions carry each stall count (seed 004's HMMA S08 study)."""
    summary: dict[str, Counter[int]] = {}
    for instr, code in control_codes(instructions):
        key = instr.opcode if modifiers else instr.base
        summary.setdefault(key, Counter())[code.stall] += 1
    return dict(sorted(summary.items(), key=lambda item: -item[1].total()))


def issue_intervals(instructions: Iterable[Instruction], opcode: str = "HMMA") -> Counter[int]:
    """Stall cycles from each ``opcode`` instruction to the next one on the same path.

    The sum of the stall fields in between is the minimum number of cycles between the two
    issues. Seed 004 read HMMA's as a fixed 8 on Ampere ("S08 is hardware-fixed"): the
    compiler may spread the 8 cycles over the instructions in between, never go below them.
    """
    intervals: Counter[int] = Counter()
    since: int | None = None
    for instr, code in control_codes(instructions):
        if instr.base == opcode:
            if since is not None:
                intervals[since] += 1
            since = 0
        if since is not None:
            since = None if instr.ends_path else since + code.stall
    return intervals
