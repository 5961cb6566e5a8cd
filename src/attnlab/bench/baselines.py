"""Peers measured in the same process on the same inputs as attnlab.

torch SDPA's backends are always there (flash = the official FlashAttention-2); the
``flash_attn`` package is added when it is importable. Every peer takes BSHD tensors and a scale.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

#: ``fn(q, k, v, scale, causal)``; the benchmarks use Sq == Sk, where torch's top-left causal
#: mask and FlashAttention's bottom-right one coincide.
PeerFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], torch.Tensor]

#: Name -> torch SDPBackend attribute.
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}


def sdpa(backend: str) -> PeerFn:
    """A BSHD attention function running torch SDPA with exactly one backend.

    Inputs are passed as BHSD views of the BSHD tensors (no copies), as FlashAttention-2 takes
    them internally.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdp_backend = getattr(SDPBackend, SDPA_BACKENDS[backend])

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            causal: bool = False) -> torch.Tensor:
        with sdpa_kernel(sdp_backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                is_causal=causal, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)

    return run


def flash_attn() -> PeerFn:
    """The ``flash_attn`` package's ``flash_attn_func`` (BSHD natively)."""
    from flash_attn import flash_attn_func

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            causal: bool = False) -> torch.Tensor:
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)

    return run


def available_peers() -> dict[str, PeerFn]:
    """Every peer this machine can run, the reference (``sdpa_flash``) first."""
    peers = {name: sdpa(name) for name in SDPA_BACKENDS}
    if importlib.util.find_spec("flash_attn") is not None:
        peers["flash_attn"] = flash_attn()
    return peers
