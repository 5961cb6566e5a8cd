"""Launching a bare cubin (one built by nvcc, or a control-code-edited copy of one) through
the CUDA driver API on torch's current stream: what the front-end study and the cubin A/B
timing of control-code edits run."""

from __future__ import annotations

import ctypes

#: Argument kinds of ``CubinFunction.launch``: a device pointer, a 32-bit int, an fp32.
POINTER, INT, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class CubinFunction:
    """One kernel of a cubin, loaded into the current CUDA context; ``shared_bytes`` of
    dynamic shared memory a launch (allowed past the default 48 KiB)."""

    def __init__(self, cubin: bytes, symbol: str, shared_bytes: int = 0):
        import torch
        from cuda.bindings import driver

        # The driver loads into the thread's current context, which torch makes current only
        # once it has touched the device (a bare A/B run may not have yet): take torch's.
        _, device = driver.cuDeviceGet(torch.cuda.current_device())
        _, context = driver.cuDevicePrimaryCtxRetain(device)
        driver.cuCtxSetCurrent(context)
        err, self.module = driver.cuModuleLoadData(cubin)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuModuleLoadData failed: {err}")
        err, self.function = driver.cuModuleGetFunction(self.module, symbol.encode())
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"no kernel {symbol!r} in the cubin: {err}")
        self.shared_bytes = shared_bytes
        if shared_bytes > 48 * 1024:
            attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            (err,) = driver.cuFuncSetAttribute(self.function, attribute, shared_bytes)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{shared_bytes} bytes of shared memory refused: {err}")

    def launch(self, grid: tuple[int, int], block: int, args: tuple, kinds: tuple) -> None:
        """``grid`` x ``block`` threads on torch's current stream; ``args`` are ints (device
        pointers as ``data_ptr()``), ``kinds`` their ``POINTER`` / ``INT``."""
        import torch
        from cuda.bindings import driver

        stream = driver.CUstream(torch.cuda.current_stream().cuda_stream)
        (err,) = driver.cuLaunchKernel(self.function, *grid, 1, block, 1, 1,
                                       self.shared_bytes, stream, (args, kinds), 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuLaunchKernel failed: {err}")
