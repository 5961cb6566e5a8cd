"""Seed 003 (Part 7)'s data-dependency count: the scalar instructions of the main loop whose
results the operations that matter read.

The seed counted, in the main loop of its kernel 7 and of its optimised kernel 16, the unique
scalar instructions (integer arithmetic, shifts, logic, moves) that compute a register that
``cp.async`` (LDGSTS), ``ldmatrix`` (LDSM) or ``mma`` (HMMA) then reads: read-after-write
hazards on the path to the memory and tensor pipes, each one latency the warp must cover
before the operation can issue (6.8x to 11.3x more of them in kernel 7).

The main loop is the backward branch's range that holds the most of those operations. For
each operation in it, every register it reads (LDGSTS and LDSM: the registers of their
addresses; HMMA: its A, B and C operands) is traced back to the last instruction of the loop
that writes it, wrapping to the end of the body for a value the previous iteration made; a
scalar writer counts once however many operations read it. Predicates are ignored (a
predicated write counts as a write), as in the seed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnlab.analysis.sass import Instruction, hmma_operand_registers, written_registers

#: The operations that matter, and the scalar opcodes (bases) whose results they wait on.
CONSUMERS = ("LDGSTS", "LDSM", "HMMA")
SCALAR_OPCODES = frozenset({
    "IMAD", "IADD3", "IADD", "SHF", "SHL", "SHR", "LOP3", "LOP", "LEA", "MOV", "SEL",
    "PRMT", "IABS", "IMNMX", "SGXT", "BMSK", "BREV", "FLO", "POPC", "I2F", "F2I", "S2R",
    "CS2R", "IMUL", "ISCADD", "VIADD", "VIMNMX",
})
_BRANCH_TARGET = re.compile(r"\(([.\w]+)\)")
_LABEL = re.compile(r"^([.\w]+):\s*$")
_ADDRESS_COMMENT = re.compile(r"^\s*/\*([0-9a-f]+)\*/")
_ADDRESS = re.compile(r"\[([^\]]*)\]")
_ADDRESS_REGISTER = re.compile(r"\bR(\d+)(\.64)?\b")


def _address_reads(instr: Instruction) -> set[int]:
    """Vector registers in an instruction's bracketed addresses (``.64`` names a pair)."""
    regs: set[int] = set()
    for address in _ADDRESS.findall(instr.operands):
        for number, wide in _ADDRESS_REGISTER.findall(address):
            first = int(number)
            regs.update(range(first, first + (2 if wide else 1)))
    return regs


def consumer_reads(instr: Instruction) -> set[int]:
    """The registers an LDGSTS, LDSM or HMMA reads (its addresses, or its operands)."""
    if instr.base == "HMMA":
        return set().union(*hmma_operand_registers(instr).values())
    return _address_reads(instr)


def labels(sass_text: str) -> dict[str, int]:
    """nvdisasm's branch labels (``.L_x_6``) and the address of the instruction after each."""
    found, pending = {}, []
    for line in sass_text.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        address = _ADDRESS_COMMENT.match(line)
        if address and pending:
            found.update(dict.fromkeys(pending, int(address.group(1), 16)))
            pending = []
    return found


def loop_bodies(instructions: list[Instruction], branch_labels: dict[str, int]
                ) -> list[list[Instruction]]:
    """The body of every loop: each backward branch's address range, from its target to the
    branch, in the branches' order. ``branch_labels``: :func:`labels`."""
    by_address = {i.address: n for n, i in enumerate(instructions)}
    bodies = []
    for n, instr in enumerate(instructions):
        if instr.base != "BRA":
            continue
        target = _BRANCH_TARGET.search(instr.operands)
        if target is None or target.group(1) not in branch_labels:
            continue
        start = by_address.get(branch_labels[target.group(1)])
        if start is not None and start <= n:
            bodies.append(instructions[start:n + 1])
    return bodies


def main_loop(instructions: list[Instruction], branch_labels: dict[str, int]
              ) -> list[Instruction]:
    """The body of the loop (a backward branch's address range) with the most LDGSTS, LDSM
    and HMMA instructions; empty without a loop. ``branch_labels``: :func:`labels`."""
    best: list[Instruction] = []
    best_count = 0
    for body in loop_bodies(instructions, branch_labels):
        count = sum(1 for i in body if i.base in CONSUMERS)
        if count > best_count:
            best, best_count = body, count
    return best


@dataclass(frozen=True)
class RawDependencies:
    """Unique scalar producers in the main loop, per consuming opcode and in all (one
    producer read by LDSM and HMMA counts once in ``total``)."""

    loop_instructions: int
    by_consumer: dict[str, int]
    total: int

    def to_dict(self) -> dict[str, object]:
        return {"loop_instructions": self.loop_instructions, **self.by_consumer,
                "total": self.total}


def raw_dependencies(sass_text: str) -> RawDependencies:
    """Seed 003's count on one disassembly (``nvdisasm`` text; see the module docstring)."""
    from attnlab.analysis.sass import parse

    body = main_loop(parse(sass_text), labels(sass_text))
    writes = [written_registers(i) for i in body]
    producers: dict[str, set[int]] = {op: set() for op in CONSUMERS}
    for n, instr in enumerate(body):
        if instr.base not in CONSUMERS:
            continue
        for reg in consumer_reads(instr):
            # Back through this iteration, then around from the end of the previous one.
            for back in range(1, len(body)):
                writer = (n - back) % len(body)
                if reg in writes[writer]:
                    if body[writer].base in SCALAR_OPCODES:
                        producers[instr.base].add(writer)
                    break
    return RawDependencies(len(body), {op: len(found) for op, found in producers.items()},
                           len(set().union(*producers.values())))
