"""Shared test set-up: skip GPU tests without a GPU, and make seeded q/k/v."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

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
    dtype: torch.dtype = torch.float16,
    device: str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q ``[B, Sq, H, D]``, k and v ``[B, Sk, H, D]`` from one seed."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=gen)
    k = torch.randn(batch, seqlen_k, heads, head_dim, generator=gen)
    v = torch.randn(batch, seqlen_k, heads, head_dim, generator=gen)
    return tuple(t.to(dtype=dtype, device=device) for t in (q, k, v))  # type: ignore[return-value]


@pytest.fixture(scope="session")
def make_qkv() -> MakeQKV:
    """Factory of seeded q/k/v. Session-scoped so hypothesis tests may use it too."""
    return _make_qkv
