"""Timing helpers shared by the benchmark scripts (imported as a sibling module)."""

from __future__ import annotations

import gc
import platform
import time
from collections.abc import Callable
from typing import Any


def best_of(fn: Callable[[], Any], repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs, in seconds: the run least disturbed by the rest of the machine."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def machine() -> str:
    """One line describing where the numbers came from."""
    import os

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """Print a plain-text table."""
    cells = [header] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n{title}\n" + "-" * len(title))
    for k, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if k == 0:
            print("  ".join("-" * w for w in widths))


def verdict(value: float, target: float, better: str) -> str:
    """'met' or 'MISSED' for a target; ``better`` is 'lower' or 'higher'."""
    ok = value <= target if better == "lower" else value >= target
    return "met" if ok else "MISSED"
