"""Compiling kernels with the CuTe DSL: one way for launches and for analysis alike.

Every kernel is compiled with TVM-FFI (``--enable-tvm-ffi``): the compiled function takes
torch tensors (through DLPack), Python numbers and ``None`` directly, checks them against the
signature it was compiled for (dtype, device, static sizes and strides, alignment) in C++, and
launches on the caller's current torch stream. That is what makes a call cheap: no Python
marshalling of pointers, shapes and strides.

The same compilation, with ``dump_dir``, also writes the cubin and PTX there; CuTe DSL 4.8
does this without a GPU or driver, so analysis reads the binary that launches run.
:func:`kernel_class` is the one place that maps a config to the kernel that implements it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.config import FlashConfig
from attnlab.kernels.abi import (
    BackwardSpec,
    CombineSpec,
    DecodeSpec,
    ForwardSpec,
    PreprocessSpec,
    fake_backward_args,
    fake_combine_args,
    fake_decode_args,
    fake_forward_args,
    fake_preprocess_args,
)
from attnlab.kernels.conv.abi import (
    DirectConvSpec,
    GroupNormSiluSpec,
    ImplicitConvSpec,
    fake_direct_conv_args,
    fake_groupnorm_args,
    fake_implicit_conv_args,
)
from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec, fake_gemm_args, fake_reduce_args


def kernel_class(config: FlashConfig) -> type:
    """The kernel class that implements ``config`` (the wgmma kernel or the mma.sync one)."""
    if config.wgmma:
        from attnlab.kernels.sm90.forward import FlashForwardSm90

        return FlashForwardSm90
    from attnlab.kernels.sm80.forward import FlashForwardSm80

    return FlashForwardSm80


def compile_kernel(kernel: Any, args: tuple, *, arch: str, opt_level: int = 3,
                   dump_dir: str | Path | None = None) -> Any:
    """``cute.compile(kernel, *args, stream)`` for ``arch`` with TVM-FFI, the stream being the
    caller's current one at each call. ``opt_level`` reaches ptxas as its ``-O`` level; with
    ``dump_dir`` the cubin and PTX are written there (:func:`dumped_binary`)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    options = f"--enable-tvm-ffi --gpu-arch {arch} --opt-level {opt_level}"
    if dump_dir is not None:
        options += f" --keep-cubin --keep-ptx --dump-dir {dump_dir}"
    return cute.compile(kernel, *args, make_fake_stream(use_tvm_ffi_env_stream=True),
                        options=options)


def compile_vector_kernel(kernel: Any, element_types: tuple, *, arch: str,
                          dump_dir: str | Path | None = None) -> Any:
    """:func:`compile_kernel` of a kernel whose arguments are 1-D vectors of
    ``element_types`` (unit stride, 4-byte aligned; the studies' gather and vector add)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    vectors = tuple(make_fake_tensor(t, (cute.sym_int(),), stride=(1,), assumed_align=4)
                    for t in element_types)
    return compile_kernel(kernel, vectors, arch=arch, dump_dir=dump_dir)


def compile_forward(spec: ForwardSpec, dump_dir: str | Path | None = None) -> Any:
    """The forward kernel of ``spec``, compiled (see :func:`compile_kernel`).

    Raises:
        attnlab.ConfigError: the config cannot serve this head dim on this target.
    """
    spec.config.check_problem(spec.head_dim, spec.arch)
    kernel = kernel_class(spec.config)(spec)
    return compile_kernel(kernel, tuple(fake_forward_args(spec)), arch=spec.arch,
                          opt_level=spec.config.ptxas_opt_level, dump_dir=dump_dir)


def compile_backward(spec: BackwardSpec, dump_dir: str | Path | None = None) -> Any:
    """The backward kernel of ``spec``, compiled (see :func:`compile_kernel`): the wgmma
    kernel or the mma.sync one."""
    spec.config.check_problem(spec.head_dim, spec.arch)
    if spec.config.wgmma:
        from attnlab.kernels.sm90.backward import FlashBackwardSm90 as kernel
    else:
        from attnlab.kernels.sm80.backward import FlashBackwardSm80 as kernel
    return compile_kernel(kernel(spec), tuple(fake_backward_args(spec)), arch=spec.arch,
                          opt_level=spec.config.ptxas_opt_level, dump_dir=dump_dir)


#: Specs whose kernel class is one per spec type: (module, class, compile-time arguments).
_KERNEL_OF = {
    DecodeSpec: ("attnlab.kernels.common.decode", "FlashDecode", fake_decode_args),
    CombineSpec: ("attnlab.kernels.common.decode_combine", "DecodeCombine", fake_combine_args),
    PreprocessSpec: ("attnlab.kernels.common.bwd_preprocess", "BackwardPreprocess",
                     fake_preprocess_args),
    ReduceSpec: ("attnlab.kernels.gemm.reduce", "SplitKReduce", fake_reduce_args),
    GroupNormSiluSpec: ("attnlab.kernels.conv.groupnorm", "GroupNormSilu",
                        fake_groupnorm_args),
    DirectConvSpec: ("attnlab.kernels.conv.direct", "DirectConv", fake_direct_conv_args),
}


def compile_spec(spec: ForwardSpec | BackwardSpec | PreprocessSpec | DecodeSpec | CombineSpec
                 | GemmSpec | ReduceSpec | GroupNormSiluSpec | DirectConvSpec
                 | ImplicitConvSpec,
                 dump_dir: str | Path | None = None) -> Any:
    """The kernel of a forward, backward, preprocess, decoding, GEMM or conv-family spec,
    compiled."""
    if isinstance(spec, GemmSpec | ImplicitConvSpec):
        from attnlab.gemm_config import MmaGemmConfig

        mma_sync = isinstance(spec.config, MmaGemmConfig)
        if isinstance(spec, ImplicitConvSpec):
            from attnlab.kernels.conv import implicit

            kernel = (implicit.ImplicitConvSm80 if mma_sync else implicit.ImplicitConvSm90)(spec)
            args = fake_implicit_conv_args(spec)
        else:
            from attnlab.kernels.gemm import sm80, sm90

            kernel = (sm80.HgemmSm80 if mma_sync else sm90.HgemmSm90)(spec)
            args = fake_gemm_args(spec)
        return compile_kernel(kernel, tuple(args), arch=spec.arch, dump_dir=dump_dir)
    if isinstance(spec, BackwardSpec):
        return compile_backward(spec, dump_dir)
    if type(spec) in _KERNEL_OF:
        import importlib

        module, name, fake_args = _KERNEL_OF[type(spec)]
        kernel = getattr(importlib.import_module(module), name)(spec)
        return compile_kernel(kernel, tuple(fake_args(spec)), arch=spec.arch, dump_dir=dump_dir)
    return compile_forward(spec, dump_dir)


def dumped_binary(dump_dir: str | Path) -> tuple[Path, Path | None]:
    """The cubin and PTX (None if absent) files a ``dump_dir`` compilation wrote."""
    folder = Path(dump_dir)
    cubins = sorted(folder.glob("*.cubin"))
    if not cubins:
        raise RuntimeError(f"the compilation wrote no cubin to {folder}")
    ptx = sorted(folder.glob("*.ptx"))
    return cubins[0], ptx[0] if ptx else None
