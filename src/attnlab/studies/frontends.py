"""The front-end comparison (seed 004's Observation KK, issue 24): the same kernels built by
the CuTe DSL (attnlab's front-end), by nvcc from CUDA C++ and by Triton, compared on what
they hand the GPU: SASS instruction count and groups (``analysis.sass``), registers and
spills, build time, and with a GPU the time per call.

The lab compared Rust -> PTX (cuda-oxide) with nvcc on a vector add and found 2x the SASS (three
bounds checks, an ``Option`` round trip, 64-bit indexing) at a 100x cold build. Here the
kernels are a vector add, the cymatic study's gather-sum, one ``mma.sync`` HGEMM tile and a
FlashAttention-2 forward tile (``studies/frontend_sources.py`` holds the CUDA and Triton
versions; the CuTe DSL ones are ``kernels/common/vector_add.py``, ``kernels/common/gather.py``,
the GEMM ladder kernel at the same knobs and the attention ladder's k02). Static counts need
no GPU for the CuTe DSL and nvcc builds; Triton builds its kernels when it launches them, so
its counts come from a GPU run.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attnlab.bench.cubin import FLOAT, INT, POINTER, CubinFunction
from attnlab.gemm_config import MmaGemmConfig
from attnlab.studies.frontend_sources import ATTENTION_TILE_SMEM, CUDA_SOURCES, triton_kernels

FRONTENDS = ("cute", "nvcc", "triton")
KERNELS = ("vector_add", "gather_sum", "hgemm_tile", "attention_tile")
#: The CuTe DSL HGEMM tile the CUDA and Triton ones mirror: 128 x 128 x 32 over 4 x 2 warps,
#: cp.async double buffering, +8 halves of padding a row, fp32 C.
HGEMM_CONFIG = MmaGemmConfig(block_m=128, block_n=128, block_k=32, warps_m=4, warps_n=2,
                             stages=2, swizzle="pad8")
#: The attention tile's CuTe DSL counterpart: the attention ladder's k02 (64 x 64 tiles, 4
#: warps, cp.async, XOR-swizzled shared memory) at head dim 64.
ATTENTION_CONFIG = "k02"
THREADS = 256
#: Problem sizes of the timed run: vectors of 64 M floats (768 MB moved by the add), a gather
#: of 16 M random indices into 64 M floats, a 4096^3 bf16 GEMM, attention over B = 4, 16
#: heads of 64, 4096 tokens.
VECTOR = 1 << 26
GATHERS = 1 << 24
GEMM = 4096
ATTENTION = (4, 4096, 16, 64)


@dataclass
class Build:
    """One kernel from one front-end: its cubin, how long the build took, and (once on a
    GPU) how to call it on ``inputs(kernel)``."""

    kernel: str
    frontend: str
    arch: str
    cubin: Path | None = None
    seconds: float | None = None
    error: str | None = None
    call: Callable[[tuple], object] | None = field(default=None, repr=False)


def static_row(build: Build) -> dict[str, object]:
    """The build's SASS counts (NOPs, the padding after the code, left out), groups,
    registers and spills."""
    from attnlab.analysis.resources import read_resources
    from attnlab.analysis.sass import disassemble, group_histogram, parse

    row: dict[str, object] = {"kernel": build.kernel, "frontend": build.frontend,
                              "arch": build.arch, "build_s": build.seconds,
                              "error": build.error}
    if build.cubin is None:
        return row
    text = disassemble(build.cubin)
    instructions = [i for i in parse(text) if i.opcode != "NOP"]
    resources = read_resources(build.cubin, text)
    row.update(instructions=len(instructions), groups=dict(group_histogram(instructions)),
               registers=resources.registers, spill_stores=resources.spill_stores)
    return row


def build_nvcc(kernel: str, arch: str, folder: Path) -> Build:
    """``nvcc -cubin -O3`` of the kernel's CUDA source for ``arch``."""
    from attnlab.analysis.tools import find_tool

    source, _ = CUDA_SOURCES[kernel]
    cu, cubin = folder / f"{kernel}.cu", folder / f"{kernel}_nvcc_{arch}.cubin"
    cu.write_text(source)
    try:
        nvcc = find_tool("nvcc")
    except RuntimeError as exc:
        return Build(kernel, "nvcc", arch, error=f"nvcc not found: {exc}")
    start = time.perf_counter()
    done = subprocess.run([str(nvcc), "-cubin", f"-arch={arch}", "-O3", "-o", str(cubin),
                           str(cu)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        return Build(kernel, "nvcc", arch, error=done.stderr.strip()[-300:])
    return Build(kernel, "nvcc", arch, cubin, seconds)


def build_cute(kernel: str, arch: str, folder: Path) -> Build:
    """The CuTe DSL kernel compiled for ``arch`` (its cubin dumped beside)."""
    from attnlab.jit import dumped_binary

    dump = folder / f"{kernel}_cute_{arch}"
    dump.mkdir(exist_ok=True)
    start = time.perf_counter()
    if kernel == "vector_add":
        from attnlab.kernels.common.vector_add import compile_vector_add

        fn = compile_vector_add(arch, dump)
    elif kernel == "gather_sum":
        from attnlab.kernels.common.gather import compile_gather

        fn = compile_gather(arch, dump)
    elif kernel == "hgemm_tile":
        from attnlab.jit import compile_spec
        from attnlab.kernels.gemm.abi import GemmSpec

        fn = compile_spec(GemmSpec(HGEMM_CONFIG, arch, "bfloat16", "float32", "k", "k"), dump)
    else:
        from attnlab.jit import compile_spec
        from attnlab.kernels.abi import ForwardSpec
        from attnlab.ladder import resolve

        fn = compile_spec(ForwardSpec(resolve(ATTENTION_CONFIG), arch, "bfloat16",
                                      ATTENTION[3], False), dump)
    seconds = time.perf_counter() - start
    return Build(kernel, "cute", arch, dumped_binary(dump)[0], seconds, call=_cute_call(kernel,
                                                                                       fn))


def _cute_call(kernel: str, fn) -> Callable[[tuple], object]:
    if kernel == "attention_tile":
        from attnlab import attention
        from attnlab.ladder import resolve

        config = resolve(ATTENTION_CONFIG)
        return lambda t: attention(t[0], t[1], t[2], softmax_scale=ATTENTION[3] ** -0.5,
                                   out=t[3], config=config)
    if kernel == "hgemm_tile":
        from attnlab.gemm.api import NO_EPILOGUE

        return lambda t: fn(t[0], t[1].t(), t[2], None, None, *NO_EPILOGUE, 1, (GEMM // 128) ** 2)
    return lambda t: fn(*t)


def inputs(kernel: str):
    """The timed run's tensors: ``(a, b, c)``, ``(data, index, out)`` or ``(A, B, C)``, and
    the bytes moved or FLOPs done per call."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    if kernel == "vector_add":
        a, b = (torch.randn(VECTOR, device="cuda", generator=gen) for _ in range(2))
        return (a, b, torch.empty_like(a)), 12.0 * VECTOR
    if kernel == "gather_sum":
        from attnlab import device

        data = torch.randn(4 * GATHERS, device="cuda", generator=gen)
        index = torch.randint(0, data.numel(), (GATHERS,), device="cuda", generator=gen,
                              dtype=torch.int32)
        threads = device.info(data.device).multiprocessors * 8 * THREADS
        return (data, index, torch.empty(threads, device="cuda")), 8.0 * GATHERS
    if kernel == "attention_tile":
        batch, tokens, heads, dim = ATTENTION
        q, k, v = (torch.randn(ATTENTION, device="cuda", generator=gen, dtype=torch.bfloat16)
                   for _ in range(3))
        return (q, k, v, torch.empty_like(q)), 4.0 * batch * heads * tokens ** 2 * dim
    a, b = (torch.randn(GEMM, GEMM, device="cuda", generator=gen, dtype=torch.bfloat16)
            for _ in range(2))
    return (a, b, torch.empty(GEMM, GEMM, device="cuda")), 2.0 * GEMM ** 3


def nvcc_call(build: Build) -> Callable[[tuple], object]:
    """Launch the nvcc cubin through the driver API on torch's current stream."""
    shared = ATTENTION_TILE_SMEM if build.kernel == "attention_tile" else 0
    kernel = CubinFunction(build.cubin.read_bytes(), CUDA_SOURCES[build.kernel][1], shared)
    return lambda t: kernel.launch(*cuda_launch(build.kernel, t))


def cuda_launch(kernel: str, t: tuple) -> tuple:
    """``CubinFunction.launch``'s arguments for a CUDA source kernel on ``inputs(kernel)``
    (the GEMM tiles: square ``t[0]`` and whole tiles)."""
    if kernel == "vector_add":
        return (((t[2].numel() + THREADS - 1) // THREADS, 1), THREADS,
                (t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), t[2].numel()),
                (POINTER, POINTER, POINTER, INT))
    if kernel == "gather_sum":
        return ((t[2].numel() // THREADS, 1), THREADS,
                (t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), t[1].numel()),
                (POINTER, POINTER, POINTER, INT))
    if kernel == "attention_tile":
        batch, tokens, heads, dim = t[0].shape
        return ((tokens // 64, batch * heads), 128,
                (*(x.data_ptr() for x in t), tokens, heads, dim ** -0.5 * math.log2(math.e)),
                (POINTER, POINTER, POINTER, POINTER, INT, INT, FLOAT))
    size = t[0].shape[0]
    return ((size // 128, size // 128), THREADS,
            (t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), size, size, size),
            (POINTER, POINTER, POINTER, INT, INT, INT))


def build_triton(kernel: str, arch: str, folder: Path, tensors: tuple) -> Build:
    """Triton's kernel, built by its first launch on ``tensors`` (it compiles for the GPU
    at hand); its cubin written to ``folder``."""
    try:
        fn = triton_kernels()[kernel]
    except ImportError as exc:
        return Build(kernel, "triton", arch, error=f"Triton is not installed: {exc}")

    def call(t: tuple):
        if kernel == "vector_add":
            return fn[((t[2].numel() + THREADS - 1) // THREADS,)](*t, t[2].numel(),
                                                                  BLOCK=THREADS)
        if kernel == "gather_sum":
            return fn[(t[2].numel() // THREADS,)](*t, t[1].numel(), t[2].numel(),
                                                  BLOCK=THREADS)
        if kernel == "attention_tile":
            batch, tokens, heads, dim = t[0].shape
            return fn[(tokens // 64, batch * heads)](
                *t, tokens, heads, dim ** -0.5 * math.log2(math.e), D=dim, BR=64, BC=64,
                num_warps=4)
        return fn[(GEMM // 128, GEMM // 128)](t[0], t[1], t[2], GEMM, GEMM, GEMM, BM=128,
                                              BN=128, BK=32, num_warps=8, num_stages=2)

    start = time.perf_counter()
    compiled = call(tensors)
    import torch

    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    cubin = folder / f"{kernel}_triton_{arch}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    return Build(kernel, "triton", arch, cubin, seconds, call=call)


def run(arch: str, on_gpu: bool, runs: int = 20, on_step: Callable[[], None] | None = None
        ) -> list[dict[str, object]]:
    """Every kernel from every front-end that can build here: static rows, and with
    ``on_gpu`` each kernel's front-ends timed round-robin (device time, median) with their
    outputs checked against the CuTe DSL's."""
    import os

    # Cold builds: the CuTe DSL's own file cache off (read when the DSL is first imported,
    # so a process that imported it before keeps its setting; the CLI does not).
    os.environ.setdefault("CUTE_DSL_DISABLE_FILE_CACHING", "1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kernel in KERNELS:
            builds = [build_cute(kernel, arch, folder), build_nvcc(kernel, arch, folder)]
            tensors, work = inputs(kernel) if on_gpu else (None, None)
            if on_gpu:
                builds.append(build_triton(kernel, arch, folder, tensors))
                builds[1].call = nvcc_call(builds[1]) if builds[1].cubin else None
            kernel_rows = [static_row(b) for b in builds]
            if on_gpu:
                _time(builds, kernel_rows, tensors, work, runs)
            rows += kernel_rows
            if on_step is not None:
                on_step()
    return rows


def _time(builds: list[Build], rows: list[dict[str, object]], tensors: tuple, work: float,
          runs: int) -> None:
    """Median device ms per call and its rate (GB/s or TFLOP/s), and the output's largest
    difference from the CuTe DSL build's."""
    import torch

    from attnlab.bench.timing import sample_interleaved, summarize

    callable_builds = {b.frontend: b for b in builds if b.call is not None}
    outputs = {}
    out = tensors[-1]
    for name, build in callable_builds.items():
        out.fill_(float("nan"))
        build.call(tensors)
        torch.cuda.synchronize()
        outputs[name] = out.clone()
    samples = sample_interleaved({name: (lambda i, b=b: b.call(tensors))
                                  for name, b in callable_builds.items()}, runs=runs)
    reference = outputs.get("cute")
    for row in rows:
        name = row["frontend"]
        if name not in samples:
            continue
        ms = summarize(samples[name]).median_ms
        row["ms"] = ms
        flops = row["kernel"] in ("hgemm_tile", "attention_tile")
        row["rate"] = work / (ms * 1e-3) / (1e12 if flops else 1e9)
        if reference is not None:
            diff = (outputs[name].float() - reference.float()).abs()
            row["max_abs_diff"] = float(diff.max()) if torch.isfinite(diff).all() else None


def plot(rows: list[dict[str, object]], path: Path) -> Path:
    """A PNG: per kernel, each front-end's SASS instructions stacked by group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    built = [r for r in rows if r.get("instructions")]
    kernels = list(dict.fromkeys(r["kernel"] for r in built))
    groups = sorted({g for r in built for g in r["groups"]})
    fig, axes = plt.subplots(1, len(kernels), figsize=(5 * len(kernels), 4), squeeze=False)
    for ax, kernel in zip(axes[0], kernels, strict=True):
        mine = [r for r in built if r["kernel"] == kernel]
        bottom = [0] * len(mine)
        for group in groups:
            values = [r["groups"].get(group, 0) for r in mine]
            ax.bar([r["frontend"] for r in mine], values, bottom=bottom, label=group)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_title(kernel)
        ax.set_ylabel("SASS instructions")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
