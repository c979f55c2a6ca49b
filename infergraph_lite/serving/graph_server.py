"""GraphServer: a real dynamic batcher per stage of a graph (notebook 06).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.execute import NodeError
from infergraph_lite.core.graph import Countdown, InvalidNodeError
from infergraph_lite.core.stage import Stage, batch_item, prepare_stages
from infergraph_lite.serving.batcher import BatchError, DynamicBatcher, QueueFullError
from infergraph_lite.serving.metrics import BatchRecord, RequestRecord, StageTimes, stage_times
from infergraph_lite.serving.stage_workers import StageWorkers

__all__ = ["ENGINE", "WORKERS", "GraphRequestRecord", "GraphServer", "from_stage"]

WORKERS = ("threads", "processes")  # where a stage's replicas run

ENGINE = "GraphServer"  # how UnsupportedStageFieldError would name this engine (it honours every field)


def from_stage(name: str, stage: Stage) -> dict[str, Any]:
    """The :class:`~infergraph_lite.serving.batcher.DynamicBatcher` settings of a stage: GraphServer honours
    every :class:`~infergraph_lite.core.stage.Stage` field, so it refuses none.

    ``fn`` is the batch function, ``max_batch_size`` (an int, ``None`` for no cap, or an ``AIMD``) and
    ``max_wait`` (seconds) the batching policy, ``replicas`` the worker threads sharing the stage's queue,
    ``max_queue_size`` the queue's bound.  ``service_time`` is what the simulator predicts, not a
    setting: a real server takes the time its ``fn`` takes.  A Stage without ``fn`` has nothing to serve.

    >>> settings = from_stage("topic", Stage(fn=list, max_batch_size=16, max_wait=0.002, replicas=2))
    >>> {k: v for k, v in settings.items() if k != "batch_fn"}
    {'max_batch_size': 16, 'max_wait': 0.002, 'max_queue_size': None, 'replicas': 2}
    """
    if stage.fn is None:
        raise InvalidNodeError(name, "this Stage has no fn (a batch function list -> list) to serve")
    return {"batch_fn": stage.fn, "max_batch_size": stage.max_batch_size, "max_wait": stage.max_wait,
            "max_queue_size": stage.max_queue_size, "replicas": stage.replicas}


@dataclass(frozen=True)
class GraphRequestRecord:
    """One request through a :class:`GraphServer`: its submit number and when it entered and left (clock seconds)."""

    number: int
    submitted: float
    finished: float

    @property
    def latency(self) -> float:
        """End to end: submitted until its last stage finished."""
        return self.finished - self.submitted


class _Job:
    # One request's state while it flows through the graph; touched under GraphServer._lock.
    __slots__ = ("countdown", "failed", "future", "inputs", "number", "submitted", "values")

    def __init__(self, number: int, inputs: Mapping[str, Any], countdown: Countdown, submitted: float):
        self.number = number
        self.inputs = inputs
        self.values: dict[str, Any] = {}
        self.countdown = countdown  # which stages the request enters as others finish for it
        self.future: Future = Future()
        self.future.set_running_or_notify_cancel()  # a request in a graph cannot be taken back halfway
        self.submitted = submitted
        self.failed = False


class GraphServer:
    """Serve a stage graph for real: a :class:`DynamicBatcher` per stage, requests flowing along the edges.

    ``stages`` is the graph shape of notebook 06, ``{name: (Stage(fn=...), [deps])}``,
    read with ``inputs`` (the input names; default ``("request",)``, as
    :func:`~infergraph_lite.core.stage.prepare_stages`).  The whole graph is
    validated before any thread starts (cycles, missing dependencies, a stage
    without ``fn``).  Each stage gets its own batcher with the stage's
    :class:`~infergraph_lite.core.policy.BatchPolicy` (``max_batch_size``,
    ``max_wait`` in seconds), ``replicas`` worker threads and
    ``max_queue_size`` (every field is honoured: see :func:`from_stage`).  A
    stage's ``fn`` receives, per request, the value of its one dependency,
    or a tuple of its dependencies' values in the order listed
    (:func:`~infergraph_lite.core.stage.batch_item`).

    :meth:`submit` returns a :class:`~concurrent.futures.Future` of the
    request's answer: a dict of *every* stage's result, in the graph's
    topological order (``run_graph``'s answer without the inputs).  A request
    enters a stage when all its dependencies have finished for it (the join
    counts down per request); the completing batcher's worker submits it, so
    there is no scheduler thread.  Failures resolve the future, never leave it
    hanging:

    - a batch whose ``fn`` raises fails exactly that batch's requests, each
      with a :class:`~infergraph_lite.core.execute.NodeError` naming the stage
      (``__cause__`` is what ``fn`` raised); other requests go on;
    - a stage whose queue is full refuses the request: its future fails with
      :class:`QueueFullError` (``.stage`` names the stage), at once if the
      first stage refuses it; the parts of the request already in other
      stages finish and are dropped.

    ``workers="threads"`` (the default) runs every stage's replicas as threads
    of this process: they share one interpreter lock, so pure-Python stages
    take turns.  ``workers="processes"`` runs each replica's ``fn`` in a worker
    process of its own (:mod:`~infergraph_lite.serving.stage_workers`: spawned,
    so each ``fn`` must be importable by name — a lambda or a function defined
    in a notebook is refused by name before anything starts); the batching stays
    here, in the stage's one :class:`DynamicBatcher`.  A worker that dies fails
    its batch's requests with a ``NodeError`` naming the stage, whose cause
    (:class:`~infergraph_lite.serving.stage_workers.WorkerDiedError`) names
    the PID and quotes the last line of its stderr, and is replaced; if the replacement cannot start, the stage's
    later batches fail the same way at once.

    :meth:`close` (or leaving a ``with`` block) refuses new requests, serves
    every request already inside to the end, and joins every thread (and stops
    every worker process by its PID).  Records:
    :attr:`records` (one :class:`GraphRequestRecord` per answered request),
    :meth:`stage_records` (each stage's per-request queue / compute time and
    batch size) and :meth:`stage_times` (their means, as perf_analyzer
    reports them; the load generators of :mod:`~infergraph_lite.loadtest` put
    them in their :class:`~infergraph_lite.serving.loadtest.LoadReport`).

    >>> from infergraph_lite.core.stage import Stage
    >>> stages = {
    ...     "pre": (Stage(fn=lambda xs: [x.strip().lower() for x in xs], max_batch_size=8), ["text"]),
    ...     "n": (Stage(fn=lambda xs: [len(x) for x in xs]), ["pre"]),
    ...     "a": (Stage(fn=lambda xs: [x.count("a") for x in xs]), ["pre"]),
    ...     "combine": (Stage(fn=lambda pairs: [{"len": n, "a_count": a} for n, a in pairs]), ["n", "a"]),
    ... }
    >>> with GraphServer(stages, inputs=["text"]) as server:
    ...     futures = [server.submit({"text": t}) for t in ["  BANANA  ", "papaya"]]
    ...     answers = [f.result() for f in futures]
    >>> answers[0]
    {'pre': 'banana', 'n': 6, 'a': 3, 'combine': {'len': 6, 'a_count': 3}}
    >>> answers[1]["combine"], len(server.records)
    ({'len': 6, 'a_count': 3}, 2)
    """

    def __init__(
        self,
        stages: Mapping[str, tuple[Any, Sequence[str]]],
        inputs: Iterable[str] = ("request",),
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "graph-server",
        workers: str = "threads",
    ):
        if workers not in WORKERS:
            raise ValueError(f"workers must be one of {WORKERS}, got {workers!r}")
        plan = prepare_stages(stages, inputs, need="fn")  # raises before any thread starts
        self.plan = plan
        self.workers = workers
        self.name = name
        self._now = clock
        self._order = tuple(plan.order)
        self._args = {n: tuple(plan.nodes[n][1]) for n in self._order}
        self._lock = threading.Lock()   # requests' state and the records; held briefly, by workers too
        self._admit = threading.Lock()  # admission: submit() against close(); never taken by a worker
        self._closed = False
        self._submitted = 0
        self._records: list[tuple[int, float, float]] = []
        self._failed = 0
        self.batchers: dict[str, DynamicBatcher] = {}
        self.stage_workers: dict[str, StageWorkers] = {}  # workers="processes": each stage's worker processes
        settings = {n: from_stage(n, plan.nodes[n][0]) for n in self._order}  # every stage's, before any thread
        try:
            if workers == "processes":
                # Every fn checked (pickles, importable) before any process starts; then all start at once.
                pools = {n: StageWorkers(n, settings[n]["batch_fn"], settings[n]["replicas"], start=False)
                         for n in self._order}
                self.stage_workers = pools
                launched = {n: pool.launch() for n, pool in pools.items()}
                for n, pool in pools.items():
                    pool.wait_ready(launched[n])
                    settings[n]["batch_fn"] = pool
            for stage_name in self._order:
                self.batchers[stage_name] = DynamicBatcher(**settings[stage_name], clock=clock,
                                                           name=f"{name}:{stage_name}")
        except BaseException:
            self._closed = True
            for batcher in self.batchers.values():
                batcher.close()
            for pool in self.stage_workers.values():
                pool.close(timeout=1.0)
            raise

    def __repr__(self) -> str:
        state = "closed" if self._closed else "serving"
        pids = sum(len(p) for p in self.worker_pids.values())
        where = f", {pids} worker processes" if self.workers == "processes" else ""
        return f"GraphServer({len(self._order)} stages, {self.threads} threads{where}, {state})"

    @property
    def worker_pids(self) -> dict[str, list[int]]:
        """Per stage, the PIDs of its living worker processes (empty with ``workers="threads"``)."""
        return {name: pool.pids for name, pool in self.stage_workers.items()}

    @property
    def threads(self) -> int:
        """How many worker threads serve the graph (the stages' replicas, summed)."""
        return sum(b.replicas for b in self.batchers.values())

    @property
    def records(self) -> list[GraphRequestRecord]:
        """One :class:`GraphRequestRecord` per request answered so far, in the order they finished."""
        with self._lock:
            return [GraphRequestRecord(*raw) for raw in self._records]

    @property
    def failed(self) -> int:
        """How many requests failed (a stage's batch raised, or a stage's queue refused them)."""
        with self._lock:
            return self._failed

    def latencies(self) -> np.ndarray:
        """End-to-end latency (seconds) of every request answered so far, in the order they finished."""
        with self._lock:
            return np.asarray([finished - submitted for _, submitted, finished in self._records])

    def stage_records(self) -> dict[str, list[RequestRecord]]:
        """Per stage, one :class:`RequestRecord` (queue time, compute time, batch size) per request it served."""
        return {name: batcher.records for name, batcher in self.batchers.items()}

    def stage_times(self) -> dict[str, StageTimes]:
        """Per stage, the mean queue and compute time per request and the mean batch size (per batch),
        over every request served so far (:class:`~infergraph_lite.serving.metrics.StageTimes`)."""
        return stage_times(self.stage_records())

    def batch_marks(self) -> dict[str, int]:
        """How many batches each stage has run so far: a mark to give :meth:`work_per_request` as ``since``."""
        return {name: len(batcher.batches) for name, batcher in self.batchers.items()}

    def batches_since(self, since: Mapping[str, int] | None = None) -> dict[str, list[BatchRecord]]:
        """Per stage, the batches it has run since ``since`` (a :meth:`batch_marks`; default: every batch so far).

        Take the mark while no batch is running: batches are recorded in the order they started, so with several
        replicas a mark taken mid-batch can misplace one.  A mark that names a stage this server does not have, or
        a count the stage has not reached, is refused by name.

        >>> from infergraph_lite.core.stage import Stage
        >>> with GraphServer({"a": (Stage(fn=lambda xs: xs), ["request"])}) as server:
        ...     _ = server.submit({"request": 0}).result()
        ...     mark = server.batch_marks()
        ...     _ = server.submit({"request": 1}).result()
        >>> [b.size for b in server.batches_since(mark)["a"]], len(server.batches_since()["a"])
        ([1], 2)
        """
        since = since or {}
        unknown = sorted(set(since) - set(self.batchers))
        if unknown:
            raise ValueError(f"since names stages this server does not have: {unknown}")
        for name, mark in since.items():
            ran = len(self.batchers[name].batches)
            if not isinstance(mark, int) or not 0 <= mark <= ran:
                raise ValueError(f"since[{name!r}] must be a batch count from 0 to the {ran} stage {name!r} has run, "
                                 f"got {mark!r}")
        return {name: batcher.batches[since.get(name, 0):] for name, batcher in self.batchers.items()}

    def work_per_request(self, since: Mapping[str, int] | None = None) -> dict[str, float]:
        """Per stage, the CPU seconds its function used per request, over its batches since ``since``.

        ``since`` is a :meth:`batch_marks` taken earlier, while no batch was running (see :meth:`batches_since`);
        default: every batch so far.  Each batch's ``work`` is timed where the function ran (this process's thread,
        or the worker process).  Their sum over the stages is a request's work through the graph: with
        ``workers="threads"`` and stages whose work holds the interpreter lock (pure Python, not numpy or a sleep),
        one process serves at most ``1 / sum`` requests per second.  A stage with no batch in the window is NaN.

        >>> from infergraph_lite.core.stage import Stage
        >>> stages = {"a": (Stage(fn=lambda xs: [sum(range(20_000)) for _ in xs]), ["request"])}
        >>> with GraphServer(stages) as server:
        ...     _ = server.submit({"request": 0}).result()
        ...     mark = server.batch_marks()
        ...     _ = [f.result() for f in [server.submit({"request": i}) for i in range(4)]]
        >>> mark, server.work_per_request(mark)["a"] > 0
        ({'a': 1}, True)
        """
        work = {}
        for name, batches in self.batches_since(since).items():
            served = sum(b.size for b in batches)
            work[name] = sum(b.work for b in batches) / served if served else math.nan
        return work

    def submit(self, inputs: Mapping[str, Any]) -> Future:
        """Send one request (a dict with every input the graph reads) into the graph.

        Returns a Future of ``{stage: result}`` for every stage.  Raises
        :class:`~infergraph_lite.core.graph.MissingInputError` at once if an input
        is missing, and ``RuntimeError`` after :meth:`close`; a refusal by a
        full stage queue comes back in the future (see the class docstring).
        """
        self.plan.check_inputs(inputs)
        with self._admit:
            if self._closed:
                raise RuntimeError(f"submit() after close(): {self.name} no longer accepts requests")
            job = _Job(self._submitted, inputs, Countdown(self.plan), self._now())
            self._submitted += 1
            if not self._order:  # a graph without stages answers at once
                with self._lock:
                    self._records.append((job.number, job.submitted, job.submitted))
                job.future.set_result({})
            # Under the lock, so close() cannot shut an entry stage between the check above and the submit.
            for stage_name in job.countdown.first():
                if job.failed:
                    break
                self._enter(job, stage_name)
        return job.future

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new requests, finish every request already inside, join every worker thread, stop every
        worker process by its PID.

        Stages close in topological order: when a stage's workers have stopped,
        every request it will ever hand on has been handed on, so the next stage
        can drain in turn.  ``timeout`` (seconds; None: as long as the batches
        take) bounds the draining: what is still unanswered then fails with a
        ``BatchError`` (see :meth:`DynamicBatcher.close`), and the worker
        processes get a few more seconds to exit before they are stopped by
        signal (:func:`~infergraph_lite.serving.processes.stop_processes`).
        """
        with self._admit:
            self._closed = True
        deadline = None if timeout is None else time.monotonic() + timeout
        for stage_name in self._order:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            self.batchers[stage_name].close(left)
        for pool in self.stage_workers.values():
            pool.close(timeout=1.0)

    def __enter__(self) -> GraphServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _enter(self, job: _Job, stage_name: str) -> None:
        # Hand one request to one stage: its item is made of its dependencies' values (see batch_item).
        values, inputs = job.values, job.inputs
        arg = batch_item([values[name] if name in values else inputs[name] for name in self._args[stage_name]])
        try:
            future = self.batchers[stage_name].submit(arg)
        except QueueFullError as exc:
            refusal = QueueFullError(f"{self.name}: stage {stage_name!r} refused the request: {exc}", stage=stage_name)
            refusal.__cause__ = exc
            self._fail(job, refusal)
            return
        except Exception as exc:  # noqa: BLE001 - whatever happens, the request's future is told
            self._fail(job, exc)
            return
        future.add_done_callback(functools.partial(self._done, job, stage_name))

    def _done(self, job: _Job, stage_name: str, done: Future) -> None:
        # Runs on the stage's worker thread once the request's batch finished: count down, hand on, or answer.
        try:
            error = done.exception()
            if error is not None:
                cause = error.__cause__ if isinstance(error, BatchError) and error.__cause__ is not None else error
                failure = NodeError(stage_name, cause)
                failure.__cause__ = cause
                self._fail(job, failure)
                return
            with self._lock:
                if job.failed:
                    return
                job.values[stage_name] = done.result()
                ready = job.countdown.done(stage_name)
                finished = job.countdown.left == 0
                if finished:
                    self._records.append((job.number, job.submitted, self._now()))
            if finished:
                values = job.values
                job.future.set_result({name: values[name] for name in self._order})
                return
            for child in ready:
                self._enter(job, child)
        except BaseException as exc:  # noqa: BLE001 - a bug here must not leave the request hanging
            self._fail(job, exc)

    def _fail(self, job: _Job, error: BaseException) -> None:
        # The first failure of a request answers it; later ones (other branches) are dropped.
        with self._lock:
            if job.failed:
                return
            job.failed = True
            self._failed += 1
        job.future.set_exception(error)
