"""Launching a bare cubin (one built by nvcc, or a control-code-edited copy of one) through
the CUDA driver API on torch's current stream: what the front-end study and the cubin A/B
timing of control-code edits run."""

from __future__ import annotations

import ctypes

#: Argument kinds of ``CubinFunction.launch``: a device pointer, a 32-bit int.
POINTER, INT = ctypes.c_void_p, ctypes.c_int


class CubinFunction:
    """One kernel of a cubin, loaded into the current CUDA context."""

    def __init__(self, cubin: bytes, symbol: str):
        from cuda.bindings import driver

        err, self.module = driver.cuModuleLoadData(cubin)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleLoadData failed: {err}")
        err, self.function = driver.cuModuleGetFunction(self.module, symbol.encode())
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"no kernel {symbol!r} in the cubin: {err}")

    def launch(self, grid: tuple[int, int], block: int, args: tuple, kinds: tuple) -> None:
        """``grid`` x ``block`` threads on torch's current stream; ``args`` are ints (device
        pointers as ``data_ptr()``), ``kinds`` their ``POINTER`` / ``INT``."""
        import torch
        from cuda.bindings import driver

        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        (err,) = driver.cuLaunchKernel(self.function, *grid, 1, block, 1, 1, 0, stream,
                                       (args, kinds), 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel failed: {err}")
