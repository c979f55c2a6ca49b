"""A real dynamic batcher on threads, running the package's one batching policy.

:class:`DynamicBatcher` collects single requests into batches for a batch
function.  When a batch starts and how many it takes is decided by
:class:`~infergraph_lite.core.policy.BatchPolicy` — the same object
:func:`~infergraph_lite.simulation.queue.simulate_batching` calls — on the batcher's
clock, so the real batcher and the simulation form the same batches from the
same arrivals (a property test drives it on a virtual clock to check).

Introduced in notebook 05.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.serving.metrics import BatchRecord, RequestRecord

__all__ = ["BatchError", "Clock", "DynamicBatcher", "QueueFullError", "QueueTimeoutError", "RequestRefusedError",
           "SystemClock", "is_refusal"]


class BatchError(RuntimeError):
    """The batch a request was in failed; ``__cause__`` holds what ``batch_fn`` raised, if it raised."""


class RequestRefusedError(RuntimeError):
    """The server shed this request instead of answering it (overload), as opposed to failing while serving it.

    ``.stage`` names the stage that refused it (None for a lone batcher).  The load generators count these as
    refused, not failed (:func:`is_refusal`); a framework's own refusal (Triton's "Exceeds maximum queue
    size", Ray Serve's ``BackPressureError``) reaches the caller as one of these, the framework's error its
    ``__cause__``.
    """

    def __init__(self, message: str, stage: str | None = None):
        super().__init__(message)
        self.stage = stage


class QueueFullError(RequestRefusedError):
    """``submit`` found ``max_queue_size`` requests already waiting: shed load instead of queueing forever."""


class QueueTimeoutError(RequestRefusedError):
    """The request was still waiting ``queue_timeout`` after it was submitted, so it was dropped before any batch
    ran it (Triton's ``default_timeout_microseconds`` with ``timeout_action: REJECT``)."""


def is_refusal(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from, is a :class:`RequestRefusedError` (load shed).

    >>> try:
    ...     raise KeyError("wrapped") from QueueFullError("full")
    ... except KeyError as err:
    ...     is_refusal(err), is_refusal(ValueError("a bug"))
    (True, False)
    """
    seen = 0
    while error is not None and seen < 20:  # a cause chain is short; a cycle would not be
        if isinstance(error, RequestRefusedError):
            return True
        error, seen = error.__cause__, seen + 1
    return False


class Clock(Protocol):
    """What the batcher needs of time: read it, and wait on a condition for at most ``timeout``."""

    def now(self) -> float: ...

    def wait(self, condition: threading.Condition, timeout: float | None) -> None: ...


class SystemClock:
    """Real time: ``now`` is a monotonic clock; ``wait`` is the condition's own timed wait."""

    def __init__(self, now: Callable[[], float] = time.monotonic):
        self.now = now

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        condition.wait(timeout)


@dataclass(slots=True)
class _Pending:
    number: int
    item: Any
    future: Future
    submitted: float


class DynamicBatcher:
    """Collect single requests into batches for ``batch_fn(list) -> list``, on background threads.

    ``max_batch_size`` (an int, None or an :class:`~infergraph_lite.core.policy.AIMD`)
    and ``max_wait`` (seconds) are the :class:`~infergraph_lite.core.policy.BatchPolicy`, whose ``window``
    says when the wait starts: from the oldest request's arrival (Triton's rule, the default) or from when
    a free worker picks the batch's first request (``"first_pick"``, Ray Serve's ``@serve.batch``);
    ``replicas`` worker threads share the queue, as model instances share
    Triton's; ``max_queue_size`` bounds the waiting requests (a full queue
    refuses new ones with :class:`QueueFullError`); a request still waiting
    ``queue_timeout`` seconds after its submit fails with
    :class:`QueueTimeoutError` before any batch runs it (Triton's
    ``default_timeout_microseconds``, ``timeout_action: REJECT``), and no
    longer holds a place in the queue.  ``clock`` is a callable
    returning seconds (default ``time.monotonic``) or a :class:`Clock`; a
    virtual one makes the batcher's decisions reproducible in tests.
    Every batch's record carries ``work``: the CPU seconds ``batch_fn`` used, timed with ``time.thread_time``
    in the batcher's thread, or, when ``batch_fn`` has a ``last_work()`` method (a
    :class:`~infergraph_lite.serving.stage_workers.StageWorkers`, whose work runs in a worker process), what
    that reports.  ``service_time - work`` is what a batch waited for besides computing.

    >>> with DynamicBatcher(lambda xs: [x * 2 for x in xs], max_batch_size=4, max_wait=0.01) as batcher:
    ...     futures = [batcher.submit(i) for i in range(6)]
    ...     [f.result() for f in futures]
    [0, 2, 4, 6, 8, 10]
    >>> len(batcher.records), sum(b.size for b in batcher.batches), all(b.work >= 0 for b in batcher.batches)
    (6, 6, True)
    """

    def __init__(
        self,
        batch_fn: Callable[[list[Any]], Sequence[Any]],
        max_batch_size: int | AIMD | None = 1,
        max_wait: float = 0.0,
        max_queue_size: int | None = None,
        *,
        replicas: int = 1,
        clock: Clock | Callable[[], float] = time.monotonic,
        name: str = "dynamic-batcher",
        queue_timeout: float | None = None,
        window: str = "oldest_request",
    ):
        if not callable(batch_fn):
            raise ValueError(f"batch_fn must be callable, got {batch_fn!r}")
        self.policy = BatchPolicy(max_batch_size, max_wait, window)
        self.max_queue_size = check_count("max_queue_size", max_queue_size, allow_none=True)
        self.queue_timeout = None if queue_timeout is None else check_number("queue_timeout", queue_timeout,
                                                                              positive=False)
        self.replicas = check_count("replicas", replicas) or 1
        if isinstance(clock, SystemClock) or (hasattr(clock, "now") and hasattr(clock, "wait")):
            self.clock: Clock = clock
        elif callable(clock):
            self.clock = SystemClock(clock)
        else:
            raise ValueError(f"clock must be a callable returning seconds or a Clock, got {clock!r}")
        self.batch_fn = batch_fn
        # A batch_fn that runs its work in another process (StageWorkers) reports that work's CPU seconds
        last_work = getattr(batch_fn, "last_work", None)
        self._work_elsewhere: Callable[[], float] | None = last_work if callable(last_work) else None
        self.name = name
        self._records: list[tuple[float, float, int, float]] = []  # raw, cheap to append on the worker's hot path
        self._batches: list[BatchRecord] = []
        self._queue: deque[_Pending] = deque()
        self._running: dict[int, _Pending] = {}  # taken by a worker, not yet answered (close() may answer them)
        self._broken: BaseException | None = None  # set if a worker thread itself died
        self._cond = threading.Condition()
        self._closed = False
        self._submitted = 0
        self._workers = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
                         for i in range(self.replicas)]
        for worker in self._workers:
            worker.start()

    @property
    def max_batch_size(self) -> int | None:
        """The current cap (an AIMD's moves while it runs)."""
        return self.policy.cap

    @property
    def max_wait(self) -> float:
        return self.policy.max_wait

    @property
    def records(self) -> list[RequestRecord]:
        """One :class:`RequestRecord` per request served so far, in the order batches finished."""
        with self._cond:
            return [RequestRecord(*raw) for raw in self._records]

    @property
    def batches(self) -> list[BatchRecord]:
        """One :class:`BatchRecord` per batch started so far, in the order they started."""
        with self._cond:
            return sorted(self._batches, key=lambda b: (b.start, b.first))

    def queued(self) -> int:
        """How many requests are waiting for a batch right now."""
        with self._cond:
            return len(self._queue)

    def submit(self, item: Any) -> Future:
        """Queue one request; its :class:`~concurrent.futures.Future` resolves to its result."""
        with self._cond:
            if self._closed:
                raise RuntimeError(f"submit() after close(): {self.name} no longer accepts requests")
            if self._broken is not None:
                raise BatchError(f"{self.name}: a worker thread died ({type(self._broken).__name__}: "
                                 f"{self._broken}); the batcher accepts no more requests")
            expired = self._expired(self.clock.now())  # a request past its deadline no longer holds a place
            if self.max_queue_size is not None and len(self._queue) >= self.max_queue_size:
                refusal = QueueFullError(f"{self.name}: queue is full ({self.max_queue_size} waiting, "
                                         "max_queue_size); request refused")
            else:
                refusal = None
                future = self._enqueue(item)
        self._time_out(expired)
        if refusal is not None:
            raise refusal
        return future

    def _enqueue(self, item: Any) -> Future:
        # Under the lock: queue one request and wake a worker if one may be idle.
        future: Future = Future()
        self._queue.append(_Pending(self._submitted, item, future, self.clock.now()))
        self._submitted += 1
        # Wake a worker only when one may be idle (queue was empty) or a batch just filled: otherwise the
        # workers are busy or waiting out the window and will look again by themselves.  Waking one per
        # request costs a lock and GIL hand-over each and makes it start batches of one.
        queued, cap = len(self._queue), self.policy.cap
        if queued == 1 or (cap is not None and queued % cap == 0):
            self._cond.notify()
        return future

    def _expired(self, now: float, front_too: bool = False) -> list[_Pending]:
        # Under the lock: take out the waiting requests whose deadline has passed (the oldest first: they
        # share one timeout, so deadlines come in queue order); with front_too, the oldest one in any case.
        if self.queue_timeout is None:
            return []
        expired = []
        while self._queue and (self._queue[0].submitted + self.queue_timeout < now or front_too):
            expired.append(self._queue.popleft())
            front_too = False
        return expired

    def _time_out(self, expired: list[_Pending]) -> None:
        # Outside the lock (a future's callbacks may submit elsewhere): fail each expired request.
        for pending in expired:
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(QueueTimeoutError(
                    f"{self.name}: request waited more than queue_timeout={self.queue_timeout} s; dropped before "
                    "any batch ran it"))

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop accepting requests, serve everything already queued, and stop the workers.

        Returns within ``timeout`` seconds (None: waits as long as the batches take).  A batch still
        running then (a ``batch_fn`` that hangs) is abandoned to its daemon thread, and every request
        not yet answered — queued or in that batch — fails with :class:`BatchError`, so no future hangs.
        """
        if timeout is not None:
            check_number("timeout", timeout, positive=False)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            worker.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        if any(worker.is_alive() for worker in self._workers):
            self._fail_unanswered(BatchError(f"{self.name}: close() gave up after {timeout:.3g} s with a batch "
                                             "still running; this request was not answered"))

    def __enter__(self) -> DynamicBatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _next_batch(self) -> tuple[int, int, list[_Pending], float] | list[_Pending] | None:
        # Wait until the policy says a batch may start; None once closed and drained.  Returns the batch's
        # first request number, its size, the requests not cancelled (now running), and the start time; or
        # the requests whose deadline passed meanwhile (for the caller to fail outside the lock).
        policy, queue = self.policy, self._queue
        free_since = self.clock.now()  # this worker is free from now: Ray's rule starts the window at its pick
        with self._cond:
            while True:
                if queue:
                    now = self.clock.now()
                    expired = self._expired(now)
                    if expired:
                        return expired
                    cap = policy.cap
                    full_at = queue[cap - 1].submitted if cap is not None and len(queue) >= cap else math.inf
                    start = now if self._closed else policy.start_time(free_since, queue[0].submitted, full_at)
                    if start <= now:
                        batch = [queue.popleft() for _ in range(policy.take(len(queue)))]
                        live = [p for p in batch if p.future.set_running_or_notify_cancel()]  # skip cancelled
                        self._running.update((p.number, p) for p in live)
                        if queue:
                            self._cond.notify()  # more waits: another idle worker may start on it
                        return batch[0].number, len(batch), live, now
                    deadline = math.inf if self.queue_timeout is None else queue[0].submitted + self.queue_timeout
                    if deadline <= now:  # no batch can take the oldest by its deadline: it leaves now
                        return self._expired(now, front_too=True)
                    self.clock.wait(self._cond, min(start, deadline) - now)
                elif self._closed:
                    return None
                else:
                    self.clock.wait(self._cond, None)

    def _serve(self) -> None:
        try:
            while (taken := self._next_batch()) is not None:
                if isinstance(taken, list):
                    self._time_out(taken)
                else:
                    self._run(*taken)
        except BaseException as exc:
            # Only a fault of the batcher itself gets here (a batch_fn's errors are caught in _run): fail what
            # is waiting and refuse new requests rather than leave futures that never resolve.
            with self._cond:
                self._broken = exc
            self._fail_unanswered(BatchError(f"{self.name}: a worker thread died: {type(exc).__name__}: {exc}"))
            raise

    def _run(self, first: int, size: int, batch: list[_Pending], started: float) -> None:
        error: BatchError | None = None
        results: list[Any] = []
        work = math.nan
        if batch:
            cpu_started = time.thread_time()
            try:
                results = list(self.batch_fn([p.item for p in batch]))
                if len(results) != len(batch):
                    error = BatchError(f"{self.name}: batch_fn returned {len(results)} results for a batch of "
                                       f"{len(batch)}")
            except BaseException as exc:  # noqa: BLE001 - SystemExit or KeyboardInterrupt from a model too:
                # every request of the batch is told, and the worker goes on serving the others
                error = BatchError(f"{self.name}: batch of {len(batch)} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            # The function's CPU seconds: this thread's, unless it ran elsewhere and says what it used there
            work = self._work_elsewhere() if self._work_elsewhere is not None else time.thread_time() - cpu_started
        ended = self.clock.now()
        service = ended - started
        with self._cond:
            if batch:  # a batch whose requests were all cancelled ran nothing: it tells an AIMD nothing,
                # and one partly cancelled ran len(batch) rows: that is the size its time is evidence for
                self.policy.observe(service, len(batch))
            record = BatchRecord(first, size, started, ended, work)
            index = len(self._batches)
            self._batches.append(record)  # before any answer: whoever reads a future's result finds its batch
            self._records.extend((started - p.submitted, service, len(batch), work) for p in batch)
            # close() may have answered some already (it gave up waiting): answer only those still ours
            mine = [(i, p) for i, p in enumerate(batch) if self._running.pop(p.number, None) is not None]
        for i, pending in mine:
            if error is None:
                pending.future.set_result(results[i])
            else:
                pending.future.set_exception(error)
        released = self.clock.now()
        with self._cond:
            self._batches[index] = dataclasses.replace(record, released=released)

    def _fail_unanswered(self, error: BatchError) -> None:
        with self._cond:
            left = [*self._queue, *self._running.values()]
            self._queue.clear()
            self._running.clear()
        for pending in left:  # queued ones are still pending (or cancelled), running ones are running
            if pending.future.running() or pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(error)
