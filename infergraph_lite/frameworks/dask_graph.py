"""The same graph on Dask: one task graph per request, on a local cluster bound to 127.0.0.1 (notebook 07).

Dask's task graph is the seed's dict seen from the other side.  Ours maps a node to
``(func, [dependency names])``; Dask's maps a key to a task that calls a function on references
to other keys::

    {"pre": (clean, ["text"]), ...}                     # ours
    {"text": DataNode("text", "  BANANA  "),            # Dask's: the input is data ...
     "pre": Task("pre", clean, TaskRef("text")), ...}   # ... and each node a task on its dependencies

:func:`to_dask_graph` makes the second from the first (validated by the graph module first, so a bad
graph fails before anything runs); :func:`run_dask` runs it; :class:`DaskGraphCluster` runs graphs on
a ``distributed.LocalCluster`` whose scheduler, nannies and workers all listen on 127.0.0.1, and
gives ``submit(inputs) -> Future`` for the package's load generators.

What a task scheduler is not: it has no request queue and no batching.  Every request is its own
graph, and each task of it runs on its own, so a stage's batch function always sees one item; the
throughput that Triton and Ray Serve gain by batching requests is not on offer here.

(The explicit ``DataNode``/``TaskRef`` spec, rather than Dask's older tuple form, matters: in a tuple
graph an input whose *value* is a string equal to some key name would be read as a reference.)
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psutil
from dask.task_spec import DataNode, GraphNode, Task, TaskRef
from dask.typing import Key

from infergraph_lite.core.graph import Graph, InvalidNodeError, Plan
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError, batch_item, prepare_stages
from infergraph_lite.serving.processes import stop_processes

__all__ = ["ENGINE", "DaskGraphCluster", "from_stage", "run_dask", "stage_item", "to_dask_graph"]

ENGINE = "Dask"  # how UnsupportedStageFieldError names this engine



def stage_item(fn: Any, *values: Any) -> Any:
    """Run a stage's batch function on one request: a batch of one item (one value, or a tuple of several).

    >>> stage_item(lambda xs: [x * 2 for x in xs], 21)
    42
    >>> stage_item(lambda pairs: [a + b for a, b in pairs], 1, 2)
    3
    """
    return fn([batch_item(values)])[0]


def from_stage(name: str, stage: Stage) -> Callable[[list[Any]], Sequence[Any]]:
    """What Dask makes of a :class:`~infergraph_lite.core.stage.Stage`: the batch function its task calls.

    Every field is mapped or refused by name, before anything runs:

    - ``fn``: the task calls it on a batch of one item (:func:`stage_item`);
    - ``service_time``: not a setting of a real engine (what the simulator predicts); left unused;
    - ``max_batch_size``: 1 (each request's task runs alone); anything else, ``None`` or an ``AIMD``
      included, is refused: a task scheduler has no batcher;
    - ``max_wait``: 0; a wait is refused (there is no batcher to wait in);
    - ``replicas``: 1; more are refused (tasks run on the cluster's workers, ``n_workers``);
    - ``max_queue_size``: ``None``; a bound is refused (no request queue: ``DaskGraphCluster``'s
      ``max_requests`` bounds the requests in flight instead).

    >>> from_stage("n", Stage(fn=list)) is list
    True
    >>> from_stage("topic", Stage(fn=list, max_batch_size=16))
    Traceback (most recent call last):
    ...
    infergraph_lite.core.stage.UnsupportedStageFieldError: Dask cannot serve stage 'topic' with max_batch_size=16: \
a task scheduler has no batcher: each request's task runs alone, on a batch of one
    """
    if stage.fn is None:
        raise InvalidNodeError(name, "this Stage has no fn (a batch function list -> list) to run")
    if stage.max_batch_size != 1:
        raise UnsupportedStageFieldError(ENGINE, name, "max_batch_size", stage.max_batch_size,
                                         "a task scheduler has no batcher: each request's task runs alone, "
                                         "on a batch of one")
    if stage.max_wait != 0:
        raise UnsupportedStageFieldError(ENGINE, name, "max_wait", stage.max_wait,
                                         "a task scheduler has no batcher to wait in; a task starts when its "
                                         "inputs are ready")
    if stage.replicas != 1:
        raise UnsupportedStageFieldError(ENGINE, name, "replicas", stage.replicas,
                                         "a task runs on whichever worker is free; size the cluster with n_workers")
    if stage.max_queue_size is not None:
        raise UnsupportedStageFieldError(ENGINE, name, "max_queue_size", stage.max_queue_size,
                                         "a task scheduler has no request queue to bound; DaskGraphCluster's "
                                         "max_requests bounds the requests in flight")
    return stage.fn


def _prepare(nodes: Graph, inputs: Iterable[str] | Mapping[str, Any]) -> Plan:
    # The one stage-graph validation (plain functions admitted), then every Stage's fields through from_stage.
    plan = prepare_stages(nodes, inputs, need="fn", functions=True)
    for name, (func, _) in plan.nodes.items():
        if isinstance(func, Stage):
            from_stage(name, func)
    return plan


def to_dask_graph(
    nodes: Graph, inputs: Mapping[str, Any], *, request: int | str | None = None, plan: Plan | None = None
) -> dict[Key, GraphNode]:
    """The graph as a Dask task graph: each input a ``DataNode``, each node a ``Task`` on its dependencies.

    ``nodes`` is the seed's shape (``name -> (func, [deps])``, ``func`` called with one value per
    dependency) or a stage graph (``name -> (Stage(fn=...), [deps])``, ``fn`` called on a batch of
    one).  Keys are the names, or ``(name, request)`` when ``request`` is given, so that many
    requests' graphs can share one scheduler without their keys colliding.  Graph errors are raised
    here, before anything runs.

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> graph = to_dask_graph(banana_nodes(), BANANA_INPUTS)
    >>> sorted(graph)
    ['combine', 'modelA', 'modelB', 'pre', 'text']
    >>> sorted(graph["combine"].dependencies)
    ['modelA', 'modelB']
    >>> to_dask_graph({"a": (len, ["b"]), "b": (len, ["a"])}, {})
    Traceback (most recent call last):
    ...
    infergraph_lite.core.graph.CycleError: cycle: a -> b -> a
    """
    if plan is None:
        plan = _prepare(nodes, inputs)
    plan.check_inputs(inputs)

    def key(name: str) -> Key:
        return name if request is None else (name, request)

    graph: dict[Key, GraphNode] = {key(name): DataNode(key(name), inputs[name]) for name in sorted(plan.inputs)}
    for name in plan.order:
        func, deps = plan.nodes[name]
        refs = [TaskRef(key(d)) for d in deps]
        if isinstance(func, Stage):
            graph[key(name)] = Task(key(name), stage_item, from_stage(name, func), *refs)
        else:
            graph[key(name)] = Task(key(name), func, *refs)
    return graph


def run_dask(nodes: Graph, inputs: Mapping[str, Any], *, client: Any = None) -> dict[str, Any]:
    """Run the graph once with Dask and return the inputs plus every node's value, as ``run_graph`` does.

    Without a ``client``, Dask's threaded scheduler runs it in this process; with a
    ``distributed.Client``, the cluster does.

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> run_dask(banana_nodes(), BANANA_INPUTS)["combine"]
    {'len': 6, 'a_count': 3}
    """
    plan = _prepare(nodes, inputs)
    graph = to_dask_graph(nodes, inputs, plan=plan)
    if client is None:
        from dask.threaded import get

        values = get(graph, list(plan.order))
    else:
        values = client.get(graph, list(plan.order))
    return {**inputs, **dict(zip(plan.order, values))}


class DaskGraphCluster:
    """A ``distributed.LocalCluster`` on 127.0.0.1 that runs one task graph per request; a context manager.

    Scheduler (and its small HTTP server: without bokeh there is no dashboard page), nannies and workers
    listen on 127.0.0.1 only, each on a free port.
    ``submit(inputs)`` builds the request's graph (keys ``(name, request number)``) and returns a
    ``concurrent.futures.Future`` of every node's value; ``max_requests`` graphs are in flight at once.
    On exit the client and cluster are closed and every process the cluster started is waited for by
    PID (and stopped if it lingers).

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> with DaskGraphCluster(banana_nodes(), inputs=["text"], n_workers=1) as cluster:  # doctest: +SKIP
    ...     cluster.submit(BANANA_INPUTS).result()["combine"]
    {'len': 6, 'a_count': 3}
    """

    def __init__(
        self,
        nodes: Graph,
        inputs: Iterable[str] = ("request",),
        *,
        n_workers: int = 2,
        threads_per_worker: int = 1,
        processes: bool = True,
        max_requests: int = 16,
    ):
        self.nodes = nodes
        self.plan = _prepare(nodes, inputs)
        self.n_workers, self.threads_per_worker, self.processes = n_workers, threads_per_worker, processes
        self.max_requests = max_requests
        self.cluster: Any = None
        self.client: Any = None
        self.timings: dict[str, float] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._counter = itertools.count()
        self._before: set[int] = set()

    def start(self) -> DaskGraphCluster:
        """Start the cluster (scheduler, ``n_workers`` workers) on 127.0.0.1 and connect a client."""
        from distributed import Client, LocalCluster

        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        started = time.perf_counter()
        try:
            self.cluster = LocalCluster(host="127.0.0.1", n_workers=self.n_workers,
                                        threads_per_worker=self.threads_per_worker, processes=self.processes,
                                        dashboard_address="127.0.0.1:0", silence_logs=40)
            self.client = Client(self.cluster)
        except BaseException:
            self.close()
            raise
        self.timings["start"] = time.perf_counter() - started
        self._pool = concurrent.futures.ThreadPoolExecutor(self.max_requests, thread_name_prefix="dask-request")
        return self

    def started_pids(self) -> list[int]:
        """The PIDs of the processes the cluster started that are still alive.

        Python's multiprocessing *resource tracker*, which the first spawned worker starts and which
        lives as long as this interpreter (it cleans up what crashed children leak), is not counted:
        it is not the cluster's, and it exits with this process.
        """
        return [p.pid for p in psutil.Process().children(recursive=True)
                if p.pid not in self._before and not _is_resource_tracker(p)]

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run one request's graph on the cluster and return every node's value."""
        if self.client is None:
            raise RuntimeError("not started: use `with DaskGraphCluster(...) as cluster:` or call .start()")
        request = next(self._counter)
        graph = to_dask_graph(self.nodes, inputs, request=request, plan=self.plan)
        values = self.client.get(graph, [(name, request) for name in self.plan.order])
        return dict(zip(self.plan.order, values))

    def submit(self, inputs: Mapping[str, Any]) -> concurrent.futures.Future:
        """Send one request (one graph); the future gives every node's value."""
        self.plan.check_inputs(inputs)
        if self._pool is None:
            raise RuntimeError("not started: use `with DaskGraphCluster(...) as cluster:` or call .start()")
        return self._pool.submit(self.run, inputs)

    def close(self) -> list[int]:
        """Close the client and the cluster, then wait for their processes by PID.

        Returns the PIDs that had to be stopped (none, normally).
        """
        pids = self.started_pids() if self._before or self.cluster is not None else []
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        return stop_processes(pids)

    def __enter__(self) -> DaskGraphCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _is_resource_tracker(process: psutil.Process) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False
