"""Checkers for the exercises of notebook 03, *Parallel execution*.

Tried on :data:`~infergraph_lite.exercises.lesson02.DAG_SHAPES`, the graphs of notebook 02's exercises.

>>> check_best_node_to_speed_up(lambda nodes, durations: "a").passed
False
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from infergraph_lite.core.execute import run_graph
from infergraph_lite.core.graph import critical_path
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.exercises.lesson02 import DAG_SHAPES

__all__ = ["check_best_node_to_speed_up", "check_parallel_speedup_bound", "check_run_asap_parallel"]


@checker
def check_parallel_speedup_bound(parallel_speedup_bound: Callable[[dict, dict], float]) -> str:
    """Exercise 03.1: the best speed-up parallelism can give: sum of durations / critical path."""
    for label, (shape, _) in DAG_SHAPES.items():
        durations = {name: float(i + 1) for i, name in enumerate(sorted(shape))}
        expected = sum(durations.values()) / critical_path(shape, durations)[1]
        got = parallel_speedup_bound(shape, durations)
        require(math.isclose(got, expected), f"on the {label} graph you said {got}, expected {expected:.4g}: "
                                             "sequential time divided by the critical path's")
    return "speed-up bounds match."


@checker
def check_run_asap_parallel(run_asap_parallel: Callable[[dict, dict, int], dict]) -> str:
    """Exercise 03.2: an as-soon-as-possible thread executor (each node starts when its own inputs are ready).

    No fixed time limit: whether nodes overlapped, and when each started, is read from when each ran;
    the answer's run is compared with a sequential run of the same graph measured here, in the same process.
    """
    stamps: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def timed(name: str, seconds: float) -> Callable:
        def work(*_: Any) -> str:
            start = time.perf_counter()
            time.sleep(seconds)
            with lock:
                stamps[name] = (start, time.perf_counter())
            return name
        return work

    nodes = {"fast": (timed("fast", 0.01), []), "slow": (timed("slow", 0.12), []), "slow2": (timed("slow2", 0.12), []),
             "after_fast": (timed("after_fast", 0.01), ["fast"]),
             "end": (timed("end", 0.0), ["after_fast", "slow", "slow2"])}
    started = time.perf_counter()
    run_graph(nodes, {})
    sequential = time.perf_counter() - started
    stamps.clear()
    started = time.perf_counter()
    results = run_asap_parallel(nodes, {}, 4)
    elapsed = time.perf_counter() - started
    require(results == {name: name for name in nodes}, "the results are wrong: each node returns its own name")
    require(set(stamps) == set(nodes), f"these nodes never ran: {sorted(set(nodes) - set(stamps))}")
    (a0, a1), (b0, b1) = stamps["slow"], stamps["slow2"]
    require(a0 < b1 and b0 < a1, "slow and slow2 (both ready at the start) ran one after the other: nodes that are "
                                 "ready at the same time should run at the same time, on the pool's threads")
    for name, (_, deps) in nodes.items():
        for dep in deps:
            require(stamps[name][0] >= stamps[dep][1], f"{name} started before its input {dep} had finished")
    require(stamps["after_fast"][0] < min(a1, b1),
            "after_fast waited for slow and slow2, although it needs only fast: start each node as soon as its own "
            "inputs are ready, not when its whole level is done (that is the level-by-level executor of the lesson)")
    # Overlapped, the graph takes about half its sequential time (0.13 s of 0.26 s); 0.8 leaves room for a busy machine.
    require(elapsed < 0.8 * sequential, f"took {elapsed:.2f} s against {sequential:.2f} s run sequentially here: the "
                                        "nodes should run at the same time")
    return "each node starts as soon as its inputs are ready, and independent nodes overlap."


@checker
def check_best_node_to_speed_up(best_node_to_speed_up: Callable[[dict, dict], str]) -> str:
    """Exercise 03.3 (stretch): which node, made twice as fast, shortens the critical path most?"""
    nodes = {"pre": (None, ["x"]), "a": (None, ["pre"]), "b": (None, ["pre"]), "post": (None, ["a", "b"])}
    cases: list[dict[str, float]] = [
        {"pre": 4, "a": 10, "b": 9.5, "post": 1},  # halving a leaves b's path nearly as long: pre is on both
        {"pre": 1, "a": 10, "b": 2, "post": 1},
        {"pre": 1, "a": 3, "b": 2, "post": 8},
    ]
    for durations in cases:
        after = {name: critical_path(nodes, {**durations, name: durations[name] / 2})[1] for name in nodes}
        best = sorted(name for name, total in after.items() if total == min(after.values()))
        got = best_node_to_speed_up(nodes, durations)
        if got not in best:
            raise WrongAnswer(f"with durations {durations} you chose {got!r} (critical path {after.get(got)}), "
                              f"but halving {best[0]!r} gives {after[best[0]]}: the longest node is not always the "
                              "answer, a shorter one may sit on every long path")
    return "the best node to optimise, every time."

