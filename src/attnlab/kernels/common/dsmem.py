"""Loads from a cluster peer's shared memory (distributed shared memory, sm_90): ``mapa``
turns this CTA's shared-memory address into the same offset in CTA ``rank`` of the cluster,
and ``ld.shared::cluster`` reads it (a few hundred cycles, no trip to L2). Shared by the GEMM's
cluster split-K and the decoding's cluster merge."""

import cutlass
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

#: fp32 values in one 16-byte peer load.
VECTOR = 4


def load_peer_v4(local_addr, rank) -> list:
    """The four fp32 values at shared-memory address ``local_addr`` (this CTA's offset) in the
    shared memory of cluster CTA ``rank`` (``mapa``, then one ``ld.shared::cluster.v4``)."""
    result = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * VECTOR),
        [cutlass.Int32(local_addr).ir_value(), cutlass.Int32(rank).ir_value()],
        "{ .reg .b32 a; mapa.shared::cluster.u32 a, $4, $5;\n"
        "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [a]; }",
        "=f,=f,=f,=f,r,r", has_side_effects=True)
    return [cutlass.Float32(llvm.extractvalue(T.f32(), result, [i])) for i in range(VECTOR)]


def load_peer_f32(local_addr, rank) -> cutlass.Float32:
    """The fp32 value at ``local_addr`` in the shared memory of cluster CTA ``rank``."""
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [cutlass.Int32(local_addr).ir_value(), cutlass.Int32(rank).ir_value()],
        "{ .reg .b32 a; mapa.shared::cluster.u32 a, $1, $2;\n"
        "ld.shared::cluster.f32 $0, [a]; }",
        "=f,r,r", has_side_effects=True))
