"""Executors: run a prepared graph (a :class:`~infergraph_lite.core.graph.Plan`) sequentially or on a thread pool.

Both keep the seed's contract: ``run(nodes, inputs) -> inputs + every node's
result``.  Both validate the whole graph before anything runs (by preparing
it, or by taking a Plan prepared once), and both turn an ``Exception`` raised
inside a node into :class:`NodeError` naming the node; ``KeyboardInterrupt``
and ``SystemExit`` pass through unchanged.  A server prepares its graph once
and calls :func:`run_plan` per request; :func:`run_graph` is "prepare, then
run" for one-off calls.

Introduced in notebook 02 (``run_graph``, ``Plan.run``) and notebook 03 (``run_graph_parallel``).
"""

from __future__ import annotations

import contextlib
import queue
import statistics
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, NamedTuple

from infergraph_lite.core.arguments import check_count
from infergraph_lite.core.graph import Countdown, Graph, Plan, prepare

__all__ = ["NodeError", "TraceEvent", "measure_node_durations", "run_graph", "run_graph_parallel", "run_plan",
           "run_plan_parallel"]


class NodeError(RuntimeError):
    """A node raised; ``.node`` names it and ``__cause__`` is the original exception."""

    def __init__(self, node: str, cause: BaseException):
        self.node = node
        super().__init__(f"node {node!r} failed: {type(cause).__name__}: {cause}")


class TraceEvent(NamedTuple):
    """One node's run: which thread, and when (seconds since the run started)."""

    node: str
    thread: str
    start: float
    end: float


def run_plan(plan: Plan, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run every node of a prepared plan once, in its order, and return all values.

    ``inputs`` must give every input the graph reads.  A node is called with
    its dependencies' values in the order listed.

    >>> plan = prepare({"double": (lambda x: 2 * x, ["x"])}, inputs=["x"])
    >>> run_plan(plan, {"x": 21})
    {'x': 21, 'double': 42}
    """
    plan.check_inputs(inputs)
    results = dict(inputs)
    nodes = plan.nodes
    name = ""
    try:  # one try around the loop, not a wrapper per node: it is the executor's hot path
        for name in plan.order:
            func, deps = nodes[name]
            results[name] = func(*[results[d] for d in deps])
    except Exception as exc:
        raise NodeError(name, exc) from exc
    return results


def run_graph(nodes: Graph, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run every node once, each after its dependencies, and return all values.

    ``nodes`` maps ``name -> (func, [dependency names])``; a node is called
    with its dependencies' values in the order listed.  The result holds the
    inputs plus every node's result.  The graph is validated first (see
    :func:`~infergraph_lite.core.graph.prepare`), so a bad graph runs nothing; the
    order comes from Kahn's algorithm, O(V + E).  To run one graph many
    times, prepare it once and call ``run_plan(plan, inputs)``.

    >>> nodes = {
    ...     "pre": (lambda s: s.strip().lower(), ["text"]),
    ...     "modelA": (len, ["pre"]),
    ...     "modelB": (lambda s: s.count("a"), ["pre"]),
    ...     "combine": (lambda n, a: {"len": n, "a_count": a}, ["modelA", "modelB"]),
    ... }
    >>> run_graph(nodes, {"text": "  BANANA  "})["combine"]
    {'len': 6, 'a_count': 3}
    """
    return run_plan(prepare(nodes, inputs), inputs)


def run_plan_parallel(
    plan: Plan,
    inputs: Mapping[str, Any],
    max_workers: int | None = None,
    trace: list[TraceEvent] | None = None,
    pool: Executor | None = None,
    blas_threads: int | None = None,
) -> dict[str, Any]:
    """Like :func:`run_plan`, but on a thread pool: each node starts as soon as its dependencies are done.

    A node is submitted the moment its last dependency finishes, not when its
    whole level has finished.  Pass a list as ``trace`` to receive one
    :class:`TraceEvent` per node that ran (times in seconds from the start).
    ``max_workers`` is the pool size (``None``: the pool's default).  A
    server answering many requests passes its own long-lived ``pool``
    instead (``max_workers`` is then ignored): starting threads anew for
    every request costs tens of microseconds each.

    If a node raises, nothing more is scheduled, the nodes already running are
    waited for, and :class:`NodeError` is raised for the first failure; no
    thread is left behind.

    ``blas_threads`` (needs ``threadpoolctl``) limits the threads each BLAS
    matrix product may use while the graph runs; ``None`` leaves BLAS as it
    is.  Workers × BLAS threads ≤ cores keeps numpy nodes from
    oversubscribing the cores (notebook 03, section 7).  The limit is
    process-wide for OpenBLAS, so other threads' BLAS calls share it for
    the duration of the run.

    >>> plan = prepare({"a": (lambda: 1, []), "b": (lambda: 2, []), "sum": (lambda a, b: a + b, ["a", "b"])})
    >>> events = []
    >>> run_plan_parallel(plan, {}, max_workers=2, trace=events)["sum"]
    3
    >>> sorted(e.node for e in events)
    ['a', 'b', 'sum']
    """
    max_workers = check_count("max_workers", max_workers, allow_none=True)
    plan.check_inputs(inputs)
    graph = plan.nodes
    results = dict(inputs)
    countdown = Countdown(plan)
    finished: queue.SimpleQueue[tuple[str, bool, Any]] = queue.SimpleQueue()
    t0 = time.perf_counter()

    def work(name: str, args: list[Any]) -> None:
        # Always report back, whatever happens, so the scheduler never waits forever.
        start = time.perf_counter() - t0
        try:
            value, ok = graph[name][0](*args), True
        except BaseException as exc:  # noqa: BLE001 - reported to the scheduler, which decides
            value, ok = exc, False
        end = time.perf_counter() - t0
        if trace is not None:
            trace.append(TraceEvent(name, threading.current_thread().name, start, end))
        finished.put((name, ok, value))

    failure: tuple[str, BaseException] | None = None
    limits: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if blas_threads is not None:
        blas_threads = check_count("blas_threads", blas_threads)
        from threadpoolctl import threadpool_limits  # only needed by those who ask for a limit

        limits = threadpool_limits(limits=blas_threads, user_api="blas")
    # Our own pool is shut down (threads joined) on the way out; a caller's pool stays theirs.
    own_pool = ThreadPoolExecutor(max_workers, "infergraph") if pool is None else contextlib.nullcontext(pool)
    with limits, own_pool as executor:

        def submit(name: str) -> None:
            executor.submit(work, name, [results[d] for d in graph[name][1]])

        running = 0
        for name in countdown.first():
            submit(name)
            running += 1
        while running:  # every submitted node reports back, so this also waits out a failure
            name, ok, value = finished.get()
            running -= 1
            if not ok:
                failure = failure or (name, value)
                continue
            results[name] = value
            if failure is not None:
                continue  # a node failed: let the running ones finish, start nothing new
            for child in countdown.done(name):
                submit(child)
                running += 1
    if failure is not None:
        name, exc = failure
        if not isinstance(exc, Exception):
            raise exc  # KeyboardInterrupt, SystemExit: not a node's failure, as in run_plan
        raise NodeError(name, exc) from exc
    return results


def run_graph_parallel(
    nodes: Graph,
    inputs: Mapping[str, Any],
    max_workers: int | None = None,
    trace: list[TraceEvent] | None = None,
    pool: Executor | None = None,
) -> dict[str, Any]:
    """Prepare ``nodes``, then run them on a thread pool: see :func:`run_plan_parallel`.

    >>> import time
    >>> nodes = {"a": (lambda: time.sleep(0.05) or 1, []), "b": (lambda: time.sleep(0.05) or 2, []),
    ...          "sum": (lambda a, b: a + b, ["a", "b"])}
    >>> events = []
    >>> run_graph_parallel(nodes, {}, max_workers=2, trace=events)["sum"]
    3
    >>> sorted(e.node for e in events)
    ['a', 'b', 'sum']
    """
    max_workers = check_count("max_workers", max_workers, allow_none=True)
    return run_plan_parallel(prepare(nodes, inputs), inputs, max_workers, trace, pool)


def measure_node_durations(nodes: Graph | Plan, inputs: Mapping[str, Any], repeats: int = 5) -> dict[str, float]:
    """Median seconds each node takes when it runs alone: the durations :func:`critical_path` needs.

    One worker runs the graph one node at a time and records a trace, so the
    parallel executor doubles as a profiler; the median of ``repeats`` runs
    damps the machine's noise.  Introduced in notebook 03.

    >>> import time
    >>> d = measure_node_durations({"nap": (lambda: time.sleep(0.01), [])}, {}, repeats=3)
    >>> d["nap"] >= 0.009
    True
    """
    repeats = check_count("repeats", repeats)
    plan = nodes if isinstance(nodes, Plan) else prepare(nodes, inputs)
    samples: dict[str, list[float]] = {name: [] for name in plan.nodes}
    for _ in range(repeats):
        trace: list[TraceEvent] = []
        run_plan_parallel(plan, inputs, max_workers=1, trace=trace)
        for event in trace:
            samples[event.node].append(event.end - event.start)
    return {name: statistics.median(times) for name, times in samples.items()}
