"""Cross-compilation to artifacts: the cubin and PTX of a kernel, for analysis.

``compile_config`` runs the compilation launches run (``attnlab.jit``) on any machine, GPU or
not, and keeps the cubin and PTX on disk; the SASS, resource and bank tools read them. Launches
do not come here: ``attnlab.runtime`` and its kernel cache do.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from attnlab.backward_config import BackwardConfig
from attnlab.config import FlashConfig
from attnlab.gemm_config import GemmConfig
from attnlab.kernels.abi import BackwardSpec, ForwardSpec, PreprocessSpec
from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec

DEFAULT_ARTIFACT_DIR = Path(tempfile.gettempdir()) / "attnlab-artifacts"


@dataclass(frozen=True)
class Artifacts:
    """Files produced by cross-compiling one kernel (attention forward or backward, GEMM)."""

    config: FlashConfig | BackwardConfig | GemmConfig | None
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
    """Cross-compile one forward kernel for ``arch`` (no GPU needed); write its cubin and PTX.

    ``windowed`` / ``varlen`` select the causal-or-sliding-window and packed-sequence variants
    (with the LSE, and for a ``static_strides`` config the strides of contiguous tensors of
    ``abi.CANONICAL_HEADS`` heads). Results are cached on disk by everything that changes the
    binary (``kernel_cache.spec_digest``) under ``out_dir`` (default: a folder in the system
    temp dir).

    Raises:
        TypeError: ``config`` is not a FlashConfig.
        ValueError: an unknown dtype; attnlab.ConfigError (a ValueError) for a config that
            cannot serve this head dim on ``arch``.
    """
    if not isinstance(config, FlashConfig):
        raise TypeError(f"config must be a FlashConfig, got {type(config).__name__}")
    spec = ForwardSpec(config, arch, dtype, head_dim, windowed, varlen)
    return compile_spec(spec, out_dir)


def compile_spec(spec: ForwardSpec | BackwardSpec | PreprocessSpec | GemmSpec | ReduceSpec,
                 out_dir: str | os.PathLike[str] | None = None) -> Artifacts:
    """:func:`compile_config` for any :class:`ForwardSpec` (e.g. one without the LSE),
    :class:`BackwardSpec`, :class:`PreprocessSpec` (whose artifacts have no config) or GEMM
    ``GemmSpec`` (whose artifacts have head dim 0)."""
    from attnlab.jit import compile_spec as compile_kernel_of
    from attnlab.jit import dumped_binary
    from attnlab.kernel_cache import spec_digest

    config = getattr(spec, "config", None)
    head_dim = getattr(spec, "head_dim", 0)
    if config is not None:
        config.check_problem(head_dim, spec.arch)
    from attnlab.kernel_cache import fingerprint

    # By default under the sources' fingerprint: an edited kernel is compiled again.
    folder = Path(out_dir) if out_dir is not None else DEFAULT_ARTIFACT_DIR / fingerprint()
    folder.mkdir(parents=True, exist_ok=True)
    kind = {BackwardSpec: "bwd", PreprocessSpec: "pre", GemmSpec: "gemm",
            ReduceSpec: "reduce"}.get(type(spec), "fwd")
    stem = folder / (f"{kind}_{spec.arch}_{spec.dtype}_d{head_dim}{spec.variant()}_"
                     f"{spec_digest(spec)[:12]}")
    cubin_path, ptx_path, meta_path = (stem.with_suffix(s) for s in (".cubin", ".ptx", ".json"))
    if not (cubin_path.exists() and meta_path.exists()):
        with tempfile.TemporaryDirectory() as dump_dir:
            compile_kernel_of(spec, dump_dir)
            cubin_file, ptx_file = dumped_binary(dump_dir)
            cubin = cubin_file.read_bytes()
            if ptx_file is not None:
                ptx_path.write_text(ptx_file.read_text())
        names = re.findall(rb"\.text\.([A-Za-z0-9_$]+)", cubin)
        cubin_path.write_bytes(cubin)
        meta_path.write_text(json.dumps({"kernel_name": names[0].decode() if names
                                         else "unknown"}))
    meta = json.loads(meta_path.read_text())
    return Artifacts(config, spec.arch, spec.dtype, head_dim, cubin_path,
                     ptx_path if ptx_path.exists() else None, meta["kernel_name"])
