"""Executor overhead per node: run_graph against the seed loop, Dask's synchronous scheduler and a bare loop.

Targets (issue 8): a prepared ``run_plan`` within 1.5x of a bare loop over a precomputed order, one-shot
``run_graph`` (prepare + run) within 3x, faster than Dask's synchronous scheduler, and at least 100x faster
than the seed loop on a 2,000-node chain listed in reverse.  Nodes do almost nothing, so what is measured
is the executor itself.

    python benchmarks/bench_executor.py      (or: make bench)
"""

from __future__ import annotations

import random

import dask
from _timing import best_of, machine, table, verdict

from infergraph_lite import prepare, run_graph, run_plan, topological_order
from infergraph_lite.lessons.original import run_graph_original


def add(*args: int) -> int:
    return 1 + sum(args) % 7


def random_dag(n: int, seed: int = 0) -> dict:
    """n nodes, each using up to 3 random earlier nodes (or the input), listed in a shuffled order."""
    rng = random.Random(seed)
    nodes = {}
    for i in range(n):
        deps = sorted({f"n{rng.randrange(i)}" for _ in range(rng.randint(1, 3))}) if i else ["x"]
        nodes[f"n{i}"] = (add, deps)
    names = list(nodes)
    rng.shuffle(names)
    return {name: nodes[name] for name in names}


def reversed_chain(n: int) -> dict:
    nodes = {f"n{i}": (add, [f"n{i - 1}" if i else "x"]) for i in range(n)}
    return dict(reversed(nodes.items()))


def bare_loop(nodes: dict, order: list[str], inputs: dict) -> dict:
    """The least any executor can do: call each function in a known-good order."""
    results = dict(inputs)
    for name in order:
        func, deps = nodes[name]
        results[name] = func(*[results[d] for d in deps])
    return results


def as_dask(nodes: dict, inputs: dict) -> dict:
    graph = {name: (func, *deps) for name, (func, deps) in nodes.items()}
    graph.update(inputs)
    return graph


def measure(nodes: dict, inputs: dict) -> dict[str, float]:
    """Best-of times of each executor on one graph, after checking they all agree."""
    order = topological_order(nodes, inputs)
    plan = prepare(nodes, inputs)
    expected = bare_loop(nodes, order, inputs)
    assert run_plan(plan, inputs) == run_graph(nodes, inputs) == expected == run_graph_original(nodes, inputs)
    dask_graph = as_dask(nodes, inputs)
    assert dask.get(dask_graph, order[-1], scheduler="sync") == expected[order[-1]]
    return {
        "bare loop (order given)": best_of(lambda: bare_loop(nodes, order, inputs), 9),
        "run_plan (prepared once)": best_of(lambda: run_plan(plan, inputs), 9),
        "run_graph": best_of(lambda: run_graph(nodes, inputs), 9),
        "dask synchronous": best_of(lambda: dask.get(dask_graph, list(nodes), scheduler="sync"), 3),
        "seed loop": best_of(lambda: run_graph_original(nodes, inputs), 3),
    }


def main() -> None:
    inputs = {"x": 1}
    rows = []
    ratios = {}
    for label, nodes in [("random DAG, 10,000 nodes", random_dag(10_000)),
                         ("reversed chain, 2,000 nodes", reversed_chain(2_000))]:
        times = measure(nodes, inputs)
        n = len(nodes)
        for name, seconds in times.items():
            rows.append([label, name, seconds * 1e3, seconds / n * 1e6, seconds / times["run_graph"]])
        ratios[label] = times
    table(f"Executor overhead ({machine()})", ["graph", "executor", "total ms", "us per node", "x run_graph"], rows)

    dag, chain = ratios["random DAG, 10,000 nodes"], ratios["reversed chain, 2,000 nodes"]
    worst_vs_bare = max(t["run_graph"] / t["bare loop (order given)"] for t in ratios.values())
    plan_vs_bare = max(t["run_plan (prepared once)"] / t["bare loop (order given)"] for t in ratios.values())
    slowest_dask = min(t["dask synchronous"] / t["run_graph"] for t in ratios.values())
    seed_speedup = chain["seed loop"] / chain["run_graph"]
    table("Targets", ["measure", "value", "target", "verdict"], [
        ["run_plan / bare loop (worst graph)", plan_vs_bare, "<= 1.5", verdict(plan_vs_bare, 1.5, "lower")],
        ["run_graph (one-shot) / bare loop (worst graph)", worst_vs_bare, "<= 3", verdict(worst_vs_bare, 3, "lower")],
        ["dask sync / run_graph (worst graph)", slowest_dask, "> 1", verdict(slowest_dask, 1.0001, "higher")],
        ["seed loop / run_graph, reversed chain", seed_speedup, ">= 100", verdict(seed_speedup, 100, "higher")],
        ["seed loop / run_graph, random DAG", dag["seed loop"] / dag["run_graph"], "(info)", ""],
    ])


if __name__ == "__main__":
    main()
