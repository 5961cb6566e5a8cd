"""Where the overlapped softmax's work sits in a warpgroup-MMA K/V loop (static SASS order).

With FA3's intra-warpgroup overlap a loop body issues block j's S = Q K^T and block j-1's
O += P V, waits for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``), runs the softmax, waits for
everything (``gsb0, 0x0``: P V done, so O and the previous P may be written), then writes
P and rescales O. Two positions in that order have measured to matter on an H100
(docs/ladder.md, thirty-seventh, thirty-eighth and forty-seventh sessions):

* how many exponentials (``MUFU.EX2``) issue before the P V wait: the wait first stalls the
  warp on the tensor cores; behind a long run of exponentials they queue back to back;
* how many ``FMUL``s (O's rescale) follow the stretch's last exponential: there they end the
  body without filling the issue slots between exponentials, which a rescale interleaved
  with them does (FA4's build, and ``correction_first``).

Both are read per body from the disassembly, in address order (the loop bodies, the first
block's peeled body and any masked twin alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab.analysis.dependencies import labels, loop_bodies
from attnlab.analysis.sass import Instruction, parse

_WAIT = "WARPGROUP.DEPBAR.LE"


@dataclass(frozen=True)
class SoftmaxOrder:
    """Per overlapped body, in address order."""

    #: ``MUFU.EX2`` between the wait for S and the wait for everything.
    exps_before_pv_wait: list[int]
    #: From each wait for everything to the next MMA issue, where that stretch has
    #: exponentials: the ``FMUL``s after its last one.
    fmuls_after_last_exp: list[int]


def softmax_order(sass_text: str) -> SoftmaxOrder:
    """The positions above in a kernel's SASS (``nvdisasm -c`` text)."""
    before, after = [], []
    exps = None  # since a wait for S
    stretch = None  # ops since a wait for everything
    for instr in parse(sass_text):
        waits = instr.opcode == _WAIT and instr.operands.startswith("gsb0")
        if waits and instr.operands.endswith("0x1"):
            exps = 0
        elif waits and instr.operands.endswith("0x0"):
            if exps is not None:
                before.append(exps)
            exps, stretch = None, []
        elif instr.opcode == "WARPGROUP.ARRIVE" and stretch is not None:
            if "EX2" in stretch:
                last = len(stretch) - 1 - stretch[::-1].index("EX2")
                after.append(stretch[last:].count("FMUL"))
            stretch = None
        elif instr.opcode.startswith("MUFU.EX2"):
            exps = None if exps is None else exps + 1
            if stretch is not None:
                stretch.append("EX2")
        elif instr.base == "FMUL" and stretch is not None:
            stretch.append("FMUL")
    return SoftmaxOrder(before, after)


def kv_loops(sass_text: str) -> list[list[Instruction]]:
    """The K/V loops of a warpgroup-MMA kernel (``nvdisasm -c`` text): the loops with wgmmas
    and exponentials that hold no other such loop (not the tile loop around them) and no
    ``EXIT`` (not the spans from a wait's retry, laid out past the kernel's end, back into
    the code). A waiting loop's retry laid out inside a K/V loop is part of its body."""
    bodies = [body for body in loop_bodies(parse(sass_text), labels(sass_text))
              if any(i.base == "HGMMA" for i in body)
              and any(i.opcode.startswith("MUFU.EX2") for i in body)
              and not any(i.base == "EXIT" for i in body)]

    def holds(outer: list[Instruction], inner: list[Instruction]) -> bool:
        return (outer is not inner and outer[0].address <= inner[0].address
                and inner[-1].address <= outer[-1].address)

    return [body for body in bodies if not any(holds(body, other) for other in bodies)]
