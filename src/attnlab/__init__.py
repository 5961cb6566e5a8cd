"""attnlab: attention GPU kernels written in the CuTe DSL.

``import attnlab`` loads only torch and the pure-Python parts. ``compile_config`` and ``ladder``
import the CuTe DSL, which takes seconds, so they load on first access.
"""

from __future__ import annotations

import importlib

from attnlab import reference
from attnlab.api import attention, attention_varlen
from attnlab.config import ConfigError, FlashConfig
from attnlab.decode import attention_with_kvcache
from attnlab.sdpa import sdpa

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "FlashConfig",
    "__version__",
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "reference",
    "sdpa",
]


def __getattr__(name: str) -> object:
    """Load ``compile_config``, ``gemm``, ``conv`` and ``ladder`` on first use (PEP 562)."""
    if name in ("gemm", "conv"):
        return importlib.import_module(f"attnlab.{name}")
    if name == "compile_config":
        return importlib.import_module("attnlab.compile").compile_config
    if name == "ladder":
        return importlib.import_module("attnlab.ladder")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
