"""Load generators and service-time profiling: how a server is measured (notebooks 05-07).

Every generator drives a ``submit(item) -> Future`` callable, so the same code
measures a :class:`~infergraph_lite.serving.batcher.DynamicBatcher`, a
:class:`~infergraph_lite.serving.graph_server.GraphServer`, a Triton client or a Ray Serve
handle, and reports the same :class:`LoadReport`.

- *Open loop* (:func:`run_open_loop`): requests arrive on a schedule whatever
  the server does, as from many independent users; a slow server builds a
  queue, which is what latency-versus-load curves must show.
- *Closed loop* (:func:`run_closed_loop`): ``n_clients`` each send a request,
  wait for its answer, and send the next, as perf_analyzer's concurrency mode
  does; a slow server slows the load down, so it measures throughput at a
  given concurrency, not latency at a given arrival rate.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count
from infergraph_lite.core.metrics import latency_percentile
from infergraph_lite.serving.batcher import is_refusal
from infergraph_lite.serving.metrics import StageTimes, stage_times

__all__ = ["LoadReport", "ServiceProfile", "StageTimes", "profile_service_time", "run_closed_loop", "run_open_loop",
           "stage_times"]

Submit = Callable[[Any], Future]


@dataclass(frozen=True)
class LoadReport:
    """What a load test measured: per-request latencies (seconds) and their summaries.

    ``latencies`` are arrival -> answer, in submit order (in an open loop the
    arrival is the *scheduled* time, so a generator that falls behind its
    schedule cannot hide its lag in the latencies); requests the server
    accepted but failed are counted in ``failed``; requests it shed are counted
    in ``refused``: any error raised by ``submit`` itself (a full queue:
    :class:`~infergraph_lite.serving.batcher.QueueFullError`), and a future
    that fails with a :class:`~infergraph_lite.serving.batcher.RequestRefusedError`
    (a later stage's full queue, a deadline passed while waiting, Triton's or
    Ray Serve's refusal: :func:`~infergraph_lite.serving.batcher.is_refusal`).
    Neither is in the latencies.  ``max_lag`` is how far behind schedule the generator
    submitted its latest request (open loop; seconds).  ``stages`` holds each
    stage's mean queue and compute time over the run when the server keeps
    per-stage records (a :class:`~infergraph_lite.serving.graph_server.GraphServer`).
    """

    latencies: np.ndarray
    elapsed: float                 # first submit -> last answer, seconds
    failed: int = 0
    mode: str = "open loop"
    stages: Mapping[str, StageTimes] = field(default_factory=dict)
    refused: int = 0
    max_lag: float = 0.0

    @property
    def throughput(self) -> float:
        """Answered requests per second over the run."""
        return len(self.latencies) / self.elapsed if self.elapsed > 0 else math.inf

    @property
    def mean(self) -> float:
        return float(np.mean(self.latencies))

    def percentile(self, q: float) -> float:
        """The q-th percentile latency in seconds (``percentile(99)`` is p99)."""
        return latency_percentile(self.latencies, q)

    def summary(self) -> dict[str, float]:
        """Throughput (req/s) and mean, p50, p90, p95, p99 latency (ms), as perf_analyzer prints them."""
        ms = {f"p{q}_ms": 1e3 * self.percentile(q) for q in (50, 90, 95, 99)}
        return {"throughput_rps": self.throughput, "mean_ms": 1e3 * self.mean, **ms, "failed": float(self.failed),
                "refused": float(self.refused)}

    def __str__(self) -> str:
        s = self.summary()
        lines = [f"{self.mode}: {len(self.latencies)} requests in {self.elapsed:.2f} s, "
                 f"throughput {s['throughput_rps']:.1f} req/s, failed {self.failed}"
                 + (f", refused {self.refused}" if self.refused else ""),
                 "  latency ms: " + ", ".join(f"{k[:-3]} {s[k]:.2f}" for k in ("mean_ms", "p50_ms", "p90_ms",
                                                                                  "p95_ms", "p99_ms"))]
        for name, t in self.stages.items():
            lines.append(f"  {name}: queue {1e3 * t.queue:.2f} ms, compute {1e3 * t.compute:.2f} ms, "
                         f"mean batch {t.batch_size:.1f}")
        return "\n".join(lines)


def _submit_of(target: Submit | Any) -> Submit:
    # A server object with .submit, or the submit callable itself.
    submit = getattr(target, "submit", target)
    if not callable(submit):
        raise TypeError(f"expected a submit(item) -> Future callable or an object with .submit, got {target!r}")
    return submit


def _stage_marks(target: Any) -> tuple[Callable[[], Mapping[str, Sequence[Any]]], dict[str, int]] | None:
    # A server that keeps per-stage records (GraphServer.stage_records), or a bound .submit of one: note how many
    # records each stage holds before the run, so the report covers this run's requests only.
    owner = getattr(target, "__self__", target)
    records = getattr(owner, "stage_records", None)
    if not callable(records):
        return None
    return records, {name: len(rows) for name, rows in records().items()}


def _stages_since(marks: tuple[Callable[[], Mapping[str, Sequence[Any]]], dict[str, int]] | None
                  ) -> dict[str, StageTimes]:
    if marks is None:
        return {}
    records, before = marks
    return stage_times({name: list(rows)[before.get(name, 0):] for name, rows in records().items()})


def _stamp(done_at: list[float], i: int) -> Callable[[Future], None]:
    # A done-callback that records when request i was answered.
    def record(_: Future) -> None:
        done_at[i] = time.perf_counter()
    return record


def run_open_loop(
    target: Submit | Any,
    arrivals: Sequence[float] | np.ndarray,
    make_item: Callable[[int], Any],
    *,
    timeout: float = 120.0,
) -> LoadReport:
    """Submit request ``i`` at ``arrivals[i]`` seconds from now, whatever the server is doing.

    *Open loop*: arrivals do not wait for answers, as with many independent
    users, so a slow server builds a queue instead of slowing the load down.
    ``target`` is a ``submit(item) -> Future`` callable or an object with
    ``.submit``.  Waits at most ``timeout`` seconds for the last answers.

    >>> from infergraph_lite import DynamicBatcher
    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4, max_wait=0.001) as b:
    ...     report = run_open_loop(b, [0.0, 0.001, 0.002], make_item=lambda i: i)
    >>> report.latencies.shape, bool((report.latencies > 0).all()), report.failed
    ((3,), True, 0)
    """
    submit = _submit_of(target)
    marks = _stage_marks(target)
    arrivals = np.asarray(arrivals, dtype=float)
    if arrivals.ndim != 1 or np.any(np.diff(arrivals) < 0) or (len(arrivals) and arrivals[0] < 0):
        raise ValueError("arrivals must be a 1-d, sorted sequence of offsets >= 0 (seconds)")
    n = len(arrivals)
    done_at = [math.nan] * n
    futures: dict[int, Future] = {}
    refused = 0
    max_lag = 0.0
    start = time.perf_counter()
    for i, offset in enumerate(arrivals.tolist()):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        max_lag = max(max_lag, -delay)
        try:
            future = submit(make_item(i))
        except Exception:  # noqa: BLE001 - a refusal (a full queue) is counted; the requests in flight go on
            refused += 1
            continue
        future.add_done_callback(_stamp(done_at, i))
        futures[i] = future
    failed = 0
    deadline = time.perf_counter() + timeout
    for future in futures.values():
        try:
            future.result(timeout=max(deadline - time.perf_counter(), 0.0))
        except Exception as error:  # noqa: BLE001 - counted, not raised: the report says how many
            if is_refusal(error):
                refused += 1
            else:
                failed += 1
    ok = [i for i, f in futures.items() if f.done() and not f.cancelled() and f.exception() is None]
    # From the scheduled arrival, as an open-loop client sees it: a late submit is the generator's lag, and
    # a server that makes the generator late (by holding the interpreter lock) pays for it here.
    latencies = np.asarray([done_at[i] - (start + arrivals[i]) for i in ok])
    elapsed = (max(done_at[i] for i in ok) - start) if ok else 0.0
    return LoadReport(latencies, elapsed, failed, "open loop", _stages_since(marks), refused, max_lag)


def run_closed_loop(
    target: Submit | Any,
    n_clients: int,
    n_requests: int,
    make_item: Callable[[int], Any],
    *,
    max_seconds: float = 60.0,
) -> LoadReport:
    """``n_clients`` threads each send a request, wait for its answer, then send the next.

    perf_analyzer's concurrency mode: there are always about ``n_clients``
    requests in the system.  Stops after ``n_requests`` requests in total or
    ``max_seconds``, whichever comes first (the loop is bounded either way).

    >>> from infergraph_lite import DynamicBatcher
    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4, max_wait=0.0) as b:
    ...     report = run_closed_loop(b, n_clients=3, n_requests=30, make_item=lambda i: i)
    >>> len(report.latencies), report.mode
    (30, 'closed loop, 3 clients')
    """
    submit = _submit_of(target)
    marks = _stage_marks(target)
    n_clients = check_count("n_clients", n_clients)
    n_requests = check_count("n_requests", n_requests)
    lock = threading.Lock()
    next_index = 0
    latencies: list[float] = []
    failed = refused = 0
    start = time.perf_counter()
    stop_at = start + max_seconds

    def client() -> None:
        nonlocal next_index, failed, refused
        while True:
            with lock:
                if next_index >= n_requests or time.perf_counter() >= stop_at:
                    return
                i = next_index
                next_index += 1
            sent = time.perf_counter()
            try:
                future = submit(make_item(i))
            except Exception:  # noqa: BLE001 - a refusal at submit (a full queue) is counted, not raised
                with lock:
                    refused += 1
                continue
            try:
                future.result(timeout=max(stop_at - sent, 0.001) + 5.0)
                took = time.perf_counter() - sent
                with lock:
                    latencies.append(took)
            except Exception as error:  # noqa: BLE001 - counted in the report
                with lock:
                    if is_refusal(error):
                        refused += 1
                    else:
                        failed += 1

    threads = [threading.Thread(target=client, name=f"load-client-{c}", daemon=True) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return LoadReport(np.asarray(latencies), elapsed, failed, f"closed loop, {n_clients} clients",
                      _stages_since(marks), refused)


@dataclass(frozen=True)
class ServiceProfile:
    """Measured batch service times and their straight-line fit ``alpha + beta * b`` (seconds)."""

    sizes: np.ndarray
    seconds: np.ndarray
    alpha: float
    beta: float

    def predict(self, b: float | np.ndarray) -> float | np.ndarray:
        return self.alpha + self.beta * b

    @property
    def monotonic(self) -> bool:
        """Whether the measured times never fall as the batch grows (a noisy profile often breaks this)."""
        return bool(np.all(np.diff(self.seconds) >= 0))


def profile_service_time(
    model: Callable[[Any], Any],
    make_batch: Callable[[int], Any],
    sizes: Sequence[int],
    repeats: int = 15,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> ServiceProfile:
    """Time ``model(make_batch(b))`` for each ``b`` (median of ``repeats``) and fit ``alpha + beta * b``.

    The sizes are timed in turn, round after round, rather than one size
    after another: a burst of work elsewhere on the machine then slows one
    round of every size instead of all the repeats of one size, and the
    medians stay in order.  ``clock`` reads seconds: wall time by default;
    ``time.thread_time`` counts only the CPU time of the calling thread,
    which other processes cannot inflate by taking the core away — the cost
    on a core of one's own (it misses work on other threads, such as a
    multi-threaded BLAS call's).

    >>> p = profile_service_time(lambda x: x.sum(), lambda b: np.ones((b, 10)), [1, 2, 4], repeats=3)
    >>> p.sizes.tolist(), p.seconds.shape
    ([1, 2, 4], (3,))
    """
    try:
        if len(sizes) < 2:
            raise ValueError
        for b in sizes:
            check_count("a batch size", b)
    except ValueError:
        raise ValueError(f"sizes must hold at least two batch sizes >= 1, got {list(sizes)!r}") from None
    repeats = check_count("repeats", repeats)
    batches = [make_batch(b) for b in sizes]
    for batch in batches:
        model(batch)  # warm caches and lazy allocations first
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats):
        for k, batch in enumerate(batches):
            started = clock()
            model(batch)
            times[k].append(clock() - started)
    medians = [statistics.median(t) for t in times]
    sizes_arr, seconds = np.asarray(sizes, dtype=float), np.asarray(medians)
    beta, alpha = np.polyfit(sizes_arr, seconds, 1)
    return ServiceProfile(np.asarray(sizes), seconds, float(max(alpha, 0.0)), float(max(beta, 0.0)))
