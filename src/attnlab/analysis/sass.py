"""SASS of a cubin: disassembly and static instruction histograms (build-time counts).

Every number here is a *static* count: instructions as they sit in the binary, each counted
once however often it runs. They show what the compiler made of a config (the seeds' "build
time instructions"); how often each one executes needs a profiler.

Instruction groups
------------------
``GROUPS`` sorts opcodes into the families the seeds reason about (seed 000: "group related
instructions together and work to eliminate the total sum"). An opcode is matched by its
longest listed prefix, so ``IMAD.MOV.U32`` (a register copy, seed 003) is not an ``IMAD``
(integer/address). Uniform-datapath twins (``UIADD3``, ``UMOV``, ``ULDC``, ...) count with
their vector twin. Anything unlisted is ``other``.

======================  ==============================================================
tensor                  HMMA, HGMMA, IMMA, DMMA, BMMA
fp32                    FFMA, FMUL, FADD, FMNMX
special function        MUFU
conversion              F2FP, F2F, F2I, I2F, I2FP, F2IP, FRND
integer/address         IMAD (but not IMAD.MOV), IADD3, VIADD, LEA, LOP3, SHF, ...
compare/select          ISETP, FSETP, PLOP3, SEL, FSEL, P2R, R2P
register copy           MOV, IMAD.MOV (IMAD.MOV.U32 and the negating IMAD.MOV), MOV32I, R2UR
CS2R                    CS2R (zeroing register pairs; seed 000's kernel 10 removes them)
constant/special reg    LDC, S2R, S2UR
shared memory           LDSM, LDS, STS, STSM, ATOMS
global memory           LDG, LDGSTS, STG, ATOMG, RED, TMA (UTMALDG, UTMASTG, UBLKCP)
local memory            LDL, STL (register spills)
warp shuffle/vote       SHFL, VOTE, VOTEU, MATCH, REDUX
barrier/sync            BAR, DEPBAR, LDGDEPBAR, MEMBAR, WARPSYNC, SYNCS, WARPGROUP, ...
control flow            BRA, EXIT, RET, CALL, BSSY, BSYNC, ...
======================  ==============================================================

``useful_pct`` is seed 004's (Observation AA): the share of instructions doing arithmetic
work, (HMMA + IMMA + FFMA + FMUL + FADD) / all, with Hopper's HGMMA counted like HMMA.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.analysis.control_codes import issue_intervals, stall_summary
from attnlab.analysis.tools import find_tool

# "/*0a30*/  @!P4 LDGSTS.E.BYPASS.LTC128B.128 [R2+0x1000], [R18.64] ;" (a modifier may end in a
# lowercase vector width: REDG.E.ADD.F32x2.FTZ...)
# With ``nvdisasm -hex`` the two 64-bit words of the encoding follow as comments (low word
# first; the second sits on the next line).
_INSTRUCTION = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]+)\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+(?:x\d+)?)*)"
    r"(?P<operands>[^;]*);"
    r"(?:\s*/\*\s*0x(?P<lo>[0-9a-f]{16})\s*\*/\s*/\*\s*0x(?P<hi>[0-9a-f]{16})\s*\*/)?",
    re.MULTILINE,
)
_REGISTER = re.compile(r"\b(U?R)(\d+)\b")
_ADDRESS = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str
    opcode: str  # with modifiers, e.g. IMAD.MOV.U32
    operands: str
    #: The 128-bit encoding (high word << 64 | low word), when disassembled with encodings.
    encoding: int | None = None

    @property
    def base(self) -> str:
        """The opcode without modifiers (IMAD.MOV.U32 -> IMAD)."""
        return self.opcode.split(".", 1)[0]

    @property
    def ends_path(self) -> bool:
        """An unconditional jump or exit: the next address does not follow on this path."""
        return self.base in ("BRA", "EXIT", "RET", "JMP", "BRX", "JMX") and not self.predicate

    @property
    def operand_list(self) -> list[str]:
        """Operands as written, e.g. ``["R4", "R80.reuse", "R72", "RZ"]``."""
        return [part.strip() for part in self.operands.split(",") if part.strip()]


def disassemble(cubin: str | Path, *, encodings: bool = False) -> str:
    """``nvdisasm -c`` text of a cubin (code sections only); ``encodings`` adds ``-hex``."""
    command = [str(find_tool("nvdisasm")), "-c", str(cubin)]
    if encodings:
        command.insert(2, "-hex")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin}: {result.stderr.strip()}")
    return result.stdout


def parse(sass_text: str) -> list[Instruction]:
    """Instructions of a disassembly, in address order (with encodings if the text has them)."""
    return [
        Instruction(int(m["addr"], 16), (m["pred"] or "").strip(), m["op"], m["operands"].strip(),
                    (int(m["hi"], 16) << 64 | int(m["lo"], 16)) if m["hi"] else None)
        for m in _INSTRUCTION.finditer(sass_text)
    ]


def histogram(instructions: list[Instruction], *, modifiers: bool = False) -> Counter[str]:
    """Static count per opcode (or per opcode with modifiers)."""
    return Counter(i.opcode if modifiers else i.base for i in instructions)


# ---------------------------------------------------------------------------------------------
# Groups and useful_pct
# ---------------------------------------------------------------------------------------------
GROUPS: dict[str, tuple[str, ...]] = {
    "tensor": ("HMMA", "HGMMA", "IMMA", "DMMA", "BMMA"),
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX"),
    "special function": ("MUFU",),
    "conversion": ("F2FP", "F2F", "F2I", "I2F", "I2FP", "F2IP", "FRND"),
    "integer/address": ("IMAD", "IADD3", "VIADD", "IADD", "LEA", "LOP3", "LOP", "SHF", "IABS",
                        "IMNMX", "VIMNMX", "PRMT", "SGXT", "BMSK", "POPC", "FLO", "BREV",
                        "IDP", "IMUL", "ISCADD"),
    "compare/select": ("ISETP", "FSETP", "PLOP3", "SEL", "FSEL", "P2R", "R2P"),
    "register copy": ("MOV", "IMAD.MOV", "MOV32I", "R2UR"),
    "CS2R": ("CS2R",),
    "constant/special reg": ("LDC", "S2R", "S2UR"),
    "shared memory": ("LDSM", "LDS", "STS", "STSM", "ATOMS"),
    "global memory": ("LDG", "LDGSTS", "STG", "ATOMG", "RED", "UTMALDG", "UTMASTG", "UBLKCP"),
    "local memory": ("LDL", "STL"),
    "warp shuffle/vote": ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"),
    "barrier/sync": ("BAR", "DEPBAR", "LDGDEPBAR", "MEMBAR", "ERRBAR", "WARPSYNC", "SYNCS",
                     "ARRIVES", "WARPGROUP", "FENCE", "CCTL"),
    "control flow": ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC",
                     "YIELD", "BPT"),
}
OTHER_GROUP = "other"
_GROUP_OF_PREFIX = {prefix: name for name, prefixes in GROUPS.items() for prefix in prefixes}

#: Seed 004's arithmetic opcodes (plus HGMMA, Hopper's HMMA) for ``useful_pct``.
USEFUL_OPCODES = ("HMMA", "HGMMA", "IMMA", "FFMA", "FMUL", "FADD")


def group_of(opcode: str) -> str:
    """The group of an opcode with modifiers: ``IMAD.MOV.U32`` -> ``register copy``."""
    parts = opcode.split(".")
    for n in range(len(parts), 0, -1):  # longest listed prefix wins
        group = _GROUP_OF_PREFIX.get(".".join(parts[:n]))
        if group is not None:
            return group
    base = parts[0]
    if base.startswith("U") and base[1:] in _GROUP_OF_PREFIX:
        return _GROUP_OF_PREFIX[base[1:]]
    return OTHER_GROUP


def group_histogram(instructions: list[Instruction]) -> Counter[str]:
    """Static count per group (see ``GROUPS``)."""
    return Counter(group_of(i.opcode) for i in instructions)


def useful_pct(instructions: list[Instruction]) -> float:
    """Seed 004's useful_pct: arithmetic instructions over all, in percent."""
    if not instructions:
        return 0.0
    useful = sum(1 for i in instructions if i.base in USEFUL_OPCODES)
    return 100.0 * useful / len(instructions)


# ---------------------------------------------------------------------------------------------
# Address registers (seed 000, kernel 8: swizzling spends registers on SMEM addresses)
# ---------------------------------------------------------------------------------------------
def address_registers(instructions: list[Instruction], opcode: str) -> Counter[str]:
    """Registers in the first ``[...]`` operand of each ``opcode`` instruction, with use counts.

    For LDSM that is the shared-memory source, for LDGSTS the shared-memory destination (its
    second bracket is the global source), for STS/LDS the shared address. ``RZ`` is not a
    register here; ``UR`` registers count separately from ``R`` ones.
    """
    uses: Counter[str] = Counter()
    for instr in instructions:
        if instr.base != opcode:
            continue
        match = _ADDRESS.search(instr.operands)
        if match:
            uses.update({kind + number for kind, number in _REGISTER.findall(match.group(1))})
    return uses


# ---------------------------------------------------------------------------------------------
# Register copies feeding HMMA (seed 000, kernel 9)
# ---------------------------------------------------------------------------------------------
COPY_OPCODES = ("MOV", "IMAD.MOV.U32")
_HMMA_SHAPE = re.compile(r"\.(\d{2})(\d)(\d{1,2})(?:\.|$)")


def _register_span(operand: str, count: int) -> set[int]:
    match = _REGISTER.match(operand.lstrip("-|!"))
    if match is None or match.group(1) != "R":  # RZ, predicates, immediates, uniform registers
        return set()
    first = int(match.group(2))
    return set(range(first, first + count))


def _hmma_register_counts(opcode: str) -> tuple[int, int, int]:
    """Registers per thread of the A, B and C/D operands of an HMMA (from its shape).

    A warp holds m*k A elements, k*n B and m*n C; 16-bit A/B pack two per register, an F32
    accumulator one (an F16 accumulator two): HMMA.16816.F32 -> (4, 2, 4).
    """
    match = _HMMA_SHAPE.search(opcode)
    if match is None:
        raise ValueError(f"no m/n/k shape in {opcode!r}")
    m, n, k = (int(g) for g in match.groups())
    per_acc_reg = 1 if ".F32" in opcode else 2
    return m * k // 64, k * n // 64, m * n // (32 * per_acc_reg)


def written_registers(instr: Instruction) -> set[int]:
    """Vector registers an instruction writes: its first operand, when that is a register.

    Stores, branches and barriers start with an address, label or immediate; compares start
    with a predicate. The width comes from the opcode (vector suffix, LDSM matrix count, HMMA
    accumulator). SHFL, which writes its second operand, is the one known miss.
    """
    operands = instr.operand_list
    if not operands:
        return set()
    parts = instr.opcode.split(".")
    if instr.base == "HMMA":
        width = _hmma_register_counts(instr.opcode)[2]
    elif instr.base == "LDSM":
        width = {"4": 4, "2": 2}.get(parts[-1], 1)
    elif "128" in parts:
        width = 4
    elif "64" in parts or "WIDE" in parts or (instr.base == "CS2R" and "32" not in parts):
        width = 2
    else:
        width = 1
    return _register_span(operands[0], width)


def hmma_operand_registers(instr: Instruction) -> dict[str, set[int]]:
    """Vector registers an HMMA reads, per operand: ``{"A": {...}, "B": {...}, "C": {...}}``."""
    a, b, c = _hmma_register_counts(instr.opcode)
    _, reg_a, reg_b, reg_c = instr.operand_list[:4]
    return {"A": _register_span(reg_a, a), "B": _register_span(reg_b, b),
            "C": _register_span(reg_c, c)}


def _fed_operand(writes: list[set[int]], reads: list[dict[str, set[int]]],
                 path_ends: list[bool], start: int, reg: int) -> str | None:
    """The HMMA operand (A/B/C) that first reads ``reg`` after ``start``, before a rewrite."""
    for index in range(start + 1, len(writes)):
        for name, regs in reads[index].items():
            if reg in regs:
                return name
        if reg in writes[index] or path_ends[index]:
            return None
    return None


_LABEL = re.compile(r"^\s*(\.L_x_\d+):\s*$\s*/\*([0-9a-f]+)\*/", re.M)
_BRANCH_TARGET = re.compile(r"\((\.L_x_\d+)\)")


def sparse_metadata_hazards(sass_text: str) -> list[Instruction]:
    """Instructions that write the metadata register of an ``HGMMA.SP`` still in flight (issued
    and not yet retired by a ``WARPGROUP.DEPBAR.LE gsb0, N``, which leaves the newest N
    commit groups in flight; a group ends at the MMA marked ``gsb0``).

    The sparse ``wgmma`` reads that register after it issues, and ptxas does not hold it for
    the MMA (``kernels/gemm/ptx_mma.retire_words``). The walk goes through the code in address
    order, then once more around each loop (from a backward branch's target to the branch,
    in flight what was at the branch), so a write at the top of a loop body to the register
    of an MMA at its bottom is found.
    """
    instructions = parse(sass_text)
    position = {ins.address: i for i, ins in enumerate(instructions)}
    labels = {m[1]: position[int(m[2], 16)] for m in _LABEL.finditer(sass_text)}
    hazards: dict[int, Instruction] = {}
    Groups = tuple[frozenset[int], ...]  # committed groups, oldest first, then the open one

    def walk(first: int, last: int, groups: Groups) -> list[Groups]:
        states = []
        for ins in instructions[first:last + 1]:
            if ins.opcode.startswith("WARPGROUP.DEPBAR"):
                keep = int(ins.operands.rsplit(",", 1)[1], 16)
                groups = (*(groups[:-1][-keep:] if keep else ()), groups[-1])
            if written_registers(ins) & frozenset().union(*groups):
                hazards[ins.address] = ins
            if ins.opcode.startswith("HGMMA.SP"):
                groups = (*groups[:-1], groups[-1] | _register_span(ins.operand_list[3], 1))
                if ins.operand_list[-1] == "gsb0":
                    groups = (*groups, frozenset())
            states.append(groups)
        return states

    states = walk(0, len(instructions) - 1, (frozenset(),))
    for i, ins in enumerate(instructions):
        target = _BRANCH_TARGET.search(ins.operands) if ins.base == "BRA" else None
        if target and labels.get(target[1], i + 1) <= i:
            walk(labels[target[1]], i, states[i])
    return sorted(hazards.values(), key=lambda ins: ins.address)


@dataclass(frozen=True)
class CopyFeedingHmma:
    """A MOV / IMAD.MOV.U32 whose destination an HMMA reads before it is overwritten."""

    copy: Instruction
    operand: str  # "A", "B" or "C"


def copies_feeding_hmma(instructions: list[Instruction]) -> list[CopyFeedingHmma]:
    """Register copies whose destination is read as an HMMA operand (seed 000, kernel 9).

    Follows the fall-through path from each copy until an HMMA reads the destination (a hit),
    something overwrites it, or an unconditional branch ends the path. Seed 000 found such
    copies only on the B operand, from ldmatrix fragments in the wrong register order.
    """
    writes = [written_registers(i) for i in instructions]
    reads = [hmma_operand_registers(i) if i.base == "HMMA" else {} for i in instructions]
    path_ends = [i.ends_path for i in instructions]
    found = []
    for index, instr in enumerate(instructions):
        if instr.opcode not in COPY_OPCODES:
            continue
        for reg in writes[index]:
            operand = _fed_operand(writes, reads, path_ends, index, reg)
            if operand is not None:
                found.append(CopyFeedingHmma(instr, operand))
    return found


# ---------------------------------------------------------------------------------------------
# The report and the diff of two reports
# ---------------------------------------------------------------------------------------------
#: Opcodes whose address registers the report counts (seed 000's LDSM and LDGSTS study).
ADDRESS_OPCODES = ("LDSM", "LDGSTS")


@dataclass(frozen=True)
class SassReport:
    """Static (build-time) SASS statistics of one kernel."""

    label: str
    arch: str
    instructions: int
    opcodes: dict[str, int]
    opcodes_with_modifiers: dict[str, int]
    groups: dict[str, int]
    useful_pct: float
    #: opcode -> {register: number of instructions using it in their address}.
    address_registers: dict[str, dict[str, int]]
    #: copy opcode -> count, and HMMA operand -> count, of copies feeding an HMMA.
    copies_feeding_hmma: dict[str, int]
    copies_feeding_hmma_operands: dict[str, int]
    cs2r: int
    #: opcode -> {stall cycles: instructions}, when the encodings were available.
    stalls: dict[str, dict[int, int]] = field(default_factory=dict)
    #: cycles between consecutive HMMA issues -> occurrences (``issue_intervals``).
    hmma_intervals: dict[int, int] = field(default_factory=dict)
    #: seed 003's scalar RAW producers of LDGSTS / LDSM / HMMA in the main loop
    #: (``dependencies.raw_dependencies``), when the disassembly text was at hand.
    raw_dependencies: dict[str, object] = field(default_factory=dict)

    def distinct_address_registers(self, opcode: str) -> int:
        return len(self.address_registers.get(opcode, {}))

    @property
    def copies_feeding_hmma_total(self) -> int:
        return sum(self.copies_feeding_hmma.values())

    def evidence(self) -> dict[str, float]:
        """The seeds' headline numbers, by name (the rows of the evidence table and diff)."""
        rows: dict[str, float] = {"instructions": self.instructions}
        for opcode in ADDRESS_OPCODES:
            rows[f"{opcode} address registers"] = self.distinct_address_registers(opcode)
        rows["copies feeding HMMA"] = self.copies_feeding_hmma_total
        rows["CS2R"] = self.cs2r
        rows["useful_pct"] = round(self.useful_pct, 2)
        if self.raw_dependencies:
            rows["RAW producers in the main loop"] = self.raw_dependencies["total"]
        return rows

    def to_dict(self) -> dict[str, object]:
        return {
            "counts": "static (build-time)",
            "label": self.label,
            "arch": self.arch,
            "instructions": self.instructions,
            "useful_pct": self.useful_pct,
            "groups": self.groups,
            "opcodes": self.opcodes,
            "opcodes_with_modifiers": self.opcodes_with_modifiers,
            "address_registers": {op: {"distinct": len(regs), "uses": regs}
                                  for op, regs in self.address_registers.items()},
            "copies_feeding_hmma": {"total": self.copies_feeding_hmma_total,
                                    "by_opcode": self.copies_feeding_hmma,
                                    "by_operand": self.copies_feeding_hmma_operands},
            "cs2r": self.cs2r,
            "stalls": {op: {str(s): n for s, n in counts.items()}
                       for op, counts in self.stalls.items()},
            "hmma_intervals": {str(c): n for c, n in self.hmma_intervals.items()},
            "raw_dependencies": self.raw_dependencies,
        }


def _sorted_counts(counter: Counter[str]) -> dict[str, int]:
    return dict(counter.most_common())


def build_report(instructions: list[Instruction], *, label: str = "", arch: str = "",
                 sass_text: str | None = None) -> SassReport:
    """All static statistics of one disassembly (stall counts need encodings; the RAW
    producers of the main loop need the text ``instructions`` were parsed from, for its
    branch labels)."""
    from attnlab.analysis.dependencies import raw_dependencies

    copies = copies_feeding_hmma(instructions)
    # Control codes need every encoding (the stall sums run across instructions), or none.
    encoded = instructions if all(i.encoding is not None for i in instructions) else []
    return SassReport(
        label=label,
        arch=arch,
        instructions=len(instructions),
        opcodes=_sorted_counts(histogram(instructions)),
        opcodes_with_modifiers=_sorted_counts(histogram(instructions, modifiers=True)),
        groups=_sorted_counts(group_histogram(instructions)),
        useful_pct=useful_pct(instructions),
        address_registers={op: _sorted_counts(address_registers(instructions, op))
                           for op in ADDRESS_OPCODES},
        copies_feeding_hmma=_sorted_counts(Counter(c.copy.opcode for c in copies)),
        copies_feeding_hmma_operands=_sorted_counts(Counter(c.operand for c in copies)),
        cs2r=sum(1 for i in instructions if i.base == "CS2R"),
        stalls={op: dict(sorted(counts.items()))
                for op, counts in stall_summary(encoded).items()},
        hmma_intervals=dict(sorted(issue_intervals(encoded).items())),
        raw_dependencies=(raw_dependencies(sass_text).to_dict() if sass_text is not None
                          else {}),
    )


def analyze_cubin(cubin: str | Path, *, label: str = "", arch: str = "") -> SassReport:
    """Disassemble a cubin (with encodings) and build its report."""
    text = disassemble(cubin, encodings=True)
    return build_report(parse(text), label=label, arch=arch, sass_text=text)


@dataclass(frozen=True)
class DiffRow:
    """One statistic of two kernels side by side; ``ratio`` is b / a (None when a is 0)."""

    section: str
    name: str
    a: float
    b: float

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def ratio(self) -> float | None:
        return self.b / self.a if self.a else None

    def to_dict(self) -> dict[str, object]:
        return {"section": self.section, "name": self.name, "a": self.a, "b": self.b,
                "delta": self.delta, "ratio": self.ratio}


def _rows(section: str, a: dict[str, float], b: dict[str, float]) -> Iterator[DiffRow]:
    for name in sorted(set(a) | set(b), key=lambda n: (-max(a.get(n, 0), b.get(n, 0)), n)):
        yield DiffRow(section, name, a.get(name, 0), b.get(name, 0))


def diff(report_a: SassReport, report_b: SassReport) -> list[DiffRow]:
    """Every statistic of ``report_a`` against ``report_b``: evidence, groups, opcodes.

    Evidence rows keep their fixed order; groups and opcodes come largest first.
    """
    evidence_a, evidence_b = report_a.evidence(), report_b.evidence()
    rows = [DiffRow("evidence", name, evidence_a[name], evidence_b[name]) for name in evidence_a]
    rows += _rows("group", report_a.groups, report_b.groups)
    rows += _rows("opcode", report_a.opcodes_with_modifiers, report_b.opcodes_with_modifiers)
    return rows


def changed(rows: Iterable[DiffRow]) -> list[DiffRow]:
    """The rows whose two values differ."""
    return [row for row in rows if row.a != row.b]
