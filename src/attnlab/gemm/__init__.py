"""The lab's GEMM family: the sm_90a HGEMM with split-K and shape dispatch.

``matmul(a, b)`` is ``a @ b`` for fp16/bf16 matrices (fp32 accumulation); ``GemmConfig`` holds
the kernel's knobs; ``dispatch.plan`` says how a shape runs.
"""

from attnlab.gemm.api import matmul
from attnlab.gemm_config import GemmConfig

__all__ = ["GemmConfig", "matmul"]
