"""Seed 003's RAW-dependency count (``analysis.dependencies``), on hand-written SASS whose
answer is known and on a cross-compiled ladder kernel."""

from __future__ import annotations

import tempfile

from attnlab import ladder
from attnlab.analysis.dependencies import labels, main_loop, raw_dependencies
from attnlab.analysis.sass import analyze_cubin, disassemble, parse
from attnlab.compile import compile_config

# A prologue, then a loop: two scalar producers feed the LDSM's address (one of them from
# the previous iteration, below it), one feeds the LDGSTS, a register copy made before the
# loop feeds nothing in it, an LDSM result (not scalar) feeds the HMMA.
TEXT = """
        /*0000*/                   MOV R9, 0x40 ;
        /*0010*/                   IMAD.SHL.U32 R4, R9, 0x2, RZ ;
.L_x_0:
        /*0020*/                   SHF.L.U32 R2, R9, 0x1, RZ ;
        /*0030*/                   LDSM.16.M88.4 R12, [R2+R5+0x4000] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R7+0x100], [R10.64] ;
        /*0050*/                   HMMA.16816.F32.BF16 R20, R12, R14, R20 ;
        /*0060*/                   IADD3 R5, R5, 0x20, RZ ;
        /*0070*/                   LEA R10, P0, R9, R10, 0x1 ;
        /*0080*/                   ISETP.NE.AND P0, PT, R5, 0x100, PT ;
        /*0090*/               @P0 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
"""


def test_producers_are_counted_once_through_the_loop():
    assert labels(TEXT) == {".L_x_0": 0x20}
    body = main_loop(parse(TEXT), labels(TEXT))
    assert [i.address for i in body] == list(range(0x20, 0xA0, 0x10))
    deps = raw_dependencies(TEXT)
    # LDSM: SHF (R2) and IADD3 (R5, last iteration's); LDGSTS: LEA (R10/R11 pair; R7 is
    # written nowhere in the loop); HMMA: only LDSM results and its own accumulator.
    assert deps.by_consumer == {"LDGSTS": 1, "LDSM": 2, "HMMA": 0}
    assert deps.total == 3 and deps.loop_instructions == 8


def test_no_loop_no_producers():
    text = "\n".join(line for line in TEXT.splitlines() if "BRA" not in line)
    assert raw_dependencies(text).total == 0


def test_a_ladder_kernels_main_loop_and_its_report_row():
    built = compile_config(ladder.k07, "sm_80", head_dim=128, out_dir=tempfile.mkdtemp())
    text = disassemble(built.cubin)
    deps = raw_dependencies(text)
    body = main_loop(parse(text), labels(text))
    assert deps.loop_instructions == len(body) > 100
    assert sum(1 for i in body if i.base == "HMMA") > 0
    assert deps.by_consumer["LDSM"] > 0 and deps.by_consumer["LDGSTS"] > 0
    report = analyze_cubin(built.cubin, label="k07", arch="sm_80")
    assert report.evidence()["RAW producers in the main loop"] == deps.total
