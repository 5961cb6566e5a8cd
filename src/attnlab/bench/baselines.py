"""Peers measured in the same process on the same inputs as attnlab.

torch SDPA's backends are always there (flash = the official FlashAttention-2, cudnn = cuDNN's
fused attention); FA4 (``flash_attn.cute`` from the ``flash-attn-4`` package, the CuTe DSL
FlashAttention) and the FlashAttention-2 package (``flash_attn``) are added when importable.
Every peer takes BSHD tensors and a scale, and allocates its output as a user's call does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch

from attnlab.bench.runner import Mask

#: ``fn(q, k, v, scale, mask)``, ``mask`` causal (True) or not, or a sliding window (left,
#: right); the benchmarks use Sq == Sk, where torch's top-left causal mask and
#: FlashAttention's bottom-right one coincide.
PeerFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, Mask], torch.Tensor]

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
            mask: Mask = False) -> torch.Tensor:
        if isinstance(mask, tuple):
            raise NotImplementedError("torch SDPA takes no sliding window but as a dense mask, "
                                      "which its flash and cuDNN backends refuse")
        with sdpa_kernel(sdp_backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                is_causal=mask, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)

    return run


def flash_attn() -> PeerFn:
    """The FlashAttention-2 package's ``flash_attn_func`` (BSHD natively)."""
    from flash_attn import flash_attn_func

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            mask: Mask = False) -> torch.Tensor:
        if isinstance(mask, tuple):
            return flash_attn_func(q, k, v, softmax_scale=scale, window_size=mask)
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=mask)

    return run


def fa4() -> PeerFn:
    """FA4: ``flash_attn.cute.flash_attn_func`` (BSHD natively; returns ``(out, lse)``)."""
    from flash_attn.cute import flash_attn_func

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            mask: Mask = False) -> torch.Tensor:
        if isinstance(mask, tuple):
            # FA4 spells an unbounded side None.
            window = tuple(None if side < 0 else side for side in mask)
            return flash_attn_func(q, k, v, softmax_scale=scale, window_size=window)[0]
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=mask)[0]

    return run


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package that is missing or fails to import
        return False


#: Peers beyond torch: name -> (module that must import, factory).
OPTIONAL_PEERS: dict[str, tuple[str, Callable[[], PeerFn]]] = {
    "fa4": ("flash_attn.cute", fa4),
    # flash-attn-4 also installs a ``flash_attn`` package (for ``flash_attn.cute``): the
    # FlashAttention-2 package is the one with ``flash_attn_interface``.
    "flash_attn": ("flash_attn.flash_attn_interface", flash_attn),
}


def available_peers() -> dict[str, PeerFn]:
    """Every peer this machine can run, the reference (``sdpa_flash``) first."""
    peers = {name: sdpa(name) for name in SDPA_BACKENDS}
    for name, (module, factory) in OPTIONAL_PEERS.items():
        if _importable(module):
            try:
                peers[name] = factory()
            except Exception:  # importable but broken (e.g. a mismatched CuTe DSL): skip it
                continue
    return peers
