"""Batch functions for the process-mode tests: module-level, so a worker process imports them by name.

Kept apart from the test modules so that a worker imports only this (and the package), not pytest.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


def add_pairs(pairs: list[tuple[int, int]]) -> list[int]:
    return [a + b for a, b in pairs]


def fail_on(items: list[int], bad: int) -> list[int]:
    """Raise ValueError (naming the item) when the batch holds ``bad``."""
    if bad in items:
        raise ValueError(f"item {bad} is bad")
    return items


def wait_for_file(items: list[Any], started: str, release: str) -> list[Any]:
    """Say which process runs the batch (writes its PID to ``started``), then wait for ``release`` to exist."""
    Path(started).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    return items


def exit_on(items: list[int], bad: int) -> list[int]:
    """The worker process exits (code 3) in the middle of a batch holding ``bad``."""
    if bad in items:
        os._exit(3)
    return items


def complain_and_exit(items: list[int], bad: int) -> list[int]:
    """The worker process says why on its stderr, then exits (code 3), in the middle of a batch holding ``bad``."""
    if bad in items:
        print(f"fatal: item {bad} corrupted the model's memory", file=sys.stderr, flush=True)
        os._exit(3)
    return items


def _die_loading(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(4)


class DiesWhenLoaded:
    """A stage function whose worker process dies while loading it: unpickling prints ``message`` and exits (4)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __call__(self, items: list[Any]) -> list[Any]:
        return items

    def __reduce__(self) -> tuple[Any, ...]:
        return _die_loading, (self.message,)


def unpicklable_answers(items: list[Any]) -> list[Any]:
    return [lambda item=item: item for item in items]  # a lambda does not pickle


def raise_system_exit(items: list[Any]) -> list[Any]:
    raise SystemExit("a model called exit()")


def spin_then_nap(items: list[Any], spin: float, nap: float) -> list[Any]:
    """``spin`` CPU seconds per item of pure-Python busy work, then a ``nap`` s sleep (no CPU) per batch."""
    for _ in items:
        deadline = time.thread_time() + spin
        while time.thread_time() < deadline:
            pass
    time.sleep(nap)
    return items


def two_stages() -> dict[str, Any]:
    """``text -> pre (strip, lower) -> n (length)``, no batching: a graph every registered engine serves (Dask
    refuses batching), and the factory Triton's model processes rebuild it with (tests/test_engines.py)."""
    from infergraph_lite.core.stage import Stage

    return {"pre": (Stage(fn=lambda xs: [x.strip().lower() for x in xs]), ["text"]),
            "n": (Stage(fn=lambda xs: [len(x) for x in xs]), ["pre"])}
