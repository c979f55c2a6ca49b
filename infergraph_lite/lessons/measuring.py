"""Measuring a real server before trusting its numbers (notebook 09): the pieces the lesson's cells call.

- :class:`ToyModel`: a CPU-bound batch function, ``fixed_rounds`` of pure-Python work per batch plus
  ``item_rounds`` per item, whose first call builds a table (a cold start, as loading weights is);
- :class:`Stall`: a batch function that pauses once, as a garbage collection or a swapped-out page does;
- :func:`run_paced`: one schedule of arrivals, sent open-loop (whatever the server does) or closed-loop (each
  client waits for its answer first), with the intended, sent and answered time of every request, so that
  coordinated omission can be seen and corrected;
- :func:`block_bootstrap` and :func:`naive_interval`: intervals on a percentile and on a mean of correlated
  latencies (the batch-means interval is :func:`~infergraph_lite.simulation.theory.batch_means_interval`);
- :func:`cpu_hogs`: CPU-bound processes beside the server, stopped by their PIDs;
- :func:`serve_load` and :class:`LoadNumbers`: one open-loop run of a :class:`DynamicBatcher`, with the
  rate sent, the CPU per request above the idle baseline, and the run replayed through two twins, the forecast
  (a profile and :func:`lone_wakeup`, measured on lone requests) and the trace-driven replay (the run's own batch
  times): :class:`ValidationRow`.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.metrics import t_quantile
from infergraph_lite.lessons.batching import in_run_service_time
from infergraph_lite.lessons.examples import python_work
from infergraph_lite.simulation.queue import simulate_batching

__all__ = ["LoadNumbers", "PacedRun", "Stall", "ToyModel", "ValidationRow", "block_bootstrap", "cpu_hogs",
           "forecast_service", "lone_wakeup", "naive_interval", "run_paced", "serve_load", "validation_table"]


class ToyModel:
    """A CPU-bound batch function: ``fixed_rounds`` of :func:`python_work` per batch, ``item_rounds`` per item.

    Its batch time is ``alpha + beta * b`` on a core of its own.  The first call also builds a table of
    ``table_size`` random numbers, a cold start such as a real server's first request pays (weights read from
    disk, a JIT compiling, buffers allocated): what a warm-up is for.

    >>> model = ToyModel(fixed_rounds=10, item_rounds=5, table_size=10)
    >>> model.cold, model([1, 2]), model.cold
    (True, [4182499122, 3840747375], False)
    """

    def __init__(self, fixed_rounds: int, item_rounds: int, *, table_size: int = 8_000_000):
        self.fixed_rounds = check_count("fixed_rounds", fixed_rounds)
        self.item_rounds = check_count("item_rounds", item_rounds)
        self.table_size = check_count("table_size", table_size)
        self._table: np.ndarray | None = None

    @property
    def cold(self) -> bool:
        """True until the first call has built the table."""
        return self._table is None

    def __call__(self, items: list[Any]) -> list[int]:
        if self._table is None:
            self._table = np.random.default_rng(0).standard_normal(self.table_size)
        python_work([0], self.fixed_rounds)
        return python_work([int(i) & 0xFFFF for i in items], self.item_rounds)


class Stall:
    """``fn``, except that the first batch starting ``at`` seconds or more after :meth:`arm` first sleeps ``seconds``.

    A server that stops now and then (a full garbage collection, a page swapped out, a noisy neighbour) looks
    like this from outside.  ``happened`` is when the stall began (``time.perf_counter``), None before.

    >>> stall = Stall(lambda xs: xs, at=0.0, seconds=0.01)
    >>> stall.arm(); started = time.perf_counter(); _ = stall([1]); time.perf_counter() - started >= 0.01
    True
    >>> started = time.perf_counter(); _ = stall([1]); time.perf_counter() - started < 0.01   # only once
    True
    """

    def __init__(self, fn: Callable[[list[Any]], Any], at: float, seconds: float):
        self.fn = fn
        self.at = check_number("at", at, positive=False)
        self.seconds = check_number("seconds", seconds)
        self._armed_at: float | None = None
        self.happened: float | None = None

    def arm(self) -> None:
        """Start the clock: the stall comes ``at`` seconds from now, once."""
        self._armed_at, self.happened = time.perf_counter(), None

    def __call__(self, items: list[Any]) -> Any:
        now = time.perf_counter()
        if self._armed_at is not None and self.happened is None and now - self._armed_at >= self.at:
            self.happened = now
            time.sleep(self.seconds)
        return self.fn(items)


@dataclass(frozen=True)
class PacedRun:
    """Every request of one run, in schedule order: when it was meant to go, went, and was answered (seconds from
    the run's start; ``done`` NaN where it failed)."""

    intended: np.ndarray
    sent: np.ndarray
    done: np.ndarray
    mode: str

    @property
    def from_send(self) -> np.ndarray:
        """Latency as most load generators report it: answered minus sent."""
        return self.done - self.sent

    @property
    def from_schedule(self) -> np.ndarray:
        """Latency corrected for coordinated omission: answered minus *meant to be sent*."""
        return self.done - self.intended

    def rate(self, times: np.ndarray | None = None) -> float:
        """Requests per second between the first and the last of ``times`` (default: the sends)."""
        t = self.sent if times is None else times
        span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
        return (len(t) - 1) / span if span > 0 else math.nan

    def sent_per_window(self, width: float) -> tuple[np.ndarray, np.ndarray]:
        """(window starts, requests sent in each window of ``width`` seconds).

        >>> run = PacedRun(np.arange(4.0), np.array([0.0, 1.0, 1.1, 3.0]), np.arange(4.0) + 1, "x")
        >>> [c.tolist() for c in run.sent_per_window(1.0)]
        [[0.0, 1.0, 2.0, 3.0], [1, 2, 0, 1]]
        """
        edges = np.arange(0.0, float(np.nanmax(self.sent)) + width, width)
        counts, _ = np.histogram(self.sent, bins=np.append(edges, edges[-1] + width))
        return edges, counts


def run_paced(target: Any, arrivals: Sequence[float] | np.ndarray, make_item: Callable[[int], Any], *,
              clients: int | None = None, timeout: float = 60.0) -> PacedRun:
    """Send request ``i`` at ``arrivals[i]`` seconds from now: open-loop (``clients=None``) or closed-loop.

    Open loop: one thread sends every request at its time, whatever the server is doing.  Closed loop:
    ``clients`` threads share the schedule (client ``c`` has requests ``c, c + clients, ...``) and each sends its
    next request at its time *or when its previous answer came, whichever is later*, as a load generator with a
    fixed number of connections does.  ``target`` is a ``submit(item) -> Future`` callable or has ``.submit``.

    >>> from infergraph_lite.serving.batcher import DynamicBatcher
    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4) as b:
    ...     run = run_paced(b, [0.0, 0.001, 0.002, 0.003], lambda i: i, clients=2)
    >>> run.mode, bool(np.all(run.sent >= run.intended)), bool(np.all(run.done > run.sent))
    ('closed loop, 2 clients', True, True)
    """
    submit = getattr(target, "submit", target)
    arrivals = np.asarray(arrivals, dtype=float)
    if arrivals.ndim != 1 or len(arrivals) == 0 or np.any(np.diff(arrivals) < 0) or arrivals[0] < 0:
        raise ValueError("arrivals must be a non-empty, sorted 1-d sequence of offsets >= 0 (seconds)")
    n = len(arrivals)
    sent, done = np.full(n, math.nan), np.full(n, math.nan)
    start = time.perf_counter()

    def stamp(i: int) -> Callable[[Future], None]:
        def record(future: Future) -> None:
            if not future.cancelled() and future.exception() is None:
                done[i] = time.perf_counter() - start
        return record

    def send(indices: range, wait: bool) -> list[Future]:
        futures = []
        for i in indices:
            delay = start + arrivals[i] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent[i] = time.perf_counter() - start
            future = submit(make_item(i))
            future.add_done_callback(stamp(i))
            if wait:
                with contextlib.suppress(Exception):
                    future.result(timeout=timeout)
            futures.append(future)
        return futures

    if clients is None:
        futures = send(range(n), wait=False)
        for future in futures:
            with contextlib.suppress(Exception):
                future.result(timeout=timeout)
        mode = "open loop"
    else:
        clients = check_count("clients", clients)
        threads = [threading.Thread(target=send, args=(range(c, n, clients), True), daemon=True)
                   for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        mode = f"closed loop, {clients} client{'s' if clients > 1 else ''}"
    deadline = time.perf_counter() + 1.0  # a done-callback may run just after result() returned
    while np.isnan(done).any() and time.perf_counter() < deadline:
        time.sleep(0.001)
    return PacedRun(arrivals.copy(), sent, done, mode)


def naive_interval(samples: Sequence[float] | np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half-width) treating every sample as independent: right for independent repetitions, too narrow
    for consecutive latencies of one run, which are correlated (a queue carries its state from one to the next).

    >>> mean, half = naive_interval([1.0, 2.0, 3.0])
    >>> mean, round(half, 3)
    (2.0, 2.484)
    """
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        raise ValueError("naive_interval needs at least two samples")
    return float(x.mean()), t_quantile(confidence, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)


def block_bootstrap(samples: Sequence[float] | np.ndarray, q: float, *, block: int = 1, resamples: int = 400,
                    confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval (low, high) on the ``q``-th percentile of ``samples``, resampled in blocks.

    ``block=1`` is the plain bootstrap: every sample drawn on its own, which assumes they are independent.
    Latencies of one run come in bursts (one slow moment delays the requests queued behind it), so the plain
    bootstrap's interval is too narrow; drawing runs of ``block`` consecutive samples (circular, random starts)
    keeps the bursts whole.  Blocks should be longer than a burst.

    >>> x = np.random.default_rng(1).exponential(1.0, 2_000)
    >>> low, high = block_bootstrap(x, 99)
    >>> bool(low < np.percentile(x, 99) < high)
    True
    >>> low_b, high_b = block_bootstrap(np.repeat(x[:200], 10), 99, block=50)   # bursts of ten equal values
    >>> (high_b - low_b) > (lambda lh: lh[1] - lh[0])(block_bootstrap(np.repeat(x[:200], 10), 99))
    True
    """
    x = np.asarray(samples, dtype=float)
    n = x.size
    block, resamples = check_count("block", block), check_count("resamples", resamples)
    if n < 2 * block:
        raise ValueError(f"block_bootstrap needs at least two blocks of {block} samples, got {n} samples")
    rng = np.random.default_rng(seed)
    count = math.ceil(n / block)
    starts = rng.integers(0, n, (resamples, count))
    index = ((starts[:, :, None] + np.arange(block)) % n).reshape(resamples, -1)[:, :n]
    values = np.percentile(x[index], q, axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


_HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def cpu_hogs(n: int, seconds: float = 120.0) -> Iterator[list[int]]:
    """``n`` CPU-bound processes (bare interpreters in a busy loop) for the ``with`` block; yields their PIDs.

    Each stops by itself after ``seconds`` at the latest, and each is stopped by its PID when the block ends,
    also on an error.

    >>> import psutil
    >>> with cpu_hogs(1, seconds=5) as pids:
    ...     alive = psutil.pid_exists(pids[0])
    >>> alive, psutil.pid_exists(pids[0]) and psutil.Process(pids[0]).status() != psutil.STATUS_ZOMBIE
    (True, False)
    """
    n = check_count("n", n)
    seconds = check_number("seconds", seconds)
    processes = [subprocess.Popen([sys.executable, "-c", _HOG.format(seconds=seconds)], stdin=subprocess.DEVNULL)
                 for _ in range(n)]
    try:
        yield [p.pid for p in processes]
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def forecast_service(sizes: Sequence[int] | np.ndarray, seconds: Sequence[float] | np.ndarray,
                     handoff: float = 0.0) -> Callable[[float], float]:
    """The forecast twin's batch time: a profile ``seconds`` at ``sizes`` (interpolated) plus ``handoff``.

    >>> s = forecast_service([1, 4], [0.002, 0.005], handoff=0.0001)
    >>> round(s(1), 6), round(s(2), 6)
    (0.0021, 0.0031)
    """
    sizes_arr, seconds_arr = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    handoff = check_number("handoff", handoff, positive=False)
    return lambda b: float(np.interp(b, sizes_arr, seconds_arr)) + handoff


def lone_wakeup(batcher: Any, make_item: Callable[[int], Any], *, n: int = 40, spacing: float = 0.01) -> float:
    """The hand-off a lone request meets in ``batcher``: the median time from its submit until its batch started
    (the worker woken, the interpreter lock won), over ``n`` requests sent ``spacing`` seconds apart.

    A twin starts a batch that much after its first request arrives (``simulate_batching(..., max_wait=...)``):
    meanwhile later requests can join it, as they join a real batch whose worker is still waking.

    >>> from infergraph_lite.serving.batcher import DynamicBatcher
    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4) as b:
    ...     0 <= lone_wakeup(b, lambda i: i, n=5, spacing=0.002) < 0.01
    True
    """
    mark = len(batcher.records)
    run_paced(batcher, np.arange(check_count("n", n)) * check_number("spacing", spacing), make_item)
    return float(np.median([r.queue_time for r in batcher.records[mark:]]))


@dataclass(frozen=True)
class ValidationRow:
    """One load of a twin's validation table: the measured mean and p99 latency and each twin's (seconds)."""

    load: float
    measured: tuple[float, float]
    forecast: tuple[float, float]
    replay: tuple[float, float]

    def error(self, twin: str) -> tuple[float, float]:
        """(mean, p99) relative error of ``twin`` ("forecast" or "replay"): simulated / measured - 1."""
        sim = getattr(self, twin)
        return sim[0] / self.measured[0] - 1, sim[1] / self.measured[1] - 1


def validation_table(rows: Sequence[ValidationRow]) -> str:
    """The table LLM-serving simulators publish (Vidur, LLMServingSim): per load, measured and each twin's error.

    >>> print(validation_table([ValidationRow(0.5, (0.010, 0.020), (0.009, 0.024), (0.0105, 0.019))]))
    load   measured mean ms  p99 ms | forecast error: mean    p99 | replay error: mean    p99
    0.50               10.00   20.00 |               -10.0 %  +20.0 % |            +5.0 %   -5.0 %
    """
    lines = ["load   measured mean ms  p99 ms | forecast error: mean    p99 | replay error: mean    p99"]
    for r in rows:
        (fm, fp), (rm, rp) = r.error("forecast"), r.error("replay")
        lines.append(f"{r.load:4.2f}   {1e3 * r.measured[0]:17.2f} {1e3 * r.measured[1]:7.2f} | "
                     f"{100 * fm:+19.1f} % {100 * fp:+6.1f} % | {100 * rm:+17.1f} % {100 * rp:+6.1f} %")
    return "\n".join(lines)


@dataclass(frozen=True)
class LoadNumbers:
    """Everything one open-loop run of a batcher gives (seconds, requests per second, CPU milliseconds).

    ``client`` latencies count from each request's *scheduled* time (what a user sees, the load generator's
    lateness included); ``from_send`` ones from the moment the generator sent it to its answer: the server's part,
    timed on the same clock as the send times the twins replay.
    ``cpu_ms`` is this process's CPU per request above its idle baseline; ``work_ms`` the batch function's own
    CPU per request, as the batcher timed it.
    """

    asked: float
    scheduled: float
    sent: float
    client: np.ndarray
    from_send: np.ndarray
    cpu_ms: float
    work_ms: float
    mean_batch: float
    row: ValidationRow
    batches: tuple[int, int, int]  # batches formed: by the server, by the forecast twin (0 without one), the replay
    work_vs_forecast: float = math.nan  # the batches' CPU seconds over the forecast's time for batches of their sizes

    @property
    def sent_ratio(self) -> float:
        """Rate sent / rate the schedule held."""
        return self.sent / self.scheduled


def serve_load(batcher: Any, rate: float, n: int, make_item: Callable[[int], Any], *, load: float,
               forecast: Callable[[float], float] | None = None, wakeup: float = 0.0,
               idle_cpu_per_second: float = 0.0, seed: int = 0) -> LoadNumbers:
    """One open-loop Poisson run of ``n`` requests at ``rate`` req/s through a warm one-worker ``batcher``.

    The run's send times are replayed through two twins of the batcher's policy (``simulate_batching``): the
    *forecast*, whose batch time is ``forecast(b)`` (a profile and a hand-off measured on lone requests before the
    load; without one the row's forecast is NaN), and the *replay*, whose batches take the times this run's batches
    of that size took (drawn, seeded).  Both start a batch ``wakeup`` seconds after its first request arrives
    (:func:`lone_wakeup`; greedy batching otherwise).  ``load`` labels the row.  ``idle_cpu_per_second`` is this
    process's CPU while the server idles, subtracted.

    >>> from infergraph_lite.serving.batcher import DynamicBatcher
    >>> with DynamicBatcher(ToyModel(10, 10, table_size=10), max_batch_size=4) as b:
    ...     numbers = serve_load(b, 500, 50, lambda i: i, load=0.1)
    >>> len(numbers.from_send), numbers.row.load, numbers.cpu_ms >= 0, math.isnan(numbers.row.forecast[0])
    (50, 0.1, True, True)
    """
    rate, n = check_number("rate", rate), check_count("n", n)
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]
    marks = (len(batcher.records), len(batcher.batches))
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    run = run_paced(batcher, arrivals, make_item)
    cpu = time.process_time() - cpu_before - idle_cpu_per_second * (time.perf_counter() - wall_before)
    records, batches = batcher.records[marks[0]:], batcher.batches[marks[1]:]
    seen: dict[int, list[float]] = {}
    for batch in batches:
        seen.setdefault(batch.size, []).append(batch.end - batch.start)
    replay_at = run.sent - run.sent[0]
    policy = {"max_batch_size": batcher.max_batch_size, "max_wait": max(batcher.max_wait, wakeup),
              "arrivals": replay_at, "warmup": 0.0, "allow_unstable": True}
    def summary(x: np.ndarray) -> tuple[float, float]:
        return float(np.mean(x)), float(np.percentile(x, 99))

    replayed = simulate_batching(None, in_run_service_time(seen, seed), **policy)
    predicted = simulate_batching(None, forecast, **policy) if forecast else None
    forecast_row = summary(predicted.latencies) if predicted else (math.nan, math.nan)
    row = ValidationRow(load, summary(run.from_send), forecast_row, summary(replayed.latencies))
    sizes, works = np.array([b.size for b in batches]), np.array([b.work for b in batches])
    work_vs_forecast = float(np.nansum(works) / sum(forecast(b) for b in sizes)) if forecast else math.nan
    return LoadNumbers(rate, run.rate(run.intended), run.rate(), run.from_schedule, run.from_send, 1e3 * cpu / n,
                       1e3 * float(np.nansum(works)) / n, len(records) / sum(1 / r.batch_size for r in records), row,
                       (len(batches), len(predicted.batches_size) if predicted else 0, len(replayed.batches_size)),
                       work_vs_forecast)
