"""The lab's GEMM kernels (``attnlab.gemm`` calls them)."""
