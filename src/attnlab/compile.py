"""Compiling kernels: an in-memory cache for launches, and cross-compilation to artifacts.

* ``get_forward_kernel`` compiles a (config, arch, dtype, head_dim) once per process and reuses
  it; launches never compile on a timed path once warmed up.
* ``compile_config`` runs the same compilation on any machine, GPU or not, and writes the
  PTX and cubin for analysis. CuTe DSL 4.3.5 initialises the CUDA driver in its final host-JIT
  step, so we stop the compile just before that step with a post-compile hook that pulls the
  device binary out of the MLIR module (where it sits as an escaped fatbinary string).

Both paths compile against the same signature (raw pointers, sizes and strides; the head dim
is static), so the cubin we analyse is the one we run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.config import FlashConfig

DTYPE_NAMES = ("float16", "bfloat16")
DEFAULT_ARTIFACT_DIR = Path(tempfile.gettempdir()) / "attnlab-artifacts"

_kernel_cache: dict[tuple, Any] = {}


@dataclass(frozen=True)
class Artifacts:
    """Files produced by cross-compiling one kernel."""

    config: FlashConfig
    arch: str
    dtype: str
    head_dim: int
    cubin: Path
    ptx: Path | None
    kernel_name: str

    def to_dict(self) -> dict[str, object]:
        return {"config": self.config.to_dict(), "arch": self.arch, "dtype": self.dtype,
                "head_dim": self.head_dim, "cubin": str(self.cubin),
                "ptx": str(self.ptx) if self.ptx else None, "kernel_name": self.kernel_name}


class _StopBeforeJit(Exception):
    """Raised from the post-compile hook once the device binary is in hand."""


@functools.cache
def dsl_version() -> str:
    # Cached: it is part of every launch's kernel-cache key, and reading package metadata
    # costs far more than a small kernel runs.
    from importlib.metadata import version

    return version("nvidia-cutlass-dsl")


def _cutlass_dtype(dtype: str):
    import cutlass

    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {dtype!r}")
    return cutlass.Float16 if dtype == "float16" else cutlass.BFloat16


def _signature(dtype: str):
    """Placeholder arguments with the launch signature (values do not matter to compilation)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    elem = _cutlass_dtype(dtype)
    ptrs = [make_ptr(elem, 0, cute.AddressSpace.gmem, assumed_align=16) for _ in range(4)]
    lse = make_ptr(cutlass.Float32, 0, cute.AddressSpace.gmem, assumed_align=4)
    cu = [make_ptr(cutlass.Int32, 0, cute.AddressSpace.gmem, assumed_align=4) for _ in range(2)]

    def ints(n: int, value: int = 8) -> tuple:
        return tuple(cutlass.Int32(value) for _ in range(n))

    return (*ptrs, lse, *cu, ints(3), ints(3), ints(3), ints(3), ints(3), ints(3), ints(2),
            cutlass.Int32(1), cutlass.Int32(1), ints(2), cutlass.Float32(1.0), cutlass.Int32(1),
            make_fake_stream())


def launch_args(q, k, v, out, lse, softmax_scale: float, stream, *,
                window: tuple[int, int] = (-1, -1), cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q: int | None = None, persistent_ctas: int = 1) -> tuple:
    """The kernel's arguments for torch tensors.

    Dense: q/out ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]``, lse ``[B, Hq, Sq]``. Varlen
    (``cu_seqlens_*`` given): q/out ``[total_q, Hq, D]``, k/v ``[total_k, Hkv, D]``, lse
    ``[Hq, total_q]``, as one batch of packed rows. A window side < 0 is unbounded.
    ``persistent_ctas`` is the grid of a ``persistent`` config.
    """
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    from attnlab.kernels.common.mask import UNBOUNDED

    def ints(values) -> tuple:
        return tuple(cutlass.Int32(int(x)) for x in values)

    elem = _cutlass_dtype(str(q.dtype).removeprefix("torch."))
    ptrs = [make_ptr(elem, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)
            for t in (q, k, v, out)]
    lse_ptr = make_ptr(cutlass.Float32, lse.data_ptr(), cute.AddressSpace.gmem, assumed_align=4)
    varlen = cu_seqlens_q is not None
    if varlen:
        # A batch of one, with no batch stride: sequences are located by cu_seqlens.
        def shape(t):
            return (1, t.shape[0], t.shape[1])

        def strides(t):
            return (0, t.stride(0), t.stride(1))

        lse_strides = (0, lse.stride(0))
        cu = [make_ptr(cutlass.Int32, c.data_ptr(), cute.AddressSpace.gmem, assumed_align=4)
              for c in (cu_seqlens_q, cu_seqlens_k)]
        num_seqs, rows = cu_seqlens_q.shape[0] - 1, max_seqlen_q
    else:
        def shape(t):
            return t.shape[:3]

        def strides(t):
            return t.stride()[:3]

        lse_strides = lse.stride()[:2]
        # Unused by the dense kernel; any valid pointer keeps the signature.
        cu = [make_ptr(cutlass.Int32, lse.data_ptr(), cute.AddressSpace.gmem,
                       assumed_align=4)] * 2
        num_seqs, rows = q.shape[0], q.shape[1]
    left, right = (UNBOUNDED if side < 0 else side for side in window)
    return (*ptrs, lse_ptr, *cu, ints(shape(q)), ints(shape(k)),
            *(ints(strides(t)) for t in (q, k, v, out)), ints(lse_strides),
            cutlass.Int32(num_seqs), cutlass.Int32(rows), ints((left, right)),
            cutlass.Float32(softmax_scale), cutlass.Int32(persistent_ctas), stream)


#: Heads assumed when a ``static_strides`` config is cross-compiled without real tensors
#: (contiguous BSHD, as in the benchmarks).
CANONICAL_HEADS = 16

Strides = tuple[tuple[int, int], ...]


def row_head_strides(*tensors) -> Strides:
    """The (row, head) strides of each of q, k, v, out (dense BSHD or varlen THD): what a
    ``static_strides`` kernel is specialised on."""
    return tuple(tuple(int(x) for x in t.stride()[-3:-1]) for t in tensors)


def canonical_strides(head_dim: int, heads: int = CANONICAL_HEADS) -> Strides:
    """(row, head) strides of contiguous BSHD tensors with ``heads`` heads."""
    return ((heads * head_dim, head_dim),) * 4


def _kernel_object(config: FlashConfig, dtype: str, head_dim: int, windowed: bool,
                   varlen: bool, strides: Strides | None):
    from attnlab.kernels.sm80.forward import FlashForwardSm80
    from attnlab.kernels.sm90.forward import FlashForwardSm90

    static = (strides or canonical_strides(head_dim)) if config.static_strides else None
    kernel_class = FlashForwardSm90 if config.wgmma else FlashForwardSm80
    return kernel_class(config, head_dim, _cutlass_dtype(dtype), windowed, varlen,
                        static_strides=static)


def _compile_options(config: FlashConfig, arch: str) -> str:
    """``cute.compile`` options: the target, and the config's ptxas level.

    The DSL's ``--opt-level`` reaches ptxas as its ``-O`` level; the PTX is the same at every
    level (its ``--ptxas-options`` is not applied by DSL 4.3.5, checked on the cubin).
    """
    return f"--gpu-arch {arch} --opt-level {config.ptxas_opt_level}"


def _check(config: FlashConfig, arch: str, dtype: str, head_dim: int) -> None:
    if not isinstance(config, FlashConfig):
        raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
    _cutlass_dtype(dtype)
    config.check_problem(head_dim, arch)


def get_forward_kernel(config: FlashConfig, arch: str, dtype: str, head_dim: int, *,
                       windowed: bool = False, varlen: bool = False,
                       strides: Strides | None = None):
    """The compiled, launchable forward kernel (compiled on first use, then cached).

    ``strides`` (``row_head_strides`` of the tensors) matter only to a ``static_strides``
    config, which is compiled once per stride set.
    """
    strides = strides if config.static_strides else None
    key = (config, arch, dtype, head_dim, windowed, varlen, strides, dsl_version())
    kernel = _kernel_cache.get(key)
    if kernel is None:
        import cutlass.cute as cute

        _check(config, arch, dtype, head_dim)
        kernel = cute.compile(_kernel_object(config, dtype, head_dim, windowed, varlen,
                                             strides),
                              *_signature(dtype), options=_compile_options(config, arch))
        _kernel_cache[key] = kernel
    return kernel


# ---------------------------------------------------------------------------------------------
# Cross-compilation to artifacts
# ---------------------------------------------------------------------------------------------
_BINARY_GLOBAL = re.compile(r'llvm\.mlir\.global[^\n]*@kernels_binary[^\n]*?"((?:[^"\\]|\\.)*)"')
_MLIR_ESCAPE = re.compile(rb"\\([0-9A-Fa-f]{2}|\\)")


def _unescape_mlir(text: str) -> bytes:
    raw = text.encode("latin-1")
    return _MLIR_ESCAPE.sub(
        lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1), 16)]), raw
    )


def _field(header: bytes, lo: int, hi: int) -> int:
    return int.from_bytes(header[lo:hi], "little")


def _elf_images(blob: bytes) -> list[bytes]:
    """Cut the ELF images (cubins) out of a fatbinary by their header-table extents."""
    images = []
    start = blob.find(b"\x7fELF")
    while start >= 0:
        header = blob[start:start + 64]
        # The image ends after whichever table comes last: section or program headers.
        end = start + max(_field(header, 0x28, 0x30) + _field(header, 0x3A, 0x3C)
                          * _field(header, 0x3C, 0x3E),
                          _field(header, 0x20, 0x28) + _field(header, 0x36, 0x38)
                          * _field(header, 0x38, 0x3A))
        images.append(blob[start:end])
        start = blob.find(b"\x7fELF", end)
    return images


def _config_digest(config: FlashConfig, arch: str, dtype: str, head_dim: int, windowed: bool,
                   varlen: bool) -> str:
    payload = json.dumps([config.to_dict(), arch, dtype, head_dim, windowed, varlen,
                          dsl_version()], sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()[:12]


def compile_config(
    config: FlashConfig,
    arch: str = "sm_80",
    *,
    dtype: str = "bfloat16",
    head_dim: int = 128,
    windowed: bool = False,
    varlen: bool = False,
    out_dir: str | os.PathLike[str] | None = None,
) -> Artifacts:
    """Cross-compile one kernel for ``arch`` (no GPU needed) and write its cubin (and PTX).

    ``windowed`` / ``varlen`` select the causal-or-sliding-window and packed-sequence variants.
    Results are cached on disk by (config, arch, dtype, head_dim, variant, DSL version) under
    ``out_dir`` (default: a folder in the system temp dir).
    """
    _check(config, arch, dtype, head_dim)
    folder = Path(out_dir) if out_dir is not None else DEFAULT_ARTIFACT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    digest = _config_digest(config, arch, dtype, head_dim, windowed, varlen)
    variant = ("_win" if windowed else "") + ("_varlen" if varlen else "")
    stem = folder / f"fwd_{arch}_{dtype}_d{head_dim}{variant}_{digest}"
    cubin_path, ptx_path, meta_path = (stem.with_suffix(s) for s in (".cubin", ".ptx", ".json"))
    if cubin_path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return Artifacts(config, arch, dtype, head_dim, cubin_path,
                         ptx_path if ptx_path.exists() else None, meta["kernel_name"])

    blob, ptx = _compile_to_fatbinary(config, arch, dtype, head_dim, windowed, varlen)
    cubin = cubin_of(blob)
    cubin_path.write_bytes(cubin)
    if ptx is not None:
        ptx_path.write_text(ptx)
    names = re.findall(rb"\.text\.([A-Za-z0-9_$]+)", cubin)
    kernel_name = names[0].decode() if names else "unknown"
    meta_path.write_text(json.dumps({"kernel_name": kernel_name}))
    return Artifacts(config, arch, dtype, head_dim, cubin_path,
                     ptx_path if ptx else None, kernel_name)


def _compile_to_fatbinary(
    config: FlashConfig, arch: str, dtype: str, head_dim: int, windowed: bool, varlen: bool
) -> tuple[bytes, str | None]:
    """The device fatbinary and the PTX of one forward kernel, stopping before the host JIT."""
    return cross_compile(_kernel_object(config, dtype, head_dim, windowed, varlen, None),
                         _signature(dtype), _compile_options(config, arch))


def cross_compile(kernel: Any, args: tuple, options: str) -> tuple[bytes, str | None]:
    """The device fatbinary and the PTX of ``cute.compile(kernel, *args, options=options)``,
    stopping before the host JIT (no GPU or driver needed). ``options`` names the target
    (``--gpu-arch``); ``cubin_of`` cuts the cubin out of the fatbinary."""
    import cutlass.cute as cute
    from cutlass.base_dsl.compiler import PostCompileHookContext
    from cutlass.cutlass_dsl import CuTeDSL

    captured: dict[str, bytes] = {}

    def grab_binary(module) -> None:
        match = _BINARY_GLOBAL.search(str(module))
        if match is None:
            raise RuntimeError("no kernels_binary global in the compiled module")
        captured["blob"] = _unescape_mlir(match.group(1))
        raise _StopBeforeJit

    provider = CuTeDSL._get_dsl().compiler_provider
    with tempfile.TemporaryDirectory() as dump_dir, PostCompileHookContext(provider,
                                                                           grab_binary):
        try:
            cute.compile(kernel, *args,
                         options=options + f" --keep-ptx --dump-dir {dump_dir}")
        except Exception:  # the DSL wraps the hook's _StopBeforeJit in its own error type
            if "blob" not in captured:
                raise
        ptx_files = sorted(Path(dump_dir).glob("*.ptx"))
        ptx = ptx_files[0].read_text() if ptx_files else None
    return captured["blob"], ptx


def cubin_of(blob: bytes) -> bytes:
    """The (first) cubin of a fatbinary from ``cross_compile``."""
    images = _elf_images(blob)
    if not images:
        raise RuntimeError("the compiled module held no cubin; the CuTe DSL layout changed?")
    return images[0]
