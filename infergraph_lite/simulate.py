"""Discrete-event simulation of one batching server (or several sharing a queue).

The policy is Triton's dynamic batcher, the same one :class:`DynamicBatcher`
runs for real: whenever a server is free and at least one request waits, a
batch starts if the queue holds ``max_batch_size`` requests or the oldest
waiting request has waited ``max_wait``; it takes the oldest
``min(queue, max_batch_size)``.  ``max_wait=0`` is greedy batching,
``max_batch_size=1`` a plain FIFO queue, ``max_batch_size=None`` no cap.

Because arrival times are known up front, the simulation jumps from batch to
batch: the next batch's start is a closed-form ``max`` of three times, and its
size one binary search.  The loop runs once per *batch*, not per event, which
is what makes a million requests take about a second.

Introduced in notebook 04 (one server, FIFO) and notebook 05 (batching).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["AIMD", "BatchingResult", "ServiceTime", "UnstableLoadError", "capacity", "service_time_fn",
           "simulate_batching"]

ServiceTime = float | tuple[float, float] | Callable[[int], float]


class UnstableLoadError(ValueError):
    """Requests arrive faster than the servers can possibly serve them: the queue grows without bound."""


def service_time_fn(service_time: ServiceTime) -> Callable[[int], float]:
    """Turn a service-time spec into a function ``b -> seconds``, checking it.

    A number is a constant; ``(alpha, beta)`` means ``alpha + beta * b``.

    >>> service_time_fn((2.0, 0.5))(4)
    4.0
    >>> service_time_fn(-1.0)
    Traceback (most recent call last):
    ...
    ValueError: service_time must be > 0, got -1.0
    """
    if callable(service_time):
        def checked(b: int) -> float:
            t = service_time(b)
            if not (isinstance(t, (int, float, np.floating, np.integer)) and t > 0 and math.isfinite(t)):
                raise ValueError(f"service_time({b}) returned {t!r}; a batch must take a positive, finite time")
            return float(t)
        return checked
    if isinstance(service_time, tuple):
        if len(service_time) != 2:
            raise ValueError(f"service_time as a tuple must be (alpha, beta), got {service_time!r}")
        alpha, beta = map(float, service_time)
        if alpha < 0 or beta < 0 or alpha + beta <= 0 or not math.isfinite(alpha + beta):
            raise ValueError(f"service_time (alpha, beta) must be >= 0 with alpha + beta > 0, got {service_time!r}")
        return lambda b: alpha + beta * b
    t = float(service_time)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"service_time must be > 0, got {service_time!r}")
    return lambda b: t


def capacity(service_time: ServiceTime, max_batch_size: int | None = 1, replicas: int = 1) -> float:
    """The most requests per unit time the servers can finish: ``replicas * max_b b / s(b)``.

    With no cap the best batch is unbounded; for ``(alpha, beta)`` that limit
    is ``1 / beta``.  For a callable with no cap, batches up to 4096 are tried.

    >>> capacity((1.0, 0.25), max_batch_size=4)   # 4 requests every 2 time units
    2.0
    >>> capacity((1.0, 0.25), max_batch_size=None)
    4.0
    """
    if isinstance(service_time, tuple) and max_batch_size is None:
        beta = service_time[1]  # alpha + beta*b per batch: b / s(b) rises towards 1 / beta
        return replicas * (math.inf if beta == 0 else 1.0 / beta)
    if not callable(service_time) and not isinstance(service_time, tuple) and max_batch_size is None:
        return math.inf  # a constant time for any batch: no limit at all
    s = service_time_fn(service_time)
    sizes = range(1, (max_batch_size or 4096) + 1)
    return replicas * max(b / s(b) for b in sizes)


@dataclass
class AIMD:
    """Clipper's adaptive batch cap: additive increase, multiplicative decrease.

    After each batch, if its service time stayed within ``latency_target`` the
    cap grows by ``increase``; otherwise it shrinks to ``(1 - decrease)`` of
    itself.  It needs no model of s(b): it probes for the largest batch that
    meets the target, and keeps probing, so it follows a model whose speed
    changes.  (Crankshaw et al., "Clipper", NSDI 2017, section 4.3.)

    >>> controller = AIMD(latency_target=5.0, decrease=0.5)
    >>> controller.observe(4.0); controller.cap
    2
    >>> controller.observe(6.0); controller.cap
    1
    """

    latency_target: float
    increase: int = 1
    decrease: float = 0.1
    cap: int = 1
    max_size: int = 4096

    def __post_init__(self) -> None:
        _check("AIMD latency_target", self.latency_target)
        if not isinstance(self.increase, int) or self.increase < 1:
            raise ValueError(f"AIMD increase must be an integer >= 1, got {self.increase!r}")
        if not 0 < self.decrease < 1:
            raise ValueError(f"AIMD decrease must be a fraction in (0, 1), got {self.decrease!r}")
        if not isinstance(self.cap, int) or not 1 <= self.cap <= self.max_size:
            raise ValueError(f"AIMD cap must be an integer in [1, max_size={self.max_size}], got {self.cap!r}")

    def observe(self, service_time: float) -> None:
        """Adjust the cap after a batch that took ``service_time``."""
        if service_time <= self.latency_target:
            self.cap = min(self.cap + self.increase, self.max_size)
        else:
            self.cap = max(1, math.floor(self.cap * (1 - self.decrease)))


@dataclass(frozen=True)
class BatchingResult:
    """Per-request times of a simulated run (warm-up already removed) and their summaries.

    Arrays are aligned, one entry per measured request, in arrival order.
    """

    arrival: np.ndarray
    start: np.ndarray          # when the request's batch started service
    finish: np.ndarray         # when its batch finished
    batch_size: np.ndarray     # size of the batch the request was served in
    throughput: float          # requests finished per unit time over the measured window
    utilization: float         # fraction of server time spent serving, over the measured window
    offered_load: float        # arrival rate / capacity (>= 1 means unstable)

    @property
    def latencies(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def queue_times(self) -> np.ndarray:
        """Time from arrival until the request's batch started."""
        return self.start - self.arrival

    @property
    def service_times(self) -> np.ndarray:
        return self.finish - self.start

    @property
    def mean_latency(self) -> float:
        return float(self.latencies.mean())

    @property
    def mean_batch_size(self) -> float:
        """Mean size per *batch* (not per request, which would weight big batches more)."""
        return float(len(self.batch_size) / np.sum(1.0 / self.batch_size))

    def percentile(self, q: float) -> float:
        """The q-th percentile of latency, q in [0, 100] (``percentile(99)`` is p99)."""
        return float(np.percentile(self.latencies, q))


def _check(name: str, value: float, positive: bool = True) -> float:
    if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (positive and value <= 0) or value < 0:
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def simulate_batching(
    arrival_rate: float | None,
    service_time: ServiceTime,
    max_batch_size: int | AIMD | None = 1,
    max_wait: float = 0.0,
    n_requests: int = 100_000,
    seed: int = 0,
    warmup: float = 0.1,
    replicas: int = 1,
    arrivals: Sequence[float] | np.ndarray | None = None,
    allow_unstable: bool = False,
) -> BatchingResult:
    """Simulate a dynamic-batching server under Poisson (or given) arrivals.

    ``arrival_rate`` is in requests per time unit; ``service_time`` is a
    number, ``(alpha, beta)`` for ``alpha + beta * b``, or a callable
    ``b -> time``, all in the same unit.  ``max_batch_size`` is a fixed cap,
    None for no cap, or an :class:`AIMD` controller (a copy is used, so the
    caller's stays as it was; it observes each batch when it is formed, which
    equals "when it finishes" for one replica).  Pass ``arrivals`` (sorted times) to
    replay a trace instead; then ``arrival_rate`` may be None.  The first
    ``warmup`` fraction of requests is dropped from the result.

    An arrival rate at or above :func:`capacity` raises
    :class:`UnstableLoadError` (the averages would depend only on how long
    you simulate); ``allow_unstable=True`` runs it anyway, to measure the
    saturated throughput.

    M/D/1: Poisson arrivals at 0.5 per ms, 1 ms service.  Pollaczek-Khinchine
    says mean latency is 1 + 0.5 * 1 / (2 * 0.5) = 1.5 ms:

    >>> r = simulate_batching(0.5, 1.0, n_requests=200_000)
    >>> round(r.mean_latency, 1), round(r.throughput, 2), round(r.utilization, 2)
    (1.5, 0.5, 0.5)
    """
    controller = dataclasses.replace(max_batch_size) if isinstance(max_batch_size, AIMD) else None
    if controller is not None:
        max_batch_size = controller.max_size  # the most it can ever take, for the capacity check
    elif max_batch_size is not None and (not isinstance(max_batch_size, (int, np.integer)) or max_batch_size < 1):
        raise ValueError(f"max_batch_size must be an integer >= 1, None or an AIMD, got {max_batch_size!r}")
    if not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    max_wait = _check("max_wait", max_wait, positive=False)
    if not (0 <= warmup < 1):
        raise ValueError(f"warmup must be a fraction in [0, 1), got {warmup!r}")
    s = service_time_fn(service_time)

    if arrivals is None:
        rate = _check("arrival_rate", arrival_rate)
        if not isinstance(n_requests, (int, np.integer)) or n_requests < 2:
            raise ValueError(f"n_requests must be an integer >= 2, got {n_requests!r}")
        times = np.random.default_rng(seed).exponential(1.0 / rate, n_requests).cumsum()
    else:
        times = np.asarray(arrivals, dtype=float)
        if times.ndim != 1 or len(times) < 2:
            raise ValueError("arrivals must be a 1-d sequence of at least 2 times")
        if np.any(np.diff(times) < 0) or times[0] < 0 or not np.all(np.isfinite(times)):
            raise ValueError("arrivals must be finite, non-negative and sorted")
        rate = (len(times) - 1) / (times[-1] - times[0]) if times[-1] > times[0] else math.inf
    cap = capacity(service_time, max_batch_size, replicas)
    offered = rate / cap
    if offered >= 1 and not allow_unstable:
        raise UnstableLoadError(
            f"arrival rate {rate:.4g} is at or above the capacity {cap:.4g} "
            f"(replicas * best b/s(b)): offered load {offered:.3f}, the queue grows without bound. "
            "Lower the rate, raise max_batch_size or replicas, or pass allow_unstable=True to measure saturation."
        )

    n = len(times)
    cap_b = n if max_batch_size is None else int(max_batch_size)
    if controller is None and cap_b == 1 and replicas == 1 and not callable(service_time):
        firsts, starts, ends = _fifo_vectorised(times, s(1))
    else:
        firsts, starts, ends = _batch_by_batch(times, s, cap_b, max_wait, replicas, controller,
                                               deterministic=not callable(service_time))
    sizes = np.diff(np.append(firsts, n))
    start_per = np.repeat(starts, sizes)
    end_per = np.repeat(ends, sizes)
    size_per = np.repeat(sizes, sizes)
    skip = int(warmup * n)
    window_start = end_per[:skip].max() if skip else times[0]
    window_end = end_per[skip:].max()
    measured_batches = firsts >= skip
    busy = float(np.sum(ends[measured_batches] - starts[measured_batches]))
    span = window_end - window_start
    return BatchingResult(
        arrival=times[skip:],
        start=start_per[skip:],
        finish=end_per[skip:],
        batch_size=size_per[skip:],
        throughput=float((n - skip) / span) if span > 0 else math.inf,
        utilization=float(busy / (replicas * span)) if span > 0 else 1.0,
        offered_load=float(offered),
    )


def _fifo_vectorised(times: np.ndarray, service: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # One server, batches of one, a fixed service time s: Lindley's recursion
    # d[i] = max(a[i], d[i-1]) + s.  With e[i] = d[i] - (i+1)s it becomes
    # e[i] = max(e[i-1], a[i] - i*s): a running maximum, which numpy does in C.
    index = np.arange(len(times))
    ends = np.maximum.accumulate(times - index * service) + (index + 1) * service
    return index, ends - service, ends


def _batch_by_batch(
    times: np.ndarray,
    s: Callable[[int], float],
    cap_b: int,
    max_wait: float,
    replicas: int,
    controller: AIMD | None,
    deterministic: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # The general case: one loop iteration per batch.  Returns each batch's
    # first request index, start time and end time.
    n = len(times)
    arrival_list = times.tolist()  # bisect on a list is several times faster than np.searchsorted per call
    service_of: dict[int, float] = {}
    free_at = [0.0] * replicas  # a heap of the times each server becomes free
    batch_first: list[int] = []
    batch_start: list[float] = []
    batch_end: list[float] = []
    i = 0
    while i < n:
        if controller is not None:
            cap_b = controller.cap
        free = heapq.heappop(free_at)
        oldest = arrival_list[i]
        full_at = arrival_list[i + cap_b - 1] if i + cap_b - 1 < n else math.inf
        # Start at the first moment the server is free and (the batch is full or the oldest has waited enough).
        start = max(free, oldest, min(full_at, oldest + max_wait))
        size = min(bisect.bisect_right(arrival_list, start, i) - i, cap_b)
        if deterministic:
            duration = service_of.get(size)
            if duration is None:
                duration = service_of[size] = s(size)
        else:
            duration = s(size)
        if controller is not None:
            controller.observe(duration)
        batch_first.append(i)
        batch_start.append(start)
        batch_end.append(start + duration)
        heapq.heappush(free_at, start + duration)
        i += size
    return np.array(batch_first), np.array(batch_start), np.array(batch_end)
