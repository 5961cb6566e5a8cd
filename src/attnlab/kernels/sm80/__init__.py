"""The sm80 path: warp-level ``mma.sync`` m16n8k16, ``ldmatrix``, ``cp.async`` (Ampere+)."""
