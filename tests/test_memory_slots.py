"""The GPU tests' memory slots (``conftest._medium_memory_slot``): at most
``MEDIUM_MEMORY_SLOTS`` ``medium_memory`` tests hold the GPU's memory at once."""

from __future__ import annotations

import threading
from pathlib import Path

from conftest import MEDIUM_MEMORY_SLOTS, _medium_memory_slot


def test_a_test_past_the_slots_waits_until_one_is_given_back(tmp_path: Path) -> None:
    held = [_medium_memory_slot(tmp_path) for _ in range(MEDIUM_MEMORY_SLOTS)]
    for slot in held:
        slot.__enter__()
    entered = threading.Event()

    def next_test() -> None:
        with _medium_memory_slot(tmp_path):
            entered.set()

    waiter = threading.Thread(target=next_test)
    waiter.start()
    try:
        assert not entered.wait(0.5), "a test took a slot while all were held"
        held.pop().__exit__(None, None, None)
        assert entered.wait(5), "a slot given back was not taken"
    finally:
        for slot in held:
            slot.__exit__(None, None, None)
        waiter.join(5)
