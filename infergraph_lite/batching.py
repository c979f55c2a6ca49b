"""A real dynamic batcher (threads), and profiling a real model's batch service time.

:class:`DynamicBatcher` runs the same policy as :func:`simulate_batching`:
whenever the worker is free and at least one request waits, a batch starts if
``max_batch_size`` requests wait or the oldest has waited ``max_wait``
seconds; it takes the oldest ``min(queue, max_batch_size)``.

Introduced in notebook 05.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BatchError", "DynamicBatcher", "QueueFullError", "RequestRecord", "ServiceProfile",
           "profile_service_time", "run_open_loop"]


class BatchError(RuntimeError):
    """The batch a request was in failed; ``__cause__`` holds what ``batch_fn`` raised, if it raised."""


class QueueFullError(RuntimeError):
    """``submit`` found ``max_queue_size`` requests already waiting: shed load instead of queueing forever."""


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request, in seconds."""

    queue_time: float    # submit -> its batch started
    service_time: float  # its batch's run time
    batch_size: int

    @property
    def latency(self) -> float:
        return self.queue_time + self.service_time


@dataclass(slots=True)
class _Pending:
    item: Any
    future: Future
    submitted: float


class DynamicBatcher:
    """Collect single requests into batches for ``batch_fn(list) -> list``, on a background thread.

    >>> with DynamicBatcher(lambda xs: [x * 2 for x in xs], max_batch_size=4, max_wait=0.01) as batcher:
    ...     futures = [batcher.submit(i) for i in range(6)]
    ...     [f.result() for f in futures]
    [0, 2, 4, 6, 8, 10]
    >>> len(batcher.records)
    6
    """

    def __init__(
        self,
        batch_fn: Callable[[list[Any]], Sequence[Any]],
        max_batch_size: int | None,
        max_wait: float,
        max_queue_size: int | None = None,
    ):
        if not callable(batch_fn):
            raise ValueError(f"batch_fn must be callable, got {batch_fn!r}")
        if max_batch_size is not None and (not isinstance(max_batch_size, int) or max_batch_size < 1):
            raise ValueError(f"max_batch_size must be an integer >= 1 or None, got {max_batch_size!r}")
        if not isinstance(max_wait, (int, float)) or not (max_wait >= 0 and math.isfinite(max_wait)):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, got {max_wait!r}")
        if max_queue_size is not None and (not isinstance(max_queue_size, int) or max_queue_size < 1):
            raise ValueError(f"max_queue_size must be an integer >= 1 or None, got {max_queue_size!r}")
        self.batch_fn = batch_fn
        self.max_batch_size = max_batch_size
        self.max_wait = float(max_wait)
        self.max_queue_size = max_queue_size
        self._records: list[tuple[float, float, int]] = []  # raw, cheap to append on the worker's hot path
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="dynamic-batcher", daemon=True)
        self._worker.start()

    @property
    def records(self) -> list[RequestRecord]:
        """One :class:`RequestRecord` per request served so far, in the order batches finished."""
        with self._cond:
            return [RequestRecord(*raw) for raw in self._records]

    def submit(self, item: Any) -> Future:
        """Queue one request; its :class:`~concurrent.futures.Future` resolves to its result."""
        with self._cond:
            if self._closed:
                raise RuntimeError("submit() after close(): this DynamicBatcher no longer accepts requests")
            if self.max_queue_size is not None and len(self._queue) >= self.max_queue_size:
                raise QueueFullError(f"queue is full ({self.max_queue_size} waiting, max_queue_size); request refused")
            future: Future = Future()
            self._queue.append(_Pending(item, future, time.perf_counter()))
            # Wake the worker only when it may be idle (queue was empty) or a batch just filled: otherwise it
            # is busy or waiting out the window, and will look again by itself.  Waking it for every request
            # costs a lock and GIL hand-over per request and makes it start batches of one.
            queued = len(self._queue)
            if queued == 1 or queued == self.max_batch_size:
                self._cond.notify()
        return future

    def close(self) -> None:
        """Stop accepting requests, serve everything already queued, and stop the worker."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join()

    def __enter__(self) -> DynamicBatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _next_batch(self) -> list[_Pending] | None:
        # Wait until the policy says a batch may start; None once closed and drained.
        cap = self.max_batch_size or math.inf
        with self._cond:
            while True:
                if self._queue:
                    waited = time.perf_counter() - self._queue[0].submitted
                    if len(self._queue) >= cap or waited >= self.max_wait or self._closed:
                        size = int(min(len(self._queue), cap))
                        return [self._queue.popleft() for _ in range(size)]
                    self._cond.wait(self.max_wait - waited)
                elif self._closed:
                    return None
                else:
                    self._cond.wait()

    def _serve(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [p for p in batch if p.future.set_running_or_notify_cancel()]  # skip cancelled requests
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = list(self.batch_fn([p.item for p in batch]))
                error = None if len(results) == len(batch) else BatchError(
                    f"batch_fn returned {len(results)} results for a batch of {len(batch)}")
            except Exception as exc:  # noqa: BLE001 - every request of the batch is told, the worker goes on
                results, error = [], BatchError(f"batch of {len(batch)} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            ended = time.perf_counter()
            service, size = ended - started, len(batch)
            with self._cond:
                self._records.extend((started - p.submitted, service, size) for p in batch)
            for i, pending in enumerate(batch):
                if error is None:
                    pending.future.set_result(results[i])
                else:
                    pending.future.set_exception(error)


@dataclass(frozen=True)
class ServiceProfile:
    """Measured batch service times and their straight-line fit ``alpha + beta * b`` (seconds)."""

    sizes: np.ndarray
    seconds: np.ndarray
    alpha: float
    beta: float

    def predict(self, b: float | np.ndarray) -> float | np.ndarray:
        return self.alpha + self.beta * b


def profile_service_time(
    model: Callable[[Any], Any], make_batch: Callable[[int], Any], sizes: Sequence[int], repeats: int = 15
) -> ServiceProfile:
    """Time ``model(make_batch(b))`` for each ``b`` (median of ``repeats``) and fit ``alpha + beta * b``.

    >>> p = profile_service_time(lambda x: x.sum(), lambda b: np.ones((b, 10)), [1, 2, 4], repeats=3)
    >>> p.sizes.tolist(), p.seconds.shape
    ([1, 2, 4], (3,))
    """
    if len(sizes) < 2 or any(not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
        raise ValueError(f"sizes must hold at least two batch sizes >= 1, got {list(sizes)!r}")
    medians = []
    for b in sizes:
        batch = make_batch(b)
        model(batch)  # warm caches and lazy allocations first
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            model(batch)
            times.append(time.perf_counter() - started)
        medians.append(statistics.median(times))
    sizes_arr, seconds = np.asarray(sizes, dtype=float), np.asarray(medians)
    beta, alpha = np.polyfit(sizes_arr, seconds, 1)
    return ServiceProfile(np.asarray(sizes), seconds, float(max(alpha, 0.0)), float(max(beta, 0.0)))


def run_open_loop(batcher: DynamicBatcher, arrivals: Sequence[float], make_item: Callable[[int], Any]) -> np.ndarray:
    """Submit request ``i`` at time ``arrivals[i]`` seconds from now, whatever the server is doing.

    *Open loop*: arrivals do not wait for answers, as with many independent
    users, so a slow server builds a queue instead of slowing the load down
    (a closed-loop load test hides exactly the queueing we want to measure).
    Returns each request's latency in seconds, submit to result, in arrival order.

    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4, max_wait=0.001) as b:
    ...     latencies = run_open_loop(b, [0.0, 0.001, 0.002], make_item=lambda i: i)
    >>> latencies.shape, bool((latencies > 0).all())
    ((3,), True)
    """
    done_at = [math.nan] * len(arrivals)
    futures = []
    start = time.perf_counter()
    submitted_at = []
    for i, offset in enumerate(arrivals):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        submitted_at.append(time.perf_counter())
        future = batcher.submit(make_item(i))
        future.add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.perf_counter()))
        futures.append(future)
    for future in futures:
        future.result()
    return np.asarray(done_at) - np.asarray(submitted_at)
