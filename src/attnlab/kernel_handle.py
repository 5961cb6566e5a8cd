"""The CUDA driver's view of a compiled CuTe DSL kernel: attributes and occupancy.

CuTe DSL 4.3.5 loads a compiled function as a CUDA library (``cudaLibrary_t``) the first time
it runs. Kernel 14's shared-memory carveout and the persistent grid's size need the driver's
kernel handle, which the DSL does not expose: we load the library ourselves through the
compiled function's executor and enumerate its kernels.
"""

from __future__ import annotations

from typing import Any

from attnlab.config import FlashConfig


def _check(result: tuple) -> Any:
    import cuda.bindings.driver as cuda

    err, *values = result
    if err != cuda.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err!r}")
    return values[0] if len(values) == 1 else values


def driver_kernels(compiled: Any) -> list:
    """The ``CUkernel`` handles of a compiled function (its library is loaded if need be)."""
    import cuda.bindings.driver as cuda

    compiled.to(None)  # loads the library into ``jit_module`` once; later calls reuse it
    kernels = []
    for library in compiled.jit_module.cuda_library:
        handle = cuda.CUlibrary(int(library))
        count = _check(cuda.cuLibraryGetKernelCount(handle))
        kernels += _check(cuda.cuLibraryEnumerateKernels(count, handle))
    return kernels


def apply_kernel_attributes(compiled: Any, config: FlashConfig, device: int) -> None:
    """Set what ``config`` asks of the driver (today: the shared-memory carveout)."""
    import cuda.bindings.driver as cuda

    if config.smem_carveout < 0:
        return
    attribute = cuda.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    for kernel in driver_kernels(compiled):
        _check(cuda.cuKernelSetAttribute(attribute, config.smem_carveout, kernel,
                                         cuda.CUdevice(device)))


def kernel_attribute(compiled: Any, name: str, device: int) -> int:
    """A ``CU_FUNC_ATTRIBUTE_*`` of the (single) kernel, e.g. ``"NUM_REGS"``."""
    import cuda.bindings.driver as cuda

    attribute = getattr(cuda.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
    (kernel,) = driver_kernels(compiled)
    return _check(cuda.cuKernelGetAttribute(attribute, kernel, cuda.CUdevice(device)))


def ctas_per_sm(compiled: Any, config: FlashConfig, head_dim: int, elem_bytes: int) -> int:
    """Resident CTAs per SM for this kernel on the current device (occupancy calculator)."""
    import cuda.bindings.driver as cuda

    (kernel,) = driver_kernels(compiled)
    function = _check(cuda.cuKernelGetFunction(kernel))
    return _check(cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        function, config.num_threads, config.smem_bytes(head_dim, elem_bytes)))
