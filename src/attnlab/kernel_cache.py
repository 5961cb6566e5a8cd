"""Compiled kernels, kept in memory for the process and on disk across processes.

A kernel is compiled once per spec (:class:`~attnlab.kernels.abi.ForwardSpec` or
:class:`~attnlab.kernels.abi.BackwardSpec`: everything that changes its binary). The first
process to need it compiles it (seconds to a minute, logged once on the ``attnlab`` logger)
and exports it with the CuTe DSL's ahead-of-time export: an object file, linked into a shared
library when a C compiler is at hand. Later processes load that library through TVM-FFI in
milliseconds, without importing the CuTe DSL at all.

Layout: ``<root>/<fingerprint>/<digest>.{so,o,json}``. The root is ``$ATTNLAB_CACHE_DIR`` or
the per-user cache directory (platformdirs); the fingerprint covers the kernel sources, the
DSL and TVM-FFI releases and the Python version, so a change to any of them starts a fresh
folder; the digest covers the spec. ``ATTNLAB_DISK_CACHE=0`` keeps everything in memory.

Several processes may fill the cache at once (pytest-xdist workers, one process per GPU): an
entry is compiled under an exclusive file lock, so one process compiles while the others wait
for its result, and published by renaming complete files into place, the JSON last, so a
reader never sees half an entry. An entry that fails to load is a miss: it is compiled again
and replaced.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.kernels.abi import (
    BackwardSpec,
    CombineSpec,
    DecodeSpec,
    ForwardSpec,
    PreprocessSpec,
    spec_from_dict,
)
from attnlab.kernels.conv.abi import DirectConvSpec, GroupNormSiluSpec
from attnlab.kernels.gemm.abi import GemmSpec, ReduceSpec

#: Any kind of kernel spec.
Spec = (ForwardSpec | BackwardSpec | PreprocessSpec | DecodeSpec | CombineSpec | GemmSpec
        | ReduceSpec | GroupNormSiluSpec | DirectConvSpec)

logger = logging.getLogger("attnlab")

CACHE_DIR_ENV = "ATTNLAB_CACHE_DIR"
DISK_CACHE_ENV = "ATTNLAB_DISK_CACHE"
#: The name the exported function carries in its object file.
EXPORTED_FUNCTION = "attnlab_kernel"
#: Longest wait for another process's compilation of the same entry (seconds).
LOCK_TIMEOUT_S = 900.0
_PACKAGE = Path(__file__).resolve().parent
#: Sources that shape a binary: the kernels, the config's derived sizes, the compile options.
_FINGERPRINT_SOURCES = ("kernels", "config.py", "backward_config.py", "gemm_config.py", "jit.py")


@dataclass(frozen=True)
class CompiledKernel:
    """A launchable kernel: the TVM-FFI function and what is known of its binary.

    ``registers`` (per thread, from the cubin; None when it could not be read) sizes the grid
    of persistent kernels. ``compile_seconds`` is None for a kernel loaded from disk.
    """

    fn: Callable[..., Any]
    spec: Spec
    registers: int | None
    compile_seconds: float | None


@functools.cache
def dsl_version() -> str:
    """The installed CuTe DSL release."""
    from importlib.metadata import version

    return version("nvidia-cutlass-dsl")


@functools.cache
def fingerprint() -> str:
    """Hash of everything outside the spec that changes a binary or its loading."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    digest.update(f"py{sys.version_info[0]}.{sys.version_info[1]}|dsl={dsl_version()}|"
                  f"tvm_ffi={version('apache-tvm-ffi')}".encode())
    for name in _FINGERPRINT_SOURCES:
        path = _PACKAGE / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.relative_to(_PACKAGE).as_posix().encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def spec_digest(spec: Spec) -> str:
    """Hash of a spec (with the DSL release): the name of its cache entries."""
    payload = json.dumps([spec.to_dict(), dsl_version()], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def cache_root() -> Path:
    """Where compiled kernels are kept: ``$ATTNLAB_CACHE_DIR`` or the user cache dir."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnlab")) / "kernels"


def disk_cache_enabled() -> bool:
    return os.environ.get(DISK_CACHE_ENV, "1") != "0"


def cache_dir() -> Path:
    """This installation's folder of the cache (one per fingerprint)."""
    return cache_root() / fingerprint()


_memory: dict[Spec, CompiledKernel] = {}
#: Patched copies loaded by this process, by file (``load_patched``).
_patched: dict[Path, CompiledKernel] = {}
_compiling = threading.Lock()


def get(spec: Spec) -> CompiledKernel:
    """The compiled kernel of ``spec``: from memory, from disk, or compiled now.

    Raises:
        attnlab.ConfigError: the config cannot serve the spec's head dim on its target.
    """
    kernel = _memory.get(spec)
    if kernel is None:
        with _compiling:  # the DSL's compiler is not re-entrant
            kernel = _memory.get(spec)
            if kernel is None:
                kernel = _load_or_compile(spec) if disk_cache_enabled() else _compile(spec)
                _memory[spec] = kernel
    return kernel


def load_patched(spec: Spec, patch: Callable[[bytes], bytes], folder: Path) -> CompiledKernel:
    """``spec``'s kernel with its binary rewritten by ``patch`` (same length: e.g. control-code
    edits, ``analysis.cubin_patch``), loaded from a copy in ``folder``; the cache's own
    entry is left as it was. Needs the disk cache (what is patched is its exported file).

    Raises:
        RuntimeError: the disk cache is off, or the kernel was not exported to it.
    """
    if not disk_cache_enabled():
        raise RuntimeError(f"patching needs the disk cache ({DISK_CACHE_ENV}=0 turns it off)")
    original = get(spec)
    digest = spec_digest(spec)
    meta_path = cache_dir() / f"{digest}.json"
    if not meta_path.exists():
        # Compiled in this process before the cache folder it is patched from was set.
        original = _load_or_compile(spec)
    if not meta_path.exists():
        raise RuntimeError(f"{describe(spec)} could not be exported to the disk cache "
                           f"{cache_dir()}")
    linked = json.loads(meta_path.read_text()).get("linked", False)
    suffix = ".so" if linked else ".o"
    binary = (cache_dir() / digest).with_suffix(suffix).read_bytes()
    patched = patch(binary)
    if len(patched) != len(binary):
        raise ValueError("a patch must keep the binary's length")
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{digest}_patched_{hashlib.sha256(patched).hexdigest()[:12]}"
    kernel = _patched.get(stem)
    if kernel is None:
        # Written once: rewriting a library this process has mapped truncates it under the
        # loaded code (two edits that leave the same bytes share a file).
        stem.with_suffix(suffix).write_bytes(patched)
        kernel = _patched[stem] = CompiledKernel(_load_function(stem, linked), spec,
                                                 original.registers, None)
    return kernel


def clear_memory() -> None:
    """Forget the kernels of this process (the disk cache stays)."""
    _memory.clear()


def _load_or_compile(spec: Spec) -> CompiledKernel:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    digest = spec_digest(spec)
    kernel = _load(folder, digest, spec)
    if kernel is not None:
        return kernel
    with _file_lock(folder / f"{digest}.lock") as locked:
        # Another process may have published it while this one waited for the lock.
        kernel = _load(folder, digest, spec) if locked else None
        if kernel is None:
            kernel = _compile(spec, folder / digest if locked else None)
    return kernel


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """An exclusive advisory lock on ``path``; yields False if it could not be had in
    ``LOCK_TIMEOUT_S`` (the caller then compiles without publishing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    logger.warning("gave up waiting for %s; compiling unshared", path)
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _compile(spec: Spec, publish_as: Path | None = None) -> CompiledKernel:
    """Compile ``spec``; with ``publish_as`` (a path stem), export it there."""
    from attnlab.jit import compile_spec, dumped_binary

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as dump_dir:
        fn = compile_spec(spec, dump_dir)
        seconds = time.perf_counter() - start
        registers = _registers(dumped_binary(dump_dir)[0])
    logger.info("compiled %s in %.1f s", describe(spec), seconds)
    kernel = CompiledKernel(fn, spec, registers, seconds)
    if publish_as is not None:
        _publish(kernel, publish_as)
    return kernel


def _registers(cubin: Path) -> int | None:
    """Registers per thread of the cubin's kernel (cuobjdump), or None without the tool."""
    from attnlab.analysis.resources import parse_resource_usage
    from attnlab.analysis.tools import ToolNotFound, find_tool

    try:
        out = subprocess.run([str(find_tool("cuobjdump")), "--dump-resource-usage", str(cubin)],
                             capture_output=True, text=True, check=True).stdout
        return parse_resource_usage(out).registers
    except (ToolNotFound, subprocess.CalledProcessError, ValueError):
        return None


def describe(spec: Spec) -> str:
    """One line naming a spec (for logs and tables)."""
    problem = f" hd{spec.head_dim}" if hasattr(spec, "head_dim") else ""
    return f"{spec.label} {spec.arch} {spec.dtype}{problem}{spec.variant()}"


def _publish(kernel: CompiledKernel, stem: Path) -> None:
    """Export to ``stem.o`` (and ``stem.so`` when a linker is found), then ``stem.json``."""
    staging = stem.with_name(f".{stem.name}.{os.getpid()}")
    obj, lib = staging.with_suffix(".o"), staging.with_suffix(".so")
    try:
        kernel.fn.export_to_c(str(obj), function_name=EXPORTED_FUNCTION)
        linked = _link(obj, lib)
        os.replace(obj, stem.with_suffix(".o"))
        if linked:
            os.replace(lib, stem.with_suffix(".so"))
        meta = {"spec": kernel.spec.to_dict(), "registers": kernel.registers,
                "compile_seconds": round(kernel.compile_seconds or 0.0, 2),
                "dsl": dsl_version(), "linked": linked, "created": time.time()}
        meta_staging = staging.with_suffix(".json")
        meta_staging.write_text(json.dumps(meta))
        os.replace(meta_staging, stem.with_suffix(".json"))
    except Exception as exc:  # a cache that cannot be written costs speed, not correctness
        logger.warning("could not export %s to the disk cache: %s",
                       describe(kernel.spec), exc)
    finally:
        for leftover in staging.parent.glob(staging.name + ".*"):
            leftover.unlink(missing_ok=True)


def _link(obj: Path, lib: Path) -> bool:
    """Link an exported object into a shared library that TVM-FFI loads directly."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return False
    import cutlass.cute as cute
    import tvm_ffi

    folders = {str(Path(p).parent) for p in cute.runtime.find_runtime_libraries(
        enable_tvm_ffi=False)}
    folders.add(str(Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent))
    flags = [f for folder in sorted(folders) for f in (f"-L{folder}", f"-Wl,-rpath,{folder}")]
    result = subprocess.run([compiler, "-shared", "-o", str(lib), str(obj), *flags,
                             "-lcute_dsl_runtime", "-ltvm_ffi"], capture_output=True, text=True)
    if result.returncode != 0:
        logger.info("linking %s failed (%s); the object file is kept", obj,
                    result.stderr.strip()[:200])
    return result.returncode == 0


def _load(folder: Path, digest: str, spec: Spec) -> CompiledKernel | None:
    meta_path = folder / f"{digest}.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        fn = _load_function(folder / digest, meta.get("linked", False))
    except Exception as exc:  # a damaged entry is a miss: compiled again and replaced
        logger.warning("disk cache entry %s did not load (%s); recompiling",
                       meta_path.name, exc)
        return None
    return CompiledKernel(fn, spec, meta.get("registers"), None)


def _load_function(stem: Path, linked: bool) -> Callable[..., Any]:
    if linked:
        import tvm_ffi

        return getattr(tvm_ffi.load_module(str(stem.with_suffix(".so"))), EXPORTED_FUNCTION)
    # No linker when it was exported: the DSL links the object itself (imports the DSL).
    import ctypes

    import cutlass.cute as cute

    for library in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True):
        # Global symbols: the object resolves the runtime's entry points against them.
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    module = cute.runtime.load_module(str(stem.with_suffix(".o")), enable_tvm_ffi=True)
    return getattr(module, EXPORTED_FUNCTION)


# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One kernel on disk (``attnlab cache --show``)."""

    digest: str
    spec: Spec | None
    registers: int | None
    compile_seconds: float
    bytes: int
    current: bool  # in this installation's fingerprint folder

    def to_dict(self) -> dict[str, object]:
        return {"digest": self.digest[:12], "kernel": describe(self.spec) if self.spec else "?",
                "registers": self.registers, "compile_seconds": self.compile_seconds,
                "bytes": self.bytes, "current": self.current}


def entries() -> list[Entry]:
    """Every kernel in the cache root, this installation's first."""
    root, mine = cache_root(), cache_dir()
    found = []
    for meta_path in sorted(root.glob("*/*.json")):
        try:
            meta = json.loads(meta_path.read_text())
            spec = spec_from_dict(meta["spec"])
        except Exception:  # an entry of another attnlab version may not parse here
            meta, spec = {}, None
        size = sum(p.stat().st_size for p in meta_path.parent.glob(meta_path.stem + ".*"))
        found.append(Entry(meta_path.stem, spec, meta.get("registers"),
                           meta.get("compile_seconds", 0.0), size,
                           meta_path.parent == mine))
    return sorted(found, key=lambda e: not e.current)


def clear() -> int:
    """Delete the whole disk cache (every fingerprint folder) and this process's memory of
    it; returns the number of entries removed."""
    root = cache_root()
    count = len(list(root.glob("*/*.json"))) if root.exists() else 0
    for folder in root.glob("*") if root.exists() else []:
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    clear_memory()
    return count


def warm(specs: list[Spec], jobs: int = 1,
         on_done: Callable[[Spec, float | None], None] | None = None) -> None:
    """Compile ``specs`` into the disk cache, ``jobs`` processes at a time (the cache's file
    locks keep them from compiling one spec twice). ``on_done(spec, seconds)`` follows each
    one (seconds None when it was already cached)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if jobs <= 1:
        for spec in specs:
            if on_done is not None:
                on_done(spec, get(spec).compile_seconds)
            else:
                get(spec)
        return
    # spawn: the parent may hold a CUDA context and DSL state that must not be forked.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(_compile_seconds, spec): spec for spec in specs}
        for future in as_completed(futures):
            seconds = future.result()
            if on_done is not None:
                on_done(futures[future], seconds)


def _compile_seconds(spec: Spec) -> float | None:
    return get(spec).compile_seconds
