"""Parsing Nsight Compute's raw CSV and the derived cross-checks (no GPU needed)."""

from __future__ import annotations

import pytest

from attnlab.analysis.ncu import KernelProfile, _number, all_metrics, derived, parse_raw_csv

RAW = '''==PROF== Connected to process 1234
"ID","Kernel Name","gpu__time_duration.sum","sass__inst_executed_per_opcode_with_modifier_all"
"","","nsecond",""
"0","kernel_cutlass_kernel_attnlab","1,515,040","HMMA.16816.F32.BF16: 134,217,728; MOV: 12"
==PROF== Disconnected
'''


def test_parse_raw_csv_skips_prof_lines_and_units():
    rows = parse_raw_csv(RAW)
    assert len(rows) == 1
    assert rows[0]["Kernel Name"] == "kernel_cutlass_kernel_attnlab"
    assert _number(rows[0]["gpu__time_duration.sum"]) == 1515040.0


def test_instanced_metric_becomes_a_dict():
    value = _number(parse_raw_csv(RAW)[0]["sass__inst_executed_per_opcode_with_modifier_all"])
    assert value == {"HMMA.16816.F32.BF16": 134217728.0, "MOV": 12.0}
    assert _number("n/a") == "n/a"


def test_parse_raw_csv_without_rows():
    assert parse_raw_csv("==PROF== nothing profiled\n") == []


def test_derived_cross_checks():
    profile = KernelProfile("attnlab", "k", {
        "bank_conflicts_ld": 50.0, "wavefronts_ld": 1000.0,
        "l2_to_l1_read_bytes": 1024.0 * 512, "ldgsts_instructions": 1024.0,
        "sm_cycles_elapsed": 1.98e6, "duration_ns": 1.1e6})
    out = derived(profile)
    assert out["ld_conflict_share_pct"] == pytest.approx(5.0)
    assert out["l2_bytes_per_ldgsts_byte"] == pytest.approx(1.0)
    assert out["sm_clock_mhz"] == pytest.approx(1800.0)
    assert derived(KernelProfile("x", "k", {"wavefronts_ld": "n/a"})) == {}


def test_metric_names_are_unique_and_qualified():
    names = list(all_metrics().values())
    assert len(names) == len(set(names))
    assert all("__" in name for name in names)


def test_source_page_gives_stall_reasons_and_the_worst_instructions():
    from attnlab.analysis.ncu import parse_source_csv

    text = "\n".join([
        '"Kernel Name","flash_kernel"',
        '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier",'
        '"stall_long_sb","stall_long_sb (Not Issued)","stall_math"',
        '"0x7f10","HMMA.16816.F32.BF16 R4, R8, R12, R4","120","0","10","99","110"',
        '"0x7f20","BAR.SYNC.DEFER_BLOCKING 0x0","300","290","10","0","0"',
        '"0x7f30","LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64]","1,500","0","1,400","7","100"',
        '"0x7f40","EXIT","0","0","0","0","0"',
    ])
    # A second launch of the same kernel (FA2's backward profiled by name) is left out.
    second = text.splitlines()
    text += "\n" + "\n".join(second[:2] + [second[2].replace('"120"', '"9,999"')])
    report = parse_source_csv(text, "attnlab", top=8)
    assert report.total == 1920
    assert dict(report.by_reason) == {"stall_long_sb": 1420, "stall_barrier": 290,
                                      "stall_math": 210}
    assert [s.address for s in report.sites] == ["0x7f30", "0x7f20", "0x7f10"]
    assert report.sites[0].reasons == (("stall_long_sb", 1400), ("stall_math", 100))
    assert report.sites[0].sass.startswith("LDGSTS")
