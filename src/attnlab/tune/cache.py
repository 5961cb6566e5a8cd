"""The tuning cache: the best config per (GPU, capability, dtype, head dim, causal, seqlen bucket).

A JSON file in the user cache directory (``platformdirs``), or ``$ATTNLAB_TUNE_CACHE``.
``attention()`` reads it through ``attnlab.dispatch``; ``attnlab tune`` writes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from attnlab.config import ConfigError, FlashConfig

CACHE_VERSION = 1
#: Sequence-length buckets: a problem uses the entry of the smallest bucket >= its seqlen_q.
SEQLEN_BUCKETS = (512, 1024, 2048, 4096, 8192, 16384)


def seqlen_bucket(seqlen: int) -> int:
    """The bucket of a query length (lengths past the last bucket share the last one)."""
    for bucket in SEQLEN_BUCKETS:
        if seqlen <= bucket:
            return bucket
    return SEQLEN_BUCKETS[-1]


@dataclass(frozen=True)
class TuneKey:
    gpu: str
    capability: str
    dtype: str
    head_dim: int
    causal: bool
    seqlen_bucket: int

    def text(self) -> str:
        return (f"{self.gpu}|sm{self.capability}|{self.dtype}|hd{self.head_dim}|"
                f"{'causal' if self.causal else 'full'}|s{self.seqlen_bucket}")


def default_path() -> Path:
    override = os.environ.get("ATTNLAB_TUNE_CACHE")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("attnlab")) / "tune.json"


class TuneCache:
    """Entries keyed by ``TuneKey.text()``; each holds a config and how it was measured."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.entries: dict[str, dict[str, object]] = {}
        if self.path.exists():
            payload = json.loads(self.path.read_text())
            if payload.get("version") == CACHE_VERSION:
                self.entries = payload["entries"]

    def get(self, key: TuneKey) -> FlashConfig | None:
        entry = self.entries.get(key.text())
        if entry is None:
            return None
        try:
            return FlashConfig.from_dict(entry["config"])  # type: ignore[arg-type]
        except (ConfigError, TypeError):
            return None  # written by another attnlab version: ignore, do not crash a user

    def put(self, key: TuneKey, config: FlashConfig, **measured: object) -> None:
        self.entries[key.text()] = {"config": config.to_dict(), **measured}

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": self.entries},
                                  indent=1, sort_keys=True))
        tmp.replace(self.path)  # atomic: a reader never sees half a file
        return self.path

    def clear(self) -> int:
        """Remove every entry (and the file); returns how many there were."""
        count = len(self.entries)
        self.entries = {}
        self.path.unlink(missing_ok=True)
        return count
