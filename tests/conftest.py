"""Shared test set-up: skip GPU tests without a GPU, seeded inputs, and a stand-in runtime."""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Sequence

import pytest
import torch

import attnlab
from attnlab import api, reference, validation

MakeQKV = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
    """Stand-in for attnlab.dispatch and attnlab.runtime; the launch writes reference results.

    ``launch_forward`` has the real one's signature, the varlen and window arguments keyword
    only, so a call that passes them positionally fails here as it would break there.
    """

    def __init__(self, default: attnlab.FlashConfig) -> None:
        self.default = default
        self.problems: list[validation.Problem] = []
        self.launches: list[dict[str, object]] = []

    def arch_of(self, device: torch.device) -> str:
        return "sm_86"

    def default_config(self, device: torch.device, problem: validation.Problem
                       ) -> attnlab.FlashConfig:
        self.problems.append(problem)
        return self.default

    def launch_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        softmax_scale: float,
        config: attnlab.FlashConfig,
        *,
        window: tuple[int, int] = (-1, -1),
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
    ) -> None:
        self.launches.append(
            dict(q=q, k=k, v=v, out=out, lse=lse, softmax_scale=softmax_scale, config=config,
                 window=window, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
        )
        options = dict(softmax_scale=softmax_scale, window_size=window, return_lse=True)
        if cu_seqlens_q is None:
            want_out, want_lse = reference.attention(q, k, v, **options)
        else:
            want_out, want_lse = reference.attention_varlen(
                q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options
            )
        out.copy_(want_out)
        lse.copy_(want_lse)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Replace dispatch and runtime by a Recorder; let CPU tensors stand in for CUDA ones."""
    rec = Recorder(default=attnlab.FlashConfig(block_m=128, block_n=32))
    dispatch = types.ModuleType("attnlab.dispatch")
    dispatch.arch_of = rec.arch_of
    dispatch.default_config = rec.default_config
    runtime = types.ModuleType("attnlab.runtime")
    runtime.launch_forward = rec.launch_forward
    for name, module in (("dispatch", dispatch), ("runtime", runtime)):
        monkeypatch.setitem(sys.modules, f"attnlab.{name}", module)
        monkeypatch.setattr(attnlab, name, module, raising=False)
    # Every input rule but the device one still applies.
    for name in ("check_inputs", "check_varlen_inputs"):
        check = functools.partial(getattr(validation, name), require_cuda=False)
        monkeypatch.setattr(api, name, check)
    return rec
