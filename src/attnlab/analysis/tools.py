"""Locating NVIDIA's binary tools: the PyPI packages first, then ``PATH`` and ``CUDA_HOME``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class ToolNotFound(RuntimeError):
    """A disassembler or dump tool is missing, with how to install it."""


def find_tool(name: str) -> Path:
    """Path of ``nvdisasm`` or ``cuobjdump``.

    Looks in the ``nvidia-cuda-nvdisasm`` / ``nvidia-cuda-cuobjdump`` wheels
    (``site-packages/nvidia/cu*/bin``), then on ``PATH``, then under ``$CUDA_HOME/bin``.
    """
    try:
        import nvidia

        for root in nvidia.__path__:
            for candidate in sorted(Path(root).glob(f"cu*/bin/{name}"), reverse=True):
                if os.access(candidate, os.X_OK):
                    return candidate
    except ImportError:
        pass
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name
    if os.access(cuda_home, os.X_OK):
        return cuda_home
    raise ToolNotFound(
        f"{name} not found: pip install nvidia-cuda-{name} (or put CUDA's bin on PATH)"
    )
