"""Peers measured in the same process on the same inputs: torch SDPA's backends."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: Name -> torch SDPBackend attribute.
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}


def sdpa(backend: str) -> Callable[..., torch.Tensor]:
    """A BSHD attention function running torch SDPA with exactly one backend.

    Inputs are passed as BHSD views of the BSHD tensors (no copies), as FlashAttention-2 takes
    them internally.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdp_backend = getattr(SDPBackend, SDPA_BACKENDS[backend])

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        with sdpa_kernel(sdp_backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
        return out.transpose(1, 2)

    return run
