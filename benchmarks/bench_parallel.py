"""Parallel efficiency: run_graph_parallel latency / critical-path time on wide graphs of GIL-releasing work.

Target (issue 5): at most 1.10 on wide graphs of sleep (I/O-like) work, with a new thread pool per
call and with a long-lived pool reused across calls (what a server does).  numpy work is reported too,
against the bound this machine's cores allow: max(critical path, total work / cores), with as many
threads as cores and with one thread per node (oversubscribed: BLAS runs threads of its own).
Also the scheduling overhead per node, from a wide graph of no-op nodes.

    python benchmarks/bench_parallel.py      (or: make bench)
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _timing import best_of, machine, table, verdict

from infergraph_lite import critical_path, measure_node_durations, run_graph, run_graph_parallel


def layered(width: int, depth: int, work) -> dict:
    """`depth` layers of `width` nodes; each node uses two nodes of the layer before (a wide, meshed DAG)."""
    nodes = {}
    for d in range(depth):
        for w in range(width):
            deps = ["x"] if d == 0 else [f"L{d - 1}_{w}", f"L{d - 1}_{(w + 1) % width}"]
            nodes[f"L{d}_{w}"] = (work, deps)
    return nodes


def main() -> None:
    cores = os.cpu_count() or 1
    matrix = np.random.default_rng(0).standard_normal((256, 256))

    def sleep_work(*_):
        time.sleep(0.01)

    def numpy_work(*_):
        return float(np.linalg.norm(matrix @ matrix))

    rows, targets = [], []
    with ThreadPoolExecutor(max_workers=64, thread_name_prefix="server") as server_pool:
        for width, depth in [(16, 4), (64, 3)]:
            nodes = layered(width, depth, sleep_work)
            floor = critical_path(nodes, measure_node_durations(nodes, {"x": 0}, repeats=3))[1]
            server_pool.map(time.sleep, [0.0] * 64)  # start the long-lived pool's threads once, as a server would
            for how, kwargs in [("new pool per call", {"max_workers": width}), ("reused pool", {"pool": server_pool})]:
                seconds = best_of(lambda nodes=nodes, kwargs=kwargs: run_graph_parallel(nodes, {"x": 0}, **kwargs), 3)
                name = f"sleep 10 ms, {width} wide x {depth} deep, {how}"
                rows.append([name, floor * 1e3, seconds * 1e3, seconds / floor, "-"])
                targets.append([f"latency / critical path, {name}", seconds / floor, "<= 1.10",
                                verdict(seconds / floor, 1.10, "lower")])

    # CPU work: numpy releases the GIL, but there are only `cores` cores, and BLAS has threads of its own.
    nodes = layered(16, 4, numpy_work)
    durations = measure_node_durations(nodes, {"x": 0}, repeats=3)
    floor = critical_path(nodes, durations)[1]
    cores_bound = max(floor, sum(durations.values()) / cores)
    sequential = best_of(lambda: run_graph(nodes, {"x": 0}), 3)
    rows.append(["numpy 256x256 matmul, 16 wide x 4 deep, run_graph (sequential)", floor * 1e3, sequential * 1e3,
                 sequential / floor, sequential / cores_bound])
    for workers in (cores, 16):
        seconds = best_of(lambda workers=workers: run_graph_parallel(nodes, {"x": 0}, max_workers=workers), 3)
        rows.append([f"numpy 256x256 matmul, 16 wide x 4 deep, {workers} threads", floor * 1e3, seconds * 1e3,
                     seconds / floor, seconds / cores_bound])
    table(f"Parallel efficiency ({machine()})",
          ["graph", "critical path ms", "measured ms", "/ critical path", "/ max(cp, work/cores)"], rows)

    # Scheduling overhead: no-op nodes, so the time is the executor's own.
    noop = {f"n{i}": (int, []) for i in range(2_000)}
    seq = best_of(lambda: run_graph(noop, {}), 5)
    par = best_of(lambda: run_graph_parallel(noop, {}, max_workers=4), 5)
    table("Scheduling overhead, 2,000 no-op nodes", ["executor", "total ms", "us per node"],
          [["run_graph", seq * 1e3, seq / 2000 * 1e6], ["run_graph_parallel (4 threads)", par * 1e3, par / 2000 * 1e6]])
    table("Targets", ["measure", "value", "target", "verdict"], targets)


if __name__ == "__main__":
    main()
