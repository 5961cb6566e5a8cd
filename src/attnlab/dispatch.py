"""Which kernel configuration serves a problem on a GPU.

Today: the tuned kernel-7 entry of the GPU's architecture family (``attnlab.ladder``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.config import FlashConfig
from attnlab.ladder import k07_for

if TYPE_CHECKING:
    import torch

    from attnlab.validation import Problem

_ARCH_BY_CAPABILITY = {(8, 0): "sm_80", (8, 6): "sm_86", (8, 7): "sm_86", (8, 9): "sm_89",
                       (9, 0): "sm_90a"}


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


def default_config(arch: str, problem: Problem) -> FlashConfig:
    """The configuration ``attention()`` uses when the caller gives none."""
    del problem  # one entry per architecture family for now; head-dim entries come with tuning
    return k07_for(arch)
