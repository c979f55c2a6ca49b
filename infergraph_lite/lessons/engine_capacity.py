"""One procedure for every engine's capacity (notebook 07, sections 6, 10 and 12).

The highest rate an engine serves with every run's p99 within a target, found by :func:`find_capacity` on a grid
``low * 2**k`` (bracket, then bisection), and one more run there with the engine's processes watched for CPU
and its batchers' batch sizes read.  Notebook 09 teaches the method; `make bench` runs it with longer runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from infergraph_lite.serving.benchmark import Capacity, find_capacity, measure_rate
from infergraph_lite.serving.watch import Watched, watch_rate

__all__ = ["NOTEBOOK_PROCEDURE", "capacity_of", "on_grid"]

# Short runs for a notebook; `make bench` uses 5-second runs of at least 50 requests.
NOTEBOOK_PROCEDURE = dict(duration=0.5, min_requests=20, warmup=0.2, repetitions=3)


def on_grid(rate: float, low: float = 10.0) -> float:
    """The highest rate of the grid ``low * 2**k`` at or below ``rate`` (``low`` when ``rate`` is lower).

    >>> on_grid(37.6), on_grid(160), on_grid(3)
    (20.0, 160.0, 10.0)
    """
    return float(low * 2 ** max(0, math.floor(math.log2(max(rate, low) / low))))


def capacity_of(target: Any, label: str, make_item: Callable[[int], Any], *, p99_target: float = 0.100,
                pids: Callable[[], Iterable[int]] = list,
                counts: Callable[[], Mapping[str, Mapping[int, int]]] | None = None,
                low: float = 10.0, start: float = 160.0, high: float = 1280.0,
                procedure: Mapping[str, Any] = NOTEBOOK_PROCEDURE) -> tuple[Capacity, Watched]:
    """The highest rate meeting ``p99_target`` (grown bracket from ``start``, then bisection), then one run at it
    with ``pids()`` watched and ``counts()`` read.  Prints one line per rate measured and one for the capacity.

    ``target`` is anything with ``submit(item) -> Future`` (a Triton client, a Ray Serve graph, a GraphServer).
    """
    def at(rate: float) -> Any:
        return measure_rate(target, rate, make_item, p99_target=p99_target, timeout=30, **procedure)

    capacity = find_capacity(at, low, high, p99_target, growth=2, resolution=0.3, start=start)
    for rate, result in sorted(capacity.results.items()):
        p99_low, p99_high = result.p99_range
        print(f"{label:26s} {rate:5.0f} req/s: sent {sum(result.sent) / len(result.sent):6.1f}, served "
              f"{result.served:6.1f}; p99 {1e3 * p99_low:4.0f}-{1e3 * p99_high:4.0f} ms over {len(result.reports)} "
              f"runs: {'meets' if result.meets(p99_target) else 'misses'}")
    edge = watch_rate(target, capacity.meets or low, make_item, pids(), counts=counts, **procedure)
    print(f"{label}: capacity {capacity}; there {edge.cpu_ms_per_request:.1f} CPU ms per request, mean batch "
          + (", ".join(f"{name} {b:.1f}" for name, b in edge.batches.items() if b > 1.05) or "1.0 at every stage"))
    return capacity, edge
