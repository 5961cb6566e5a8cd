"""Control-code edits in a compiled kernel: the lab's CuAssembler experiments, in Python.

Seed 004 rewrote the stall field of chosen instructions (``IMMA S04 -> S02``, ``HMMA S08 ->
S04``) and timed the edited cubin against the original. The stall count sits in bits
[41, 45) of an instruction's high 64-bit word (``control_codes``), so an edit changes those
four bits and nothing else: the instruction stream, its length and every other field stay
as ptxas wrote them.

A kernel reaches the GPU inside a host shared object (the kernel cache's ``.so``), which
embeds the CUDA cubin (an ELF of its own, machine ``EM_CUDA``) uncompressed. So the same
edit applies to a bare cubin or to the ``.so``: every embedded cubin is found by its ELF
header, its ``.text.<kernel>`` sections by their section headers, and each instruction
word is patched in place. Which instructions to edit comes from ``nvdisasm`` of that cubin
(opcodes), checked against the bytes (each edited word must be the encoding nvdisasm
printed), so an edit never lands on data or on the wrong instruction.

An edited cubin must still disassemble (some opcodes tie the stall field to their encoding:
sm_80's HMMA decodes only with stalls 1 to 11), which the patcher checks. A lower stall than
the hardware needs is not checked by anything but the result: a patched kernel must be run
against the original and its output compared (the caller's job, on a GPU), as the lab did.
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from attnlab.analysis.control_codes import CONTROL_SHIFT, decode

#: ELF machine number of CUDA cubins.
EM_CUDA = 190
_ELF_MAGIC = b"\x7fELF"
_STALL_MASK = 0xF << CONTROL_SHIFT
_INSTRUCTION_BYTES = 16
#: Seed 004's HMMA edit per architecture: halve the stall ptxas gives back-to-back HMMAs,
#: 8 cycles on sm_80 (the seed's S08 -> S04) and 6 on sm_90a (k16: 400 of 512 HMMAs).
SEED_HMMA_EDIT = {"sm_80": "HMMA:8:4", "sm_90a": "HMMA:6:3"}
#: Seed 004's IMMA edit (S04 -> S02): nvcc gives the WMMA s8 tile's back-to-back IMMAs 4
#: cycles on sm_80 and sm_90a alike (25 and 31 of its 32).
SEED_IMMA_EDIT = {"sm_80": "IMMA:4:2", "sm_90a": "IMMA:4:2"}


@dataclass(frozen=True)
class StallEdit:
    """Set the stall count of every ``opcode`` instruction (its base, e.g. ``HMMA``) whose
    stall is ``from_stall`` to ``to_stall`` (CuAssembler's ``S08 -> S04``)."""

    opcode: str
    from_stall: int
    to_stall: int

    def __post_init__(self) -> None:
        for name in ("from_stall", "to_stall"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= 15:
                raise ValueError(f"{name} must be a stall count from 0 to 15, got {value!r}")

    @classmethod
    def parse(cls, text: str) -> StallEdit:
        """``"HMMA:8:4"`` (opcode, from, to)."""
        try:
            opcode, low, high = text.split(":")
            return cls(opcode.upper(), int(low), int(high))
        except ValueError as exc:
            raise ValueError(f"a stall edit reads OPCODE:FROM:TO (e.g. HMMA:8:4), got "
                             f"{text!r}") from exc


def _sections(elf: bytes, base: int) -> list[tuple[str, int, int]]:
    """(name, offset in ``elf``, size) of the sections of the ELF64 file at ``base``."""
    shoff, = struct.unpack_from("<Q", elf, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, base + 0x3A)

    def header(i: int) -> tuple[int, int, int]:
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", elf,
                                                         base + shoff + i * shentsize)
        return name, base + offset, size

    _, names_at, _ = header(shstrndx)
    result = []
    for i in range(shnum):
        name, offset, size = header(i)
        end = elf.index(b"\0", names_at + name)
        result.append((elf[names_at + name:end].decode("ascii", "replace"), offset, size))
    return result


def embedded_cubins(blob: bytes) -> list[int]:
    """Offsets of the CUDA cubins in ``blob``: 0 for a bare cubin, else every ELF header of
    machine ``EM_CUDA`` inside a host object."""
    found, at = [], blob.find(_ELF_MAGIC)
    while at >= 0:
        if len(blob) >= at + 0x14 and blob[at + 4] == 2:  # ELFCLASS64
            machine, = struct.unpack_from("<H", blob, at + 0x12)
            if machine == EM_CUDA:
                found.append(at)
        at = blob.find(_ELF_MAGIC, at + 1)
    return found


def _word(blob: bytes, at: int) -> int:
    low, high = struct.unpack_from("<QQ", blob, at)
    return high << 64 | low


def with_stall(encoding: int, stall: int) -> int:
    """``encoding`` with its stall field set to ``stall``."""
    return encoding & ~_STALL_MASK | stall << CONTROL_SHIFT


def _opcodes(cubin: bytes) -> dict[int, tuple[str, int]]:
    """nvdisasm's (opcode base, encoding) of each instruction of a one-kernel cubin, by
    offset in its ``.text`` section."""
    from attnlab.analysis.sass import disassemble, parse

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        instructions = parse(disassemble(path, encodings=True))
    return {i.address: (i.base, i.encoding) for i in instructions}


def _cubin_at(blob: bytes, base: int) -> bytes:
    """The bytes of the cubin at ``base`` (up to the end of its last section or header)."""
    phoff, shoff = struct.unpack_from("<QQ", blob, base + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, base + 0x36)
    end = max([shoff + shentsize * shnum, phoff + phentsize * phnum]
              + [offset - base + size for _, offset, size in _sections(blob, base)])
    return blob[base:base + end]


def patch_stalls(blob: bytes, edits: list[StallEdit]) -> tuple[bytes, int]:
    """``blob`` (a cubin or a host object embedding cubins) with ``edits`` applied to every
    kernel, and how many instructions changed. No edits (or none that match) return the
    same bytes."""
    out = bytearray(blob)
    changed = 0
    if not edits:
        return bytes(out), 0
    for base in embedded_cubins(blob):
        texts = [(offset, size) for name, offset, size in _sections(blob, base)
                 if name.startswith(".text.")]
        if len(texts) != 1:
            raise ValueError(f"the cubin at {base:#x} has {len(texts)} kernels; the patcher "
                             "edits one-kernel cubins (as attnlab compiles them)")
        offset, size = texts[0]
        for address, (opcode, encoding) in _opcodes(_cubin_at(blob, base)).items():
            if address + _INSTRUCTION_BYTES > size:
                raise ValueError(f"nvdisasm lists an instruction at {address:#x}, past the "
                                 f"{size}-byte section")
            at = offset + address
            word = _word(blob, at)
            if encoding is not None and word != encoding:
                raise ValueError(f"the bytes at {at:#x} are not the instruction nvdisasm "
                                 f"printed there")
            for edit in edits:
                if opcode == edit.opcode and decode(word).stall == edit.from_stall:
                    struct.pack_into("<QQ", out, at, *_split(with_stall(word, edit.to_stall)))
                    changed += 1
                    break
        _check_decodes(bytes(out), base, edits)
    return bytes(out), changed


def _check_decodes(patched: bytes, base: int, edits: list[StallEdit]) -> None:
    """nvdisasm must still read every instruction of the edited cubin: some opcodes tie the
    stall field to their encoding (sm_80's HMMA takes 1 to 11 only; 0 and 12-15 decode as
    undefined), and a word the disassembler rejects is one the GPU may reject too."""
    try:
        _opcodes(_cubin_at(patched, base))
    except RuntimeError as exc:
        raise ValueError(f"{edits} make an encoding nvdisasm rejects: "
                         f"{str(exc).splitlines()[-1]}") from exc


def _split(encoding: int) -> tuple[int, int]:
    return encoding & (1 << 64) - 1, encoding >> 64


def stall_census(blob: bytes, opcode: str) -> dict[int, int]:
    """How many ``opcode`` instructions carry each stall count, over every kernel of
    ``blob`` (what an edit is chosen from, and checked by)."""
    counts: dict[int, int] = {}
    for base in embedded_cubins(blob):
        for name, encoding in _opcodes(_cubin_at(blob, base)).values():
            if name == opcode and encoding is not None:
                stall = decode(encoding).stall
                counts[stall] = counts.get(stall, 0) + 1
    return dict(sorted(counts.items()))
