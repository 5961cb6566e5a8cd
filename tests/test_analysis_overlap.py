"""``analysis.overlap``: where an overlapped body's exponentials, waits and O multiplies sit."""

from attnlab.analysis.overlap import softmax_order


def _sass(ops: list[str]) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {op} ;"
                     for i, op in enumerate(ops))


def test_softmax_order_counts_per_body():
    """Body 1: two exponentials before the P V wait, O's multiplies after the last one;
    body 2: the wait first, the multiplies between exponentials; a stretch without
    exponentials (the epilogue's normalisation) is not a body's."""
    body = ["WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT",
            "WARPGROUP.DEPBAR.LE gsb0, 0x1"]
    text = _sass(
        body + ["MUFU.EX2 R1, R1", "MUFU.EX2 R2, R2", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                "MUFU.EX2 R3, R3", "FMUL R88, R88, R3", "FMUL R89, R89, R3"]
        + body + ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R1, R1", "FMUL R88, R88, R3",
                  "MUFU.EX2 R2, R2", "F2FP.BF16.F32.PACK_AB R120, R2, R1"]
        + ["WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "FMUL R88, R88, R5",
           "WARPGROUP.ARRIVE"])
    order = softmax_order(text)
    assert order.exps_before_pv_wait == [2, 0]
    assert order.fmuls_after_last_exp == [2, 0]


def test_softmax_order_of_no_overlap_is_empty():
    text = _sass(["HMMA.16816.F32.BF16 R4, R8, R12, R4", "MUFU.EX2 R1, R1", "FMUL R2, R2, R1"])
    order = softmax_order(text)
    assert order.exps_before_pv_wait == [] and order.fmuls_after_last_exp == []
