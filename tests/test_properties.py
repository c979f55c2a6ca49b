"""Property tests on random DAGs: both executors against a reference, traces, networkx agreement."""

from __future__ import annotations

import itertools
import random

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite import (
    CycleError,
    TraceEvent,
    critical_path,
    find_cycle,
    levels,
    run_graph,
    run_graph_parallel,
    topological_order,
)


def node_value(name: str, *args: object) -> tuple:
    """A node's result records its name and its arguments, so any wrong wiring shows."""
    return (name, args)


@st.composite
def random_dags(draw, max_nodes: int = 25) -> tuple[dict, dict]:
    """A DAG over nodes n0..nk (deps only on earlier nodes or inputs), listed in a shuffled order."""
    n = draw(st.integers(min_value=0, max_value=max_nodes))
    inputs = {"x": 1, "y": 2}
    nodes = {}
    for i in range(n):
        candidates = [f"n{j}" for j in range(i)] + list(inputs)
        deps = draw(st.lists(st.sampled_from(candidates), max_size=4))
        nodes[f"n{i}"] = (lambda *args, _name=f"n{i}": node_value(_name, *args), deps)
    order = draw(st.permutations(list(nodes)))
    return {name: nodes[name] for name in order}, inputs


def reference(nodes: dict, inputs: dict) -> dict:
    """Evaluate by memoised recursion straight from the definition."""
    results = dict(inputs)

    def value(name: str) -> object:
        if name not in results:
            func, deps = nodes[name]
            results[name] = func(*[value(d) for d in deps])
        return results[name]

    for name in nodes:
        value(name)
    return results


def to_nx(nodes: dict) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((d, n) for n, (_, deps) in nodes.items() for d in deps if d in nodes)
    return g


@given(random_dags())
def test_both_executors_match_the_reference(dag):
    nodes, inputs = dag
    expected = reference(nodes, inputs)
    assert run_graph(nodes, inputs) == expected
    assert run_graph_parallel(nodes, inputs, max_workers=4) == expected


@settings(max_examples=50)
@given(random_dags(), st.integers(min_value=1, max_value=6))
def test_parallel_trace_starts_every_node_after_all_its_dependencies_ended(dag, workers):
    nodes, inputs = dag
    trace: list[TraceEvent] = []
    run_graph_parallel(nodes, inputs, max_workers=workers, trace=trace)
    by_node = {e.node: e for e in trace}
    assert sorted(by_node) == sorted(nodes) and len(trace) == len(nodes)
    for name, (_, deps) in nodes.items():
        for dep in deps:
            if dep in nodes:
                assert by_node[name].start >= by_node[dep].end, f"{name} started before {dep} ended"


@given(random_dags())
def test_topological_order_puts_every_dependency_first(dag):
    nodes, inputs = dag
    position = {name: i for i, name in enumerate(topological_order(nodes, inputs))}
    assert sorted(position) == sorted(nodes)
    assert all(position[d] < position[n] for n, (_, deps) in nodes.items() for d in deps if d in nodes)


@given(random_dags())
def test_levels_match_networkx_topological_generations(dag):
    nodes, inputs = dag
    expected = [sorted(gen) for gen in nx.topological_generations(to_nx(nodes))]
    assert levels(nodes, inputs) == expected


@given(random_dags(), st.data())
def test_critical_path_total_matches_networkx_longest_path(dag, data):
    nodes, _ = dag
    durations = {name: data.draw(st.integers(0, 20), label=name) for name in nodes}
    path, total = critical_path(nodes, durations)
    # networkx weighs edges, so put each node's duration on the edges into it from a source.
    g = to_nx(nodes)
    for u, v in g.edges:
        g.edges[u, v]["weight"] = durations[v]
    g.add_weighted_edges_from(("<source>", name, durations[name]) for name in nodes)
    assert total == nx.dag_longest_path_length(g, weight="weight") if nodes else total == 0
    # The path we return is a real dependency chain whose durations add up to the total.
    assert all(a in nodes[b][1] for a, b in itertools.pairwise(path))
    assert sum(durations[n] for n in path) == total


@given(random_dags(max_nodes=15), st.randoms(use_true_random=False))
def test_find_cycle_finds_a_real_cycle_exactly_when_networkx_does(dag, rnd: random.Random):
    nodes, _ = dag
    if nodes and rnd.random() < 0.7:  # close a loop: an early node now depends on a later one
        names = sorted(nodes, key=lambda s: int(s[1:]))
        low, high = sorted(rnd.sample(range(len(names)), 2)) if len(names) > 1 else (0, 0)
        func, deps = nodes[names[low]]
        nodes[names[low]] = (func, [*deps, names[high]])
    cycle = find_cycle(nodes)
    assert (cycle is None) == nx.is_directed_acyclic_graph(to_nx(nodes))
    if cycle is not None:
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            assert a in nodes[b][1], f"{a} is not a dependency of {b}"
        assert cycle[0] == min(cycle)
        try:
            run_graph(nodes, {"x": 1, "y": 2})
        except CycleError as err:
            assert err.cycle == cycle
        else:
            raise AssertionError("run_graph ran a graph with a cycle")
