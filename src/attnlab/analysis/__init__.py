"""Explaining compiled kernels from their artifacts (cubin/PTX); never imports kernel code."""
