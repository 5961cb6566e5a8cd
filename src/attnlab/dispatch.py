"""Which kernel configuration serves a problem on a GPU.

The tuning cache's entry for (GPU, capability, dtype, head dim, causal, seqlen bucket) when
``attnlab tune`` wrote one; otherwise the built-in default of the GPU's architecture family
(``attnlab.ladder.default_for``: the wgmma kernel on sm_90a, else kernel 7 plus later
clean-ups).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.config import FlashConfig
from attnlab.ladder import default_for
from attnlab.validation import UNBOUNDED

if TYPE_CHECKING:
    import torch

    from attnlab.tune.cache import TuneCache, TuneKey
    from attnlab.validation import Problem

_ARCH_BY_CAPABILITY = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 7): "sm_86", (8, 9): "sm_89",
                       (9, 0): "sm_90a"}

_cache: TuneCache | None = None


def arch_of(device: torch.device) -> str:
    """The compilation target of a CUDA device (``sm_80``, ``sm_86``, ``sm_89``, ``sm_90a``)."""
    import torch

    capability = torch.cuda.get_device_capability(device)
    arch = _ARCH_BY_CAPABILITY.get(capability)
    if arch is None:
        if capability < (8, 0):
            raise ValueError(
                f"attnlab needs an sm80 (Ampere) or newer GPU; {torch.cuda.get_device_name(device)}"
                f" is sm_{capability[0]}{capability[1]}"
            )
        # Newer GPUs run the sm80 path's PTX through the driver (no Hopper/Blackwell features).
        arch = "sm_80"
    return arch


def tune_key(device: torch.device, dtype: str, head_dim: int, seqlen_q: int,
             causal: bool = False) -> TuneKey:
    """The tuning-cache key of a problem on a device."""
    import torch

    from attnlab.tune.cache import TuneKey, seqlen_bucket

    major, minor = torch.cuda.get_device_capability(device)
    return TuneKey(torch.cuda.get_device_name(device), f"{major}{minor}", dtype, head_dim,
                   causal, seqlen_bucket(seqlen_q))


def tune_cache() -> TuneCache:
    """The tuning cache, read once per process (``attnlab tune`` refreshes it via ``reload``)."""
    global _cache
    if _cache is None:
        from attnlab.tune.cache import TuneCache

        _cache = TuneCache()
    return _cache


def reload_tune_cache() -> None:
    global _cache
    _cache = None


def default_config(device: torch.device, problem: Problem) -> FlashConfig:
    """The configuration ``attention()`` uses when the caller gives none."""
    dtype = str(problem.dtype).removeprefix("torch.")
    # A masked call runs the windowed kernel: an entry tuned on plain attention does not
    # speak for it (their best knobs differ, docs/ladder.md).
    windowed = tuple(problem.window) != UNBOUNDED
    tuned = tune_cache().get(tune_key(device, dtype, problem.head_dim, problem.seqlen_q,
                                      causal=windowed))
    # Packed sequences cannot take TMA tiles (FlashConfig.tma_kv_loads): an entry tuned with
    # them gives way to the varlen default.
    if tuned is not None and not (problem.varlen and tuned.tma_kv_loads):
        return tuned
    return default_for(arch_of(device), problem.head_dim, windowed, dtype, problem.varlen)
