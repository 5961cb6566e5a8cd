"""Bounded memos: what the host paths remember per call signature (launches, calls, the
dispatcher's choices) is keyed by exact shapes, and shapes that vary without bound (packed
batches of every length, a server's every query length) must not grow a memo forever."""

from __future__ import annotations

#: Entries a memo holds before it starts over (each a launch, a call or a config: a few
#: hundred bytes to a few kilobytes).
MAX_MEMO = 4096


def remember(memo: dict, key: tuple, value: object) -> None:
    """``memo[key] = value``, starting the memo over once it holds ``MAX_MEMO`` entries."""
    if len(memo) >= MAX_MEMO:
        memo.clear()
    memo[key] = value
