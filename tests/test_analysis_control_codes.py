"""Control codes decoded from the 128-bit encodings: hand-written encodings, the bit positions
checked against nvdisasm itself, and plausible scheduling on real cubins (no GPU)."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from attnlab import ladder
from attnlab.analysis.control_codes import (
    ControlCode,
    control_codes,
    decode,
    issue_intervals,
    stall_summary,
)
from attnlab.analysis.sass import (
    disassemble,
    hmma_operand_registers,
    parse,
    written_registers,
)
from attnlab.analysis.tools import find_tool
from attnlab.compile import compile_config


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "attnlab-artifacts"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def kernel(request, artifact_dir):
    """(arch, instructions with encodings) of kernel 2 at head dim 64."""
    art = compile_config(ladder.k02, request.param, head_dim=64, out_dir=artifact_dir)
    return request.param, parse(disassemble(art.cubin, encodings=True))


def high_word(control: int) -> int:
    """A 128-bit encoding whose control field (high-word bits 41..61) is ``control``."""
    return control << (64 + 41)


# ---------------------------------------------------------------------------------------------
# Hand-written encodings
# ---------------------------------------------------------------------------------------------
def test_decode_every_field_of_a_hand_written_encoding():
    # stall 13, yield bit clear (= yield), write barrier 3, read barrier 5,
    # wait on scoreboards 0, 3 and 5, reuse slots b and c.
    control = 13 | 0 << 4 | 3 << 5 | 5 << 8 | 0b101001 << 11 | 0b0110 << 17
    code = decode(high_word(control) | 0x0123456789ABCDEF)  # low-word bits do not leak in
    assert code == ControlCode(stall=13, yield_hint=True, write_barrier=3, read_barrier=5,
                               wait_mask=0b101001, reuse=0b0110)
    assert code.waits == (0, 3, 5)
    assert str(code) == "[B0--3-5:R5:W3:Y:S13]"


def test_decode_empty_barriers():
    code = decode(high_word(1 | 1 << 4 | 7 << 5 | 7 << 8))
    assert (code.write_barrier, code.read_barrier, code.yield_hint) == (None, None, False)
    assert str(code) == "[B------:R-:W-:-:S01]"


@pytest.mark.parametrize(("high", "text", "reuse"), [
    # MOV R1, c[0x0][0x28]: the first instruction of every kernel here.
    (0x000fe40000000f00, "[B------:R-:W-:-:S02]", 0),
    # LDSM.16.M88.4 R80, [R0]: result on scoreboard 2, address read on scoreboard 1.
    (0x0002a80000000200, "[B------:R1:W2:-:S04]", 0),
    # HMMA.16816.F32.BF16 R4, R80.reuse, R72, RZ: waits for two LDSMs, S08 (seed 004).
    (0x046ff000000418ff, "[B-12---:R-:W-:-:S08]", 0b0001),
])
def test_decode_compiler_encodings(high, text, reuse):
    code = decode(high << 64)
    assert (str(code), code.reuse) == (text, reuse)


def test_decode_rejects_non_128_bit_values():
    with pytest.raises(ValueError, match="128-bit"):
        decode(1 << 128)
    with pytest.raises(ValueError, match="encodings=True"):
        control_codes(parse("        /*0000*/  NOP ;"))


# ---------------------------------------------------------------------------------------------
# The bit positions, checked against nvdisasm
# ---------------------------------------------------------------------------------------------
def test_reuse_bits_match_nvdisasm_reuse_flags(kernel):
    _, instrs = kernel
    for instr, code in control_codes(instrs):
        assert bin(code.reuse).count("1") == instr.operands.count(".reuse"), instr


@pytest.mark.parametrize(("encoding", "text", "slots"), [
    # Two instructions from sm_80 builds of kernel 2 (HMMA has no reuse slot for C).
    (0x000FE6000000008F0000007E007E7223, "FFMA R126, R0, R126, R143", 3),
    (0x0040FF00000041804000000605C04723C, "HMMA.16816.F32.BF16 R4, R92, R96, R4", 2),
])
def test_reuse_bit_positions_round_trip_through_nvdisasm(tmp_path, encoding, text, slots):
    """Set one reuse bit at a time and let nvdisasm say which source operand it marks: bit i
    of the field (high-word bit 58 + i) is source slot i (a, b, c)."""
    field = 0xF << (64 + 58)
    for slot in range(slots):
        modified = encoding & ~field | 1 << (64 + 58 + slot)
        raw = tmp_path / f"slot{slot}.bin"
        raw.write_bytes(modified.to_bytes(16, "little"))
        out = subprocess.run([str(find_tool("nvdisasm")), "--binary", "SM80", str(raw)],
                             capture_output=True, text=True, check=True).stdout
        (instr,) = parse(out)
        assert f"{instr.opcode} {instr.operands}".replace(".reuse", "") == text
        assert [i for i, op in enumerate(instr.operand_list) if op.endswith(".reuse")] == \
               [slot + 1]
        assert decode(modified).reuse == 1 << slot


def test_every_ldsm_result_is_waited_for_before_an_hmma_reads_it(kernel):
    """Scoreboard semantics tie the write-barrier and wait-mask fields together: an LDSM that
    signals scoreboard b is followed by a wait on b before any HMMA consumes its registers."""
    _, instrs = kernel
    pairs = control_codes(instrs)
    checked = 0
    for index, (ldsm, code) in enumerate(pairs):
        if ldsm.base != "LDSM" or code.write_barrier is None:
            continue
        registers, waited = written_registers(ldsm), False
        for instr, later in pairs[index + 1:]:
            waited = waited or code.write_barrier in later.waits
            if instr.base == "HMMA" and any(
                    registers & regs for regs in hmma_operand_registers(instr).values()):
                assert waited, (ldsm, instr)
                checked += 1
                break
            if registers & written_registers(instr) or instr.ends_path:
                break
    assert checked > 10


def test_barriers_sit_where_latency_is_variable(kernel):
    _, instrs = kernel
    pairs = control_codes(instrs)
    for instr, code in pairs:
        assert code.stall <= 15
        for barrier in (code.write_barrier, code.read_barrier):
            assert barrier is None or 0 <= barrier < 6
        if instr.base in ("FFMA", "FMUL", "IADD3", "LOP3", "HMMA"):
            assert code.write_barrier is None, instr  # fixed latency: no scoreboard
        if instr.base == "S2R":
            assert code.write_barrier is not None, instr
    assert any(code.yield_hint for _, code in pairs)
    assert sum(code.yield_hint for _, code in pairs) < len(pairs) / 4


def test_hmma_issue_interval_is_eight_cycles_on_ampere(kernel):
    """Seed 004: HMMA.16816 issues at most every 8 cycles per warp on Ampere ("S08 is
    hardware-fixed"); the stall fields between consecutive HMMAs never add up to less."""
    arch, instrs = kernel
    intervals = issue_intervals(instrs)
    assert sum(intervals.values()) > 50
    if arch == "sm_80":
        assert min(intervals) == 8
        assert intervals.most_common(1)[0][0] == 8
    else:
        assert min(intervals) >= 4  # Hopper's mma.sync pipe issues faster


def test_stall_summary_counts_every_instruction(kernel):
    _, instrs = kernel
    summary = stall_summary(instrs)
    assert {op: counts.total() for op, counts in summary.items()} == \
           Counter(i.base for i in instrs)
    plausible = set(range(1, 16))
    assert set(summary["HMMA"]) <= plausible
    by_modifier = stall_summary(instrs, modifiers=True)
    assert sum(c.total() for op, c in by_modifier.items() if op.startswith("LDSM")) == \
           summary["LDSM"].total()
