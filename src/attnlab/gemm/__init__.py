"""The lab's GEMM family: the sm_90a HGEMM with split-K and shape dispatch.

``matmul(a, b)`` is ``a @ b`` for fp16/bf16 matrices (fp32 accumulation);
``int8_matmul(a_q, b_q, scale_a, scale_b, zero_b=...)`` the dequantized product of int8 ones;
``sparse_matmul(compress_2_4(a), b)`` the product of a 2:4 structured-sparse A;
``online_int8_matmul(a, b)`` fp16/bf16 operands quantized to int8 per K tile in the kernel;
``GemmConfig`` holds the kernel's knobs; ``dispatch.plan`` says how a shape runs.
"""

from attnlab.gemm.api import matmul
from attnlab.gemm.int8 import int8_matmul
from attnlab.gemm.online import online_int8_matmul
from attnlab.gemm.sparse import Sparse24, compress_2_4, prune_2_4, sparse_matmul
from attnlab.gemm_config import GemmConfig

__all__ = ["GemmConfig", "Sparse24", "compress_2_4", "int8_matmul", "matmul",
           "online_int8_matmul", "prune_2_4", "sparse_matmul"]
