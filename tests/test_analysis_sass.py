"""Static SASS statistics: histograms, groups, the seeds' evidence and the diff, on hand-written
SASS (the seeds' own listings) and on cubins cross-compiled from ladder configs (no GPU)."""

from __future__ import annotations

import json

import pytest

from attnlab import ladder
from attnlab.analysis.sass import (
    GROUPS,
    OTHER_GROUP,
    DiffRow,
    address_registers,
    analyze_cubin,
    build_report,
    changed,
    copies_feeding_hmma,
    diff,
    disassemble,
    group_histogram,
    group_of,
    histogram,
    parse,
    useful_pct,
)
from attnlab.compile import compile_config

HEAD_DIM = 64  # the smaller build compiles faster; the statistics tested do not depend on it


@pytest.fixture(scope="module")
def artifact_dir(tmp_path_factory):
    # One folder per session: compile_config's disk cache then serves every test module.
    path = tmp_path_factory.getbasetemp() / "attnlab-artifacts"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="module")
def build(artifact_dir):
    def _build(config, arch="sm_80"):
        return compile_config(config, arch, head_dim=HEAD_DIM, out_dir=artifact_dir)

    return _build


@pytest.fixture(scope="module")
def k01(build):
    return analyze_cubin(build(ladder.k01).cubin, label="k01", arch="sm_80")


@pytest.fixture(scope="module")
def k02(build):
    return analyze_cubin(build(ladder.k02).cubin, label="k02", arch="sm_80")


def sass(*lines: str) -> list:
    """Instructions from bare SASS lines, given addresses as nvdisasm prints them."""
    return parse("\n".join(f"        /*{16 * i:04x}*/  {line}" for i, line in enumerate(lines)))


# ---------------------------------------------------------------------------------------------
# Parsing, histograms, groups
# ---------------------------------------------------------------------------------------------
def test_parse_keeps_a_lowercase_vector_width_in_the_opcode():
    (red,) = sass("REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR20][R36.64], R4 ;")
    assert red.opcode == "REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU"
    assert red.operands.strip() == "desc[UR20][R36.64], R4"


def test_parse_reads_encodings_without_changing_instructions(build):
    cubin = build(ladder.k02).cubin
    plain, encoded = parse(disassemble(cubin)), parse(disassemble(cubin, encodings=True))
    assert [(i.address, i.opcode, i.operands) for i in plain] == \
           [(i.address, i.opcode, i.operands) for i in encoded]
    assert all(i.encoding is None for i in plain)
    assert all(i.encoding is not None and i.encoding < 1 << 128 for i in encoded)
    # The addresses step by 16 bytes: one 128-bit encoding per instruction, none skipped.
    assert [i.address for i in encoded] == list(range(0, 16 * len(encoded), 16))


def test_histogram_keeps_modifiers_apart():
    instrs = sass("IMAD.MOV.U32 R1, RZ, RZ, R2 ;", "IMAD.SHL.U32 R3, R4, 0x2, RZ ;",
                  "IMAD R5, R6, R7, R8 ;", "@!P0 IMAD.MOV.U32 R9, RZ, RZ, R1 ;")
    assert histogram(instrs) == {"IMAD": 4}
    assert histogram(instrs, modifiers=True) == {"IMAD.MOV.U32": 2, "IMAD.SHL.U32": 1,
                                                 "IMAD": 1}
    assert instrs[3].predicate == "@!P0"


@pytest.mark.parametrize(("opcode", "group"), [
    ("HMMA.16816.F32.BF16", "tensor"),
    ("FFMA", "fp32"), ("FMNMX.NAN", "fp32"),
    ("MUFU.EX2", "special function"),
    ("IMAD", "integer/address"), ("IMAD.SHL.U32", "integer/address"),
    ("IMAD.IADD", "integer/address"), ("LOP3.LUT", "integer/address"),
    ("SHF.R.U32.HI", "integer/address"), ("LEA.HI.X.SX32", "integer/address"),
    ("UIADD3", "integer/address"), ("USHF.L.U32", "integer/address"),
    ("IMAD.MOV.U32", "register copy"), ("IMAD.MOV", "register copy"), ("MOV", "register copy"),
    ("UMOV", "register copy"),
    ("CS2R", "CS2R"),
    ("ISETP.GE.AND", "compare/select"), ("FSEL", "compare/select"),
    ("LDSM.16.MT88.4", "shared memory"), ("STS.128", "shared memory"), ("LDS", "shared memory"),
    ("LDGSTS.E.BYPASS.LTC128B.128", "global memory"), ("STG.E.128", "global memory"),
    ("STL", "local memory"),
    ("ULDC.64", "constant/special reg"), ("S2R", "constant/special reg"),
    ("BAR.SYNC.DEFER_BLOCKING", "barrier/sync"), ("LDGDEPBAR", "barrier/sync"),
    ("DEPBAR.LE", "barrier/sync"),
    ("BRA", "control flow"), ("EXIT", "control flow"),
    ("SHFL.BFLY", "warp shuffle/vote"),
    ("NOP", OTHER_GROUP), ("UNKNOWNOP", OTHER_GROUP),
])
def test_group_of(opcode, group):
    assert group_of(opcode) == group


def test_groups_partition_a_real_kernel(k01, build):
    instrs = parse(disassemble(build(ladder.k01).cubin))
    groups = group_histogram(instrs)
    assert sum(groups.values()) == len(instrs)
    assert set(groups) <= set(GROUPS) | {OTHER_GROUP}
    ops = histogram(instrs)
    assert groups["tensor"] == ops["HMMA"] > 0
    assert groups["special function"] == ops["MUFU"] > 0
    # What is left over is padding, not an opcode the table forgot.
    assert {i.base for i in instrs if group_of(i.opcode) == OTHER_GROUP} <= {"NOP"}
    assert k01.groups == dict(groups)


def test_useful_pct_is_arithmetic_over_all():
    instrs = sass("HMMA.16816.F32 R4, R8, R12, R4 ;", "FFMA R1, R2, R3, R1 ;",
                  "FMUL R1, R1, R2 ;", "FADD R1, R1, R2 ;", "FMNMX R1, R1, R2, !PT ;",
                  "IMAD.MOV.U32 R1, RZ, RZ, R2 ;", "LDSM.16.M88.4 R8, [R2] ;", "EXIT ;")
    assert useful_pct(instrs) == pytest.approx(100 * 4 / 8)
    assert useful_pct([]) == 0.0


def test_useful_pct_of_a_real_kernel(k01):
    ops = k01.opcodes
    arithmetic = ops["HMMA"] + ops.get("FFMA", 0) + ops["FMUL"] + ops["FADD"]
    assert k01.useful_pct == pytest.approx(100 * arithmetic / k01.instructions)
    # Seed 004: high-performing tensor-core kernels sit at 25-40 %.
    assert 15 < k01.useful_pct < 50


# ---------------------------------------------------------------------------------------------
# Address registers (seed 000, kernel 8)
# ---------------------------------------------------------------------------------------------
#: Seed 000's complete LDGSTS listings of kernel 7 without and with swizzling.
SEED_LDGSTS_PLAIN = [
    "[R147], [R6.64]", "[R145+0x80], [R8.64]", "[R145+0x400], [R10.64]",
    "[R145+0x480], [R10.64+0x80]", "[R145+0x800], [R12.64]", "[R145+0x880], [R12.64+0x80]",
    "[R145+0xc00], [R4.64]", "[R145+0xc80], [R4.64+0x80]", "[R147+0x4000], [R14.64]",
    "[R145+0x4080], [R16.64]", "[R145+0x4400], [R18.64]", "[R145+0x4480], [R18.64+0x80]",
    "[R145+0x4800], [R8.64]", "[R145+0x4880], [R8.64+0x80]", "[R145+0x4c00], [R6.64]",
    "[R145+0x4c80], [R6.64+0x80]", "[R147+0x8000], [R40.64]", "[R145+0x8080], [R44.64]",
]
SEED_LDGSTS_SWIZZLED = [
    "[R39], [R24.64]", "[R41], [R16.64]", "[R43], [R26.64]", "[R45], [R26.64+0x80]",
    "[R39+0x800], [R28.64]", "[R41+0x800], [R28.64+0x80]", "[R47], [R24.64]",
    "[R49], [R24.64+0x80]", "[R39+0x4000], [R30.64]", "[R194+0x8000], [R24.64]",
    "[R198+0x8000], [R26.64]", "[R200+0x8000], [R30.64]", "[R202+0x8000], [R30.64+0x80]",
    "[R203+0x8000], [R68.64]", "[R204+0x8000], [R68.64+0x80]", "[R205+0x8000], [R28.64]",
    "[R206+0x8000], [R28.64+0x80]", "[R194+0x4000], [R144.64]",
]


@pytest.mark.parametrize(("listing", "expected"), [(SEED_LDGSTS_PLAIN, 2),
                                                   (SEED_LDGSTS_SWIZZLED, 14)])
def test_ldgsts_smem_address_registers_match_seed(listing, expected):
    """Seed 000: "the non-swizzled kernel uses only 2 registers for SMEM addresses while the
    swizzled version uses 14". The global source (second bracket) does not count."""
    instrs = sass(*(f"LDGSTS.E.BYPASS.LTC128B.128 {ops} ;" for ops in listing))
    assert len(address_registers(instrs, "LDGSTS")) == expected


def test_ldsm_address_registers_count_uses():
    instrs = sass("LDSM.16.M88.4 R4, [R205+0x8000] ;", "LDSM.16.M88.4 R140, [R178] ;",
                  "LDSM.16.M88.4 R156, [R205+0x9000] ;", "LDSM.16.MT88.4 R8, [R2+UR4+0x20] ;",
                  "LDS.128 R8, [R7] ;", "@!PT LDS RZ, [RZ] ;")
    assert address_registers(instrs, "LDSM") == {"R205": 2, "R178": 1, "R2": 1, "UR4": 1}
    assert address_registers(instrs, "LDS") == {"R7": 1}  # RZ is no register


def test_swizzling_costs_address_registers(k01, k02):
    """Seed 000 on kernel 7: 3 LDSM address registers unswizzled, 40 swizzled. CuTe folds most
    of the XOR into immediates, but the direction holds."""
    assert k01.distinct_address_registers("LDSM") < k02.distinct_address_registers("LDSM")
    assert 1 <= k01.distinct_address_registers("LDGSTS") <= 2


# ---------------------------------------------------------------------------------------------
# Register copies feeding HMMA (seed 000, kernel 9) and CS2R (kernel 10)
# ---------------------------------------------------------------------------------------------
def test_copies_feeding_hmma_seed_listing():
    """Seed 000's kernel 8 excerpt: four copies, all assembling HMMA B operands."""
    instrs = sass("MOV R200, R9 ;", "HMMA.16816.F32 R20, R192, R184, R20 ;",
                  "IMAD.MOV.U32 R201, RZ, RZ, R11 ;", "IMAD.MOV.U32 R184, RZ, RZ, R57 ;",
                  "MOV R185, R59 ;", "HMMA.16816.F32 R68, R192.reuse, R200, R68 ;",
                  "HMMA.16816.F32 R84, R192, R184, R84 ;")
    found = copies_feeding_hmma(instrs)
    assert [c.copy.address for c in found] == [0x00, 0x20, 0x30, 0x40]
    assert {c.operand for c in found} == {"B"}


def test_copies_feeding_hmma_operand_spans_and_path():
    instrs = sass(
        "MOV R6, R1 ;",                       # A spans R4..R7: feeds A
        "MOV R13, R2 ;",                      # B spans R12..R13: feeds B
        "MOV R14, R3 ;",                      # not an operand register (B is two wide)
        "IMAD.MOV.U32 R22, RZ, RZ, R3 ;",     # C spans R20..R23
        "MOV R30, R1 ;",                      # overwritten before the HMMA reads it
        "IADD3 R30, R30, 0x1, RZ ;",
        "HMMA.16816.F32.BF16 R20, R4, R12, R20 ;",
        "HMMA.16816.F32.BF16 R24, R28, R12, R24 ;",
        "MOV R40, R1 ;",                      # the path ends at an unconditional branch
        "BRA 0x200 ;",
        "HMMA.16816.F32.BF16 R44, R40, R12, R44 ;",
        "IMAD.SHL.U32 R50, R1, 0x2, RZ ;",    # not a copy
        "HMMA.16816.F32.BF16 R52, R48, R12, R52 ;",
    )
    found = {c.copy.operands.split(",")[0]: c.operand for c in copies_feeding_hmma(instrs)}
    assert found == {"R6": "A", "R13": "B", "R22": "C"}


def test_copies_feeding_hmma_in_the_ladder(k01, k02):
    """CuTe's tiled copies leave fragments where mma.sync wants them (seed 000's kernel 9 fix):
    no copy shuffles registers into an HMMA operand."""
    assert k01.copies_feeding_hmma_total == k02.copies_feeding_hmma_total == 0


def test_cs2r_counts_accumulator_zeroing(k01):
    # The O accumulator (block_m x head_dim fp32 per warp / 32 lanes) is zeroed in pairs.
    cfg = ladder.k01
    acc_regs = cfg.block_m // cfg.num_warps * HEAD_DIM // 32
    assert k01.cs2r == k01.opcodes["CS2R"] >= acc_regs // 2


# ---------------------------------------------------------------------------------------------
# Async vs synchronous copies, the report and the diff
# ---------------------------------------------------------------------------------------------
def test_ldgsts_present_only_with_async_copy(build, k02):
    sync = analyze_cubin(build(ladder.k02.replace(async_copy=False)).cubin, label="sync")
    assert k02.opcodes["LDGSTS"] > 0 and k02.distinct_address_registers("LDGSTS") > 0
    assert "LDGSTS" not in sync.opcodes and sync.distinct_address_registers("LDGSTS") == 0
    assert sync.opcodes["LDG"] > 0 and sync.opcodes["STS"] > 0
    assert sync.groups["global memory"] > 0


def test_report_to_dict_is_json(k01):
    data = json.loads(json.dumps(k01.to_dict()))
    assert data["counts"] == "static (build-time)"
    assert data["opcodes"]["HMMA"] == k01.opcodes["HMMA"]
    assert data["address_registers"]["LDSM"]["distinct"] == k01.distinct_address_registers("LDSM")
    assert sum(int(n) for n in data["stalls"]["HMMA"].values()) == k01.opcodes["HMMA"]


def test_report_without_encodings_has_no_control_codes(build):
    report = build_report(parse(disassemble(build(ladder.k01).cubin)))
    assert report.stalls == {} and report.hmma_intervals == {}
    assert report.opcodes["HMMA"] > 0


def test_diff_k01_vs_k02(k01, k02):
    rows = diff(k01, k02)
    evidence = {r.name: r for r in rows if r.section == "evidence"}
    assert list(evidence) == list(k01.evidence())
    ldsm = evidence["LDSM address registers"]
    assert (ldsm.a, ldsm.b) == (k01.distinct_address_registers("LDSM"),
                                k02.distinct_address_registers("LDSM"))
    assert ldsm.ratio == pytest.approx(ldsm.b / ldsm.a)
    groups = [r for r in rows if r.section == "group"]
    assert sum(r.delta for r in groups) == k02.instructions - k01.instructions
    opcodes = [r for r in rows if r.section == "opcode"]
    assert sum(r.b for r in opcodes) == k02.instructions
    # The same math: swizzling changes addressing, not the tensor-core work.
    assert evidence["instructions"].delta != 0
    assert all(r.name != "tensor" for r in changed(groups))
    assert json.dumps([r.to_dict() for r in rows])


def test_diff_row_ratio():
    assert DiffRow("opcode", "SEL", 0, 9).ratio is None
    row = DiffRow("opcode", "LOP3.LUT", 29, 53)
    assert (row.delta, row.ratio) == (24, pytest.approx(53 / 29))
