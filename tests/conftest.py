"""Shared test set-up: skip GPU tests without a GPU, seeded inputs, and a stand-in runtime."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import api, device, dispatch, kernel_cache, reference, validation
from attnlab.device import DeviceInfo
from attnlab.kernel_cache import CompiledKernel
from attnlab.kernels.abi import UNBOUNDED_SIDE, BackwardSpec, ForwardSpec, PreprocessSpec

MakeQKV = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        if os.environ.get("PYTEST_XDIST_WORKER"):
            # Beside other workers on one GPU, a 10+ GiB test can run it out of memory.
            apart = pytest.mark.skip(reason="large_memory: run alone (pytest -m large_memory)")
            for item in items:
                if "large_memory" in item.keywords:
                    item.add_marker(apart)
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


#: How many ``medium_memory`` tests run at once among pytest-xdist's workers (one lock file
#: a slot): two of the largest (7.6 GiB peak on an H100) beside ten others (2.6 GiB at most)
#: and twelve CUDA contexts fit an 80 GB GPU with room to spare.
MEDIUM_MEMORY_SLOTS = 2


@contextlib.contextmanager
def _medium_memory_slot(folder: Path | None = None) -> Iterator[None]:
    """Hold one of ``MEDIUM_MEMORY_SLOTS`` machine-wide slots (exclusive locks on files in
    ``folder``, by default the temporary directory) while the test runs."""
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    files = [open(folder / f"attnlab-tests-memory-{slot}.lock", "w")
             for slot in range(MEDIUM_MEMORY_SLOTS)]
    try:
        while True:
            for f in files:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                yield
                return
            time.sleep(0.05)
    finally:
        for f in files:
            f.close()  # closing a file releases its lock


@pytest.fixture(autouse=True)
def _gpu_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """pytest-xdist's workers share one GPU. A ``medium_memory`` test waits for a slot
    (``MEDIUM_MEMORY_SLOTS``), and after each GPU test its cached memory goes back to the
    driver: a worker that kept the blocks of its largest test (10-15 GiB seen) ran another
    worker's next big test out of memory. With ``ATTNLAB_TEST_MEMORY_LOG`` set, each GPU
    test's peak (GiB reserved) is appended there."""
    if not ("gpu" in request.keywords and torch.cuda.is_available()):
        yield
        return
    apart = "medium_memory" in request.keywords and os.environ.get("PYTEST_XDIST_WORKER")
    with _medium_memory_slot() if apart else contextlib.nullcontext():
        torch.cuda.reset_peak_memory_stats()
        yield
        log = os.environ.get("ATTNLAB_TEST_MEMORY_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{torch.cuda.max_memory_reserved() / 2**30:.2f} {request.node.nodeid}\n")
        torch.cuda.empty_cache()


def _make_qkv(
    batch: int = 2,
    seqlen_q: int = 16,
    seqlen_k: int = 16,
    heads: int = 2,
    head_dim: int = 64,
    *,
    heads_kv: int | None = None,
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q ``[B, Sq, H, D]``, k and v ``[B, Sk, Hkv, D]`` from one seed.

    ``heads_kv`` defaults to ``heads``.
    """
    heads_kv = heads if heads_kv is None else heads_kv
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, generator=gen)
    return tuple(t.to(dtype=dtype, device=device) for t in (q, k, v))  # type: ignore[return-value]


@pytest.fixture(scope="session")
def make_qkv() -> MakeQKV:
    """Factory of seeded q/k/v. Session-scoped so hypothesis tests may use it too."""
    return _make_qkv


def _make_varlen(
    seqlens_q: Sequence[int],
    seqlens_k: Sequence[int],
    heads: int = 2,
    head_dim: int = 64,
    *,
    heads_kv: int | None = None,
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Packed ``(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)``.

    q is ``[sum(seqlens_q), H, D]``, k and v ``[sum(seqlens_k), Hkv, D]``; the max lengths are
    exact (0 for an empty batch).
    """
    heads_kv = heads if heads_kv is None else heads_kv
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(seqlens_q), heads, head_dim, generator=gen)
    k = torch.randn(sum(seqlens_k), heads_kv, head_dim, generator=gen)
    v = torch.randn(sum(seqlens_k), heads_kv, head_dim, generator=gen)
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))

    def offsets(seqlens: Sequence[int]) -> torch.Tensor:
        cumulative = torch.tensor([0, *seqlens], dtype=torch.int64).cumsum(0)
        return cumulative.to(dtype=torch.int32, device=device)

    return (q, k, v, offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q, default=0),
            max(seqlens_k, default=0))


@pytest.fixture(scope="session")
def make_varlen() -> Callable[..., tuple]:
    """Factory of seeded packed varlen inputs (see ``_make_varlen``)."""
    return _make_varlen


# --------------------------------------------------------------------------------------------
class Recorder:
    """Stand-in for the GPU under ``attnlab.runtime``: the device, the config choice and the
    kernel cache. Its "kernel" takes the launch ABI's arguments (``kernels.abi.ForwardArgs``),
    records them and writes the reference's results, so everything above the compiled
    function (validation, memoised calls, specs, argument encoding) runs for real on CPU.
    """

    gpu = DeviceInfo(0, "stand-in GPU", (8, 6), "sm_86", 48, 4 << 20)

    def __init__(self, default: attnlab.FlashConfig) -> None:
        self.default = default
        self.problems: list[validation.Problem] = []
        self.launches: list[dict[str, object]] = []
        self.specs: list[ForwardSpec] = []

    def device_info(self, device: object = None) -> DeviceInfo:
        return self.gpu

    def config_for(self, gpu: DeviceInfo, problem: validation.Problem) -> attnlab.FlashConfig:
        self.problems.append(problem)
        return self.default

    def kernel(self, spec: ForwardSpec | BackwardSpec | PreprocessSpec) -> CompiledKernel:
        self.specs.append(spec)
        launch = {BackwardSpec: _backward_kernel, PreprocessSpec: _preprocess_kernel}.get(
            type(spec), self._launch)
        return CompiledKernel(functools.partial(launch, spec), spec, 128, None)

    def _launch(self, spec: ForwardSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, lse: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                cu_seqlens_k: torch.Tensor | None, softmax_scale: float, left: int,
                right: int, max_seqlen_q: int, num_ctas: int | None,
                tile_counter: torch.Tensor | None, scratch: torch.Tensor | None) -> None:
        # The ABI's window back in flash_attn's convention (-1: unbounded).
        window = tuple(-1 if side == UNBOUNDED_SIDE else side for side in (left, right))
        self.launches.append(
            dict(q=q, k=k, v=v, out=out, lse=lse, softmax_scale=softmax_scale,
                 config=spec.config, window=window, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, spec=spec)
        )
        options = dict(softmax_scale=softmax_scale, window_size=window, return_lse=True)
        if cu_seqlens_q is None:
            want_out, want_lse = reference.attention(q, k, v, **options)
        else:
            want_out, want_lse = reference.attention_varlen(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, k.shape[0], **options
            )
        out.copy_(want_out)
        if lse is not None:
            lse.copy_(want_lse)


def _preprocess_kernel(spec: PreprocessSpec, out, dout, lse, dlse, dpsum, lse_log2,
                       dq_accum) -> None:
    """The preprocess kernel's contract in torch: D and L in log2 per row, padded."""
    rows = out.shape[-3]
    d = (dout.double() * out.double()).sum(-1).transpose(-1, -2)
    if dlse is not None:
        d = d - dlse
    dpsum.zero_()
    dpsum[..., :rows] = d
    lse_log2.zero_()
    lse_log2[..., :rows] = torch.where(lse == -torch.inf, torch.inf, lse * 1.4426950408889634)
    dq_accum.zero_()


def _backward_kernel(spec: BackwardSpec, q, k, v, dout, lse_log2, dpsum, dq_accum, dk, dv,
                     cu_q, cu_k, scale, left, right, max_seqlen_k, semaphores) -> None:
    """The backward kernel's contract in torch (fp64): P from L in log2, dS from D, per
    sequence and head, GQA summed; dq_accum added to, dk and dv written."""
    window = tuple(-1 if side == UNBOUNDED_SIDE else side for side in (left, right))
    if cu_q is None:
        seqs = [(q[b], k[b], v[b], dout[b], lse_log2[b], dpsum[b], dq_accum[b], dk[b], dv[b])
                for b in range(q.shape[0])]
    else:
        seqs = []
        for i in range(len(cu_q) - 1):
            sq, sk = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
            seqs.append((q[sq], k[sk], v[sk], dout[sq], lse_log2[:, sq], dpsum[:, sq],
                         dq_accum[sq], dk[sk], dv[sk]))
    group = q.shape[-2] // k.shape[-2]
    for sq_, sk_, sv_, sdo, sl, sd, sdq, sdk, sdv in seqs:
        seqlen_q, seqlen_k = sq_.shape[0], sk_.shape[0]
        mask = reference.window_mask(seqlen_q, seqlen_k, window)
        grad_k = torch.zeros(sk_.shape, dtype=torch.float64)
        grad_v = torch.zeros(sv_.shape, dtype=torch.float64)
        for h in range(q.shape[-2]):
            kv = h // group
            qh, kh, vh, doh = (t.double() for t in (sq_[:, h], sk_[:, kv], sv_[:, kv],
                                                    sdo[:, h]))
            s_ = qh @ kh.T * scale * 1.4426950408889634 - sl[h, :seqlen_q].double()[:, None]
            p = torch.exp2(s_)
            if mask is not None:
                p = p.masked_fill(~mask, 0.0)
            ds = p * (doh @ vh.T - sd[h, :seqlen_q].double()[:, None])
            grad_v[:, kv] += p.T @ doh
            grad_k[:, kv] += scale * ds.T @ qh
            sdq[:, h] += (scale * ds @ kh).float()
        sdk.copy_(grad_k)
        sdv.copy_(grad_v)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """Replace the device, the config choice and the kernel cache by a Recorder; let CPU
    tensors stand in for CUDA ones."""
    rec = Recorder(default=attnlab.FlashConfig(block_m=128, block_n=32))
    monkeypatch.setattr(device, "info", rec.device_info)
    monkeypatch.setattr(dispatch, "config_for", rec.config_for)
    monkeypatch.setattr(kernel_cache, "get", rec.kernel)
    # Every input rule but the device one still applies.
    for name in ("check_inputs", "check_varlen_inputs"):
        check = functools.partial(getattr(validation, name), require_cuda=False)
        monkeypatch.setattr(api, name, check)
    api.forget_calls()
    yield rec
    api.forget_calls()


@pytest.fixture
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's output 220 columns wide, so the asserts see whole cells. rich fixes a
    console's width when it is made if ``COLUMNS`` is set then (the CLI's consoles, at
    import), else reads ``COLUMNS`` at each print (typer's help): both are set."""
    from attnlab.cli import measure, profile, study

    monkeypatch.setenv("COLUMNS", "220")
    for module in (measure, profile, study):
        monkeypatch.setattr(module.console, "_width", 220)
