"""A local Dask cluster on 127.0.0.1 that serves a graph, one task graph per request; stopped by PID (notebook 07).

:class:`DaskGraphCluster` is the lifecycle (start, ``submit(inputs) -> Future``, ``close(timeout)``, the PIDs it
owns); the task graph each request becomes is :func:`~infergraph_lite.frameworks.dask.graph.to_dask_graph`'s.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

from infergraph_lite.core.arguments import check_non_negative_int, check_number
from infergraph_lite.core.execute import NodeError
from infergraph_lite.core.graph import Graph
from infergraph_lite.frameworks.dask.graph import to_dask_graph
from infergraph_lite.frameworks.dask.options import ENGINE, prepare
from infergraph_lite.serving.processes import living, owned_processes, stop_processes, within

__all__ = ["DaskGraphCluster"]

DEATH_WAIT = 1.0  # seconds a failed request waits for the nanny's line on the worker process that died


class _WorkerDeaths(logging.Handler):
    """The lines in which Dask's nannies (in this process) report a worker process's end, by PID.

    A nanny logs ``"Worker process 123 was killed by signal 9"`` at INFO, which a cluster with silenced logs
    never shows; kept here, they name the process and say how it ended when a request fails with ``KilledWorker``
    or the cluster cannot start.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        found = re.match(r"Worker process (\d+) ", line)
        if found:
            self.lines[int(found.group(1))] = line

    def line(self, pid: int, wait: float) -> str:
        """The line on process ``pid``, waiting up to ``wait`` s: the scheduler may tell of the death first."""
        deadline = time.monotonic() + wait
        while pid not in self.lines and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.lines.get(pid, "")


class DaskGraphCluster:
    """A ``distributed.LocalCluster`` on 127.0.0.1 that runs one task graph per request; a context manager.

    Scheduler (and its small HTTP server: without bokeh there is no dashboard page), nannies and workers
    listen on 127.0.0.1 only, each on a free port.
    ``submit(inputs) -> Future`` builds the request's graph (keys ``(name, request number)``) and returns a
    ``concurrent.futures.Future`` of every node's value, or a ``NodeError`` naming the first node (in
    topological order) that failed; ``max_requests`` graphs are in flight at once.  A worker that dies
    while running a task is restarted by its nanny and the task retried, ``allowed_failures`` times
    (``None``: Dask's setting, 3); then the request fails with Dask's ``KilledWorker``, named by node, its
    message ending with the nanny's line on the process (``Worker process 123 was killed by signal 9``); a
    worker that dies while the cluster starts is named the same way.  A request not answered within
    ``request_timeout`` seconds fails with a ``NodeError`` naming the first node still running (cause:
    ``TimeoutError``).
    ``close(timeout)`` cancels what has not started, closes the client (which ends the requests in flight,
    with an error) and the cluster, and stops, by PID, the processes this cluster owns: its workers (each
    nanny's process) and their descendants -- never another server's.

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
        allowed_failures: int | None = None,
        request_timeout: float = 120.0,
    ):
        self.nodes = nodes
        self.plan = prepare(nodes, inputs)
        self.n_workers, self.threads_per_worker, self.processes = n_workers, threads_per_worker, processes
        self.max_requests = max_requests
        # None keeps Dask's own setting
        self.allowed_failures = (None if allowed_failures is None
                                 else check_non_negative_int("allowed_failures", allowed_failures))
        self.request_timeout = check_number("request_timeout", request_timeout)
        self.cluster: Any = None
        self.client: Any = None
        self._deaths: _WorkerDeaths | None = None  # the nannies' lines on worker processes that ended
        self.timings: dict[str, float] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: set[concurrent.futures.Future] = set()  # requests submitted and not yet answered
        self._counter = itertools.count()
        self._owned: dict[int, None] = {}  # every worker process (and descendant) this cluster has had

    def start(self) -> DaskGraphCluster:
        """Start the cluster (scheduler, ``n_workers`` workers) on 127.0.0.1 and connect a client."""
        import dask
        from distributed import Client, LocalCluster

        started = time.perf_counter()
        settings = ({} if self.allowed_failures is None
                    else {"distributed.scheduler.allowed-failures": self.allowed_failures})
        self._deaths = _WorkerDeaths()
        logging.getLogger("distributed.nanny").addHandler(self._deaths)
        try:
            with dask.config.set(settings):  # the scheduler reads it when it is made
                self.cluster = LocalCluster(host="127.0.0.1", n_workers=self.n_workers,
                                            threads_per_worker=self.threads_per_worker, processes=self.processes,
                                            dashboard_address="127.0.0.1:0", silence_logs=40)
            self.client = Client(self.cluster)
            self.started_pids()  # record the workers now
        except BaseException as error:
            said = "; ".join(self._deaths.lines.values())  # a worker that died while starting: which, and how
            self.close()
            if said and isinstance(error, Exception):
                raise RuntimeError(f"{ENGINE} cluster did not start: {error} ({said})") from error
            raise
        self.timings["start"] = time.perf_counter() - started
        self._pool = concurrent.futures.ThreadPoolExecutor(self.max_requests, thread_name_prefix="dask-request")
        return self

    def _worker_pids(self) -> list[int]:
        # Each nanny (in this process) records the PID of the worker process it runs; a restarted worker is
        # a new PID, so this is read again whenever the processes are counted.
        if self.cluster is None:
            return []
        return [pid for nanny in list(self.cluster.workers.values()) if (pid := getattr(nanny, "pid", None))]

    def started_pids(self) -> list[int]:
        """The PIDs of this cluster's processes that are still alive: its workers and their descendants.

        Found from the cluster's own record (each nanny's worker PID), never as "every child of this
        interpreter": another cluster or server in this process is not counted, and neither is Python's
        multiprocessing *resource tracker* (it belongs to this interpreter and exits with it).
        """
        for pid in owned_processes(self._worker_pids()):
            self._owned.setdefault(pid)
        return [pid for pid in living(self._owned) if not _is_resource_tracker(pid)]

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run one request's graph on the cluster and return every node's value.

        A failure is raised as a ``NodeError`` naming the first node, in topological order, whose task erred
        (a node's dependents err with it).
        """
        from distributed import wait

        if self.client is None:
            raise RuntimeError("not started: use `with DaskGraphCluster(...) as cluster:` or call .start()")
        request = next(self._counter)
        graph = to_dask_graph(self.nodes, inputs, request=request, plan=self.plan)
        futures = self.client.get(graph, [(name, request) for name in self.plan.order], sync=False)
        try:
            try:
                wait(futures, timeout=self.request_timeout)
            except TimeoutError as late:
                name = next(n for n, f in zip(self.plan.order, futures) if not f.done())
                raise NodeError(name, TimeoutError(f"request {request} was not answered within request_timeout="
                                                   f"{self.request_timeout:g} s")) from late
            for name, future in zip(self.plan.order, futures):
                if future.status == "error":
                    error = future.exception()
                    raise self._node_error(name, error) from error
            return dict(zip(self.plan.order, self.client.gather(futures)))
        finally:
            for future in futures:
                future.release()

    def _node_error(self, name: str, error: BaseException) -> NodeError:
        # A KilledWorker names the worker that died last (a WorkerState, with its PID): add the nanny's line on
        # that process, so the failure says which process it was and how it ended.
        failure = NodeError(name, error)
        pid = getattr(getattr(error, "last_worker", None), "pid", None)
        if pid and self._deaths is not None:
            said = self._deaths.line(pid, DEATH_WAIT) or f"worker process {pid} died"
            failure.args = (f"{failure} ({said})",)
        return failure

    def submit(self, inputs: Mapping[str, Any]) -> concurrent.futures.Future:
        """Send one request (one graph); the future gives every node's value, or a NodeError naming the node."""
        self.plan.check_inputs(inputs)
        if self._pool is None:
            raise RuntimeError("not started: use `with DaskGraphCluster(...) as cluster:` or call .start()")
        future = self._pool.submit(self.run, inputs)
        self._in_flight.add(future)
        future.add_done_callback(self._in_flight.discard)
        return future

    def close(self, timeout: float = 30.0) -> list[int]:
        """Close the client and the cluster and stop this cluster's processes by PID; returns within ``timeout`` s.

        In this order: requests not yet started are cancelled; the client is closed, which ends every
        request in flight (its future raises); the cluster is closed; the request threads are joined; then
        every process the cluster owns that is still alive is stopped (SIGTERM, SIGKILL by PID).  Returns the
        PIDs that had to be stopped (none, normally).  Safe to call twice, and after a failed start.
        """
        deadline = time.monotonic() + timeout
        pids = self.started_pids()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)  # not wait: the threads in flight need the client closed
        client, cluster, self.client, self.cluster = self.client, self.cluster, None, None

        def shut_down() -> None:
            # The client first: a request thread blocked in wait() on it returns (with an error) when it closes.
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close(timeout=max(deadline - time.monotonic(), 1.0) / 2)
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.close(timeout=max(deadline - time.monotonic(), 1.0) / 2)

        closer = threading.Thread(target=shut_down, name="dask-graph-close", daemon=True)
        closer.start()
        closer.join(timeout=max(0.6 * (deadline - time.monotonic()), 0.0))
        deaths, self._deaths = self._deaths, None
        if deaths is not None:
            logging.getLogger("distributed.nanny").removeHandler(deaths)
        if pool is not None:  # the requests' threads end with their requests, which the closed client ended
            concurrent.futures.wait(list(self._in_flight), timeout=max(0.7 * (deadline - time.monotonic()), 0.0))
        return stop_processes(pids, **within(deadline - time.monotonic()))

    def statistics(self) -> dict[str, Any]:
        """What the :class:`~infergraph_lite.frameworks.engine.Engine` protocol asks for: the start's ``timings``,
        the requests in flight and the living worker processes (a task scheduler forms no batches to count)."""
        return {"timings": dict(self.timings), "in_flight": len(self._in_flight), "workers": len(self._worker_pids())}

    def __enter__(self) -> DaskGraphCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _is_resource_tracker(pid: int) -> bool:
    try:
        return "multiprocessing.resource_tracker" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
