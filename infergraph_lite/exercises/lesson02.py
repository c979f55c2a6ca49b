"""Checkers for the exercises of notebook 02, *A DAG executor*, and the small graphs they are tried on.

Light on purpose: it imports the core graph code and the seed example only, never the planner or Triton.

>>> check_missing_dependencies(lambda nodes, inputs: {}).message.split(": report")[0]
"found {}, expected {'a': ['typo'], 'b': ['modelC', 'typo']}"
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from infergraph_lite.core.execute import run_graph
from infergraph_lite.core.graph import levels
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

__all__ = ["DAG_SHAPES", "check_find_cycle_nodes", "check_missing_dependencies", "check_run_graph_with_levels",
           "check_run_only_needed"]


DAG_SHAPES = {
    "diamond": ({"a": (None, ["x"]), "b": (None, ["a"]), "c": (None, ["a"]), "d": (None, ["b", "c"])}, ["x"]),
    "skip edge": ({"a": (None, ["x"]), "b": (None, ["a"]), "c": (None, ["a", "b"]), "e": (None, ["x"])}, ["x"]),
    "chain listed backwards": ({"c": (None, ["b"]), "b": (None, ["a"]), "a": (None, ["x"])}, ["x"]),
}


def _runnable(shape: dict) -> dict:
    return {name: (lambda *args, _n=name: (_n, args), deps) for name, (_, deps) in shape.items()}


@checker
def check_run_graph_with_levels(run_graph_with_levels: Callable[[dict, dict], tuple[dict, list]]) -> str:
    """Exercise 2.2: run a graph and record which nodes could have run in parallel (its levels)."""
    for label, (shape, inputs) in DAG_SHAPES.items():
        nodes, values = _runnable(shape), dict.fromkeys(inputs, 0)
        results, found = run_graph_with_levels(nodes, values)
        require(results == run_graph(nodes, values), f"on the {label} graph the results are wrong")
        expected = levels(nodes, values)
        found = [sorted(level) for level in found]
        require(found == expected, f"on the {label} graph you found levels {found}, expected {expected}: a node's "
                                   "level is one more than its *deepest* dependency's")
    return "results and levels both match."


RING_SIZE = 50_000
"""The ring of notebook 02's cycle section: one cycle through every node, far past the recursion limit."""

_CYCLIC = {
    "self-loop": {"a": (None, ["a"])},
    "3-cycle with a tail in and out": {"in": (None, []), "a": (None, ["in", "c"]), "b": (None, ["a"]),
                                       "c": (None, ["b"]), "out": (None, ["c"])},
    "two separate cycles": {"p": (None, ["q"]), "q": (None, ["p"]), "r": (None, ["s"]), "s": (None, ["r"])},
}


@checker
def check_find_cycle_nodes(find_cycle_nodes: Callable[[dict], list[str] | None]) -> str:
    """Exercise 2.3: report the nodes of one cycle, in data-flow order (any starting node).

    Last, a ring of 50,000 nodes, as in the lesson: far past Python's recursion limit, so a recursive
    depth-first search fails there (walk the path with a loop and a stack of your own).
    """
    for label, (shape, _) in DAG_SHAPES.items():
        require(find_cycle_nodes(shape) is None, f"the {label} graph has no cycle, but you returned "
                                                 f"{find_cycle_nodes(shape)!r}")
    for label, nodes in _CYCLIC.items():
        cycle = find_cycle_nodes(nodes)
        if not isinstance(cycle, list) or not cycle:
            raise WrongAnswer(f"the {label} graph has a cycle, but you returned {cycle!r}")
        require(len(set(cycle)) == len(cycle), f"on the {label} graph {cycle} repeats a node; list each once")
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            require(b in nodes and a in nodes[b][1],
                    f"on the {label} graph {cycle} is not a cycle in data-flow order: {b!r} does not depend on "
                    f"{a!r} (nodes that only lead into or out of a cycle are not part of it)")
    ring = {f"n{i}": (None, [f"n{(i + 1) % RING_SIZE}"]) for i in range(RING_SIZE)}  # the lesson's ring
    try:
        cycle = find_cycle_nodes(ring)
    except RecursionError:
        raise WrongAnswer(f"on a ring of {RING_SIZE:,} nodes your search ran past Python's recursion limit "
                          f"({sys.getrecursionlimit():,} calls deep): keep the path in a list of your own and loop, "
                          "instead of calling the search from itself") from None
    found = f"{len(cycle):,} nodes" if isinstance(cycle, list) else repr(cycle)
    require(isinstance(cycle, list) and sorted(cycle) == sorted(ring)
            and all(a in ring[b][1] for a, b in zip(cycle, cycle[1:] + cycle[:1])),
            f"on a ring of {RING_SIZE:,} nodes the cycle is all of them, in data-flow order; you returned {found}")
    return f"cycles found and reported in data-flow order, also around a ring of {RING_SIZE:,} nodes; DAGs pass."


@checker
def check_missing_dependencies(missing_dependencies: Callable[[dict, Any], dict]) -> str:
    """Exercise 2.1: every missing dependency of every node at once."""
    nodes = {"a": (None, ["x", "typo"]), "b": (None, ["a", "modelC", "typo"]), "c": (None, ["a"])}
    found = missing_dependencies(nodes, ["x"])
    expected = {"a": ["typo"], "b": ["modelC", "typo"]}
    require(found == expected, f"found {found}, expected {expected}: report every node with missing names, each "
                               "name once in the order listed; inputs and other nodes are not missing")
    require(missing_dependencies(banana_nodes(), BANANA_INPUTS) == {}, "the seed graph with its input misses nothing")
    return "every missing name reported at once."


@checker
def check_run_only_needed(run_only_needed: Callable[[dict, Mapping[str, Any], list], dict]) -> str:
    """Exercise 2.4 (stretch): compute only what the wanted outputs need."""
    calls: list[str] = []

    def spy(name: str, func: Callable) -> Callable:
        def wrapped(*args: Any) -> Any:
            calls.append(name)
            return func(*args)
        return wrapped

    nodes = {name: (spy(name, func), deps) for name, (func, deps) in banana_nodes().items()}
    got = run_only_needed(nodes, BANANA_INPUTS, ["modelA"])
    require(got.get("modelA") == 6, f"modelA should be 6, got {got.get('modelA')!r}")
    require(sorted(calls) == ["modelA", "pre"],
            f"to get modelA only pre and modelA need to run, but {sorted(calls)} ran")
    calls.clear()
    got = run_only_needed(nodes, BANANA_INPUTS, ["combine"])
    require(got.get("combine") == {"len": 6, "a_count": 3} and len(calls) == 4 and len(set(calls)) == 4,
            f"for combine every node runs exactly once; ran {calls}")
    return "only the needed nodes ran, each once."

