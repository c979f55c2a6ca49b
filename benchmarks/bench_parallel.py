"""Parallel efficiency: run_graph_parallel latency / critical-path time on wide graphs of GIL-releasing work.

Target (issue 5): at most 1.10 on wide graphs of sleep (I/O-like) work, with a new thread pool per
call and with a long-lived pool reused across calls (what a server does).

numpy work (issue 8): the 16-wide x 4-deep graph of 256x256 matrix products, run sequentially with
BLAS's default threads and with one, and on as many worker threads as cores with each.  Targets: the
parallel run with one BLAS thread per worker >= 1.6x faster than the sequential run with one BLAS
thread, and >= 1.2x faster than the sequential run with BLAS's default threads.  (With the default,
each worker's BLAS call starts threads of its own: workers x BLAS threads > cores, oversubscription.)
The configurations take turns, round after round, and each is reported by its median, so a
disturbance from the rest of the machine hits all of them alike; each run starts once the previous run's
BLAS threads have stopped spinning (``wait_until_idle``), so every configuration starts on free cores.
The bound max(critical path, total work / cores) is printed beside them.

Also the scheduling overhead per node, from a wide graph of no-op nodes.

    python benchmarks/bench_parallel.py      (or: make bench)
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _timing import best_of, machine, table, verdict
from threadpoolctl import threadpool_info, threadpool_limits

from infergraph_lite import (
    critical_path,
    measure_node_durations,
    prepare,
    run_graph,
    run_graph_parallel,
    run_plan,
    run_plan_parallel,
)
from infergraph_lite.lessons.idle_threads import wait_until_idle


def layered(width: int, depth: int, work) -> dict:
    """`depth` layers of `width` nodes; each node uses two nodes of the layer before (a wide, meshed DAG)."""
    nodes = {}
    for d in range(depth):
        for w in range(width):
            deps = ["x"] if d == 0 else [f"L{d - 1}_{w}", f"L{d - 1}_{(w + 1) % width}"]
            nodes[f"L{d}_{w}"] = (work, deps)
    return nodes


def main() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
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
    blas_default = next((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), 1)
    plan = prepare(layered(16, 4, numpy_work), {"x": 0})

    def run(blas_threads: int, workers: int) -> None:
        with threadpool_limits(limits=blas_threads, user_api="blas"):
            if workers == 1:
                run_plan(plan, {"x": 0})
            else:
                run_plan_parallel(plan, {"x": 0}, max_workers=workers)

    with threadpool_limits(limits=1, user_api="blas"):
        durations = measure_node_durations(plan, {"x": 0}, repeats=3)
    floor = critical_path(plan, durations)[1]
    cores_bound = max(floor, sum(durations.values()) / cores)
    configs = {
        f"sequential, {blas_default} BLAS threads (numpy's default)": (blas_default, 1),
        "sequential, 1 BLAS thread": (1, 1),
        f"{cores} workers, {blas_default} BLAS threads each": (blas_default, cores),
        f"{cores} workers, 1 BLAS thread each": (1, cores),
        f"16 workers, {blas_default} BLAS threads each": (blas_default, 16),
        "16 workers, 1 BLAS thread each": (1, 16),
    }
    samples: dict[str, list[float]] = {label: [] for label in configs}
    for config in configs.values():
        run(*config)  # warm-up
    for _ in range(9):
        for label, config in configs.items():
            # A BLAS thread spins about 0.1 s after each product: without this wait the run after a
            # default-threads run finds a core taken and looks slower than it is.
            wait_until_idle()
            started = time.perf_counter()
            run(*config)
            samples[label].append(time.perf_counter() - started)
    median = {label: statistics.median(times) for label, times in samples.items()}
    for label, seconds in median.items():
        rows.append([f"numpy 256x256 matmul, 16 wide x 4 deep, {label}", floor * 1e3, seconds * 1e3,
                     seconds / floor, seconds / cores_bound])
    table(f"Parallel efficiency ({machine()}; numpy rows: median of 9, configurations taking turns)",
          ["graph", "critical path ms", "measured ms", "/ critical path", "/ max(cp, work/cores)"], rows)
    best = median[f"{cores} workers, 1 BLAS thread each"]
    for against, target in [("sequential, 1 BLAS thread", 1.6),
                            (f"sequential, {blas_default} BLAS threads (numpy's default)", 1.2)]:
        ratio = median[against] / best
        targets.append([f"numpy graph: {cores} workers x 1 BLAS thread, speed-up over {against}", ratio,
                        f">= {target}", verdict(ratio, target, "higher")])
    oversubscribed = median[f"{cores} workers, {blas_default} BLAS threads each"] / best
    targets.append([f"numpy graph: {cores} workers x {blas_default} BLAS threads, time / {cores} workers x 1",
                    oversubscribed, "(recorded)", "-"])

    # Scheduling overhead: no-op nodes, so the time is the executor's own.
    noop = {f"n{i}": (int, []) for i in range(2_000)}
    seq = best_of(lambda: run_graph(noop, {}), 5)
    par = best_of(lambda: run_graph_parallel(noop, {}, max_workers=4), 5)
    table("Scheduling overhead, 2,000 no-op nodes", ["executor", "total ms", "us per node"],
          [["run_graph", seq * 1e3, seq / 2000 * 1e6], ["run_graph_parallel (4 threads)", par * 1e3, par / 2000 * 1e6]])
    table("Targets", ["measure", "value", "target", "verdict"], targets)


if __name__ == "__main__":
    main()
