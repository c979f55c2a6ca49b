"""Discrete-event simulation of one batching server (or several sharing a queue).

The policy is :class:`~infergraph_lite.core.policy.BatchPolicy` (Triton's dynamic
batcher), the same object :class:`~infergraph_lite.serving.batcher.DynamicBatcher`
calls for real: whenever a server is free and at least one request waits, a
batch starts if the queue holds ``max_batch_size`` requests or the oldest
waiting request has waited ``max_wait``; it takes the oldest
``min(queue, max_batch_size)``.

Because arrival times are known up front, the simulation jumps from batch to
batch: the next batch's start is a closed-form ``max`` of three times, and its
size one binary search.  The loop runs once per *batch*, not per event, which
is what makes a million requests take about a second.

Introduced in notebook 04 (one server, FIFO) and notebook 05 (batching);
:func:`simulate_graph` (notebook 06) serves a whole graph of stages, stage by
stage, with the same core.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from infergraph_lite.core.arguments import check_count, check_fraction, check_int, check_number
from infergraph_lite.core.metrics import PerRequestTimes, busy_fraction
from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.core.stage import Exponential, ServiceTime, capacity, service_time_fn

__all__ = ["BatchHook", "BatchingResult", "QueueState", "UnstableLoadError", "arrival_times", "batch_by_batch",
           "check_arrivals", "check_warmup", "is_deterministic", "serve_queue", "simulate_batching"]


class UnstableLoadError(ValueError):
    """Requests arrive faster than the servers can possibly serve them: the queue grows without bound."""


@dataclass(frozen=True)
class BatchingResult(PerRequestTimes):
    """Per-request times of a simulated run (warm-up already removed) and their summaries.

    The per-request arrays are aligned, one entry per measured request, in
    arrival order.  The ``batches_*`` arrays describe every batch of the whole
    run, warm-up included, in the order batches started: the index of its
    first (oldest) request in the full arrival sequence, its size, start and
    end, and the cap the policy had when it formed (an AIMD's moves).
    """

    arrival: np.ndarray
    start: np.ndarray          # when the request's batch started service
    finish: np.ndarray         # when its batch finished
    batch_size: np.ndarray     # size of the batch the request was served in
    throughput: float          # requests finished per unit time over the measured window
    utilization: float         # fraction of server time spent serving, over the measured window
    offered_load: float        # arrival rate / capacity (>= 1 means unstable)
    batches_first: np.ndarray  # per batch: index of its oldest request among all arrivals
    batches_size: np.ndarray   # per batch: how many requests it took
    batches_start: np.ndarray  # per batch: when it started
    batches_end: np.ndarray    # per batch: when it finished
    batches_cap: np.ndarray    # per batch: the cap when it formed (-1: no cap)


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
    number, ``(alpha, beta)`` for ``alpha + beta * b``, a callable
    ``b -> time`` or :class:`~infergraph_lite.core.stage.Exponential`, all in the
    same unit.  ``max_batch_size`` and ``max_wait`` make the
    :class:`~infergraph_lite.core.policy.BatchPolicy`: a fixed cap, None for no
    cap, or an :class:`~infergraph_lite.core.policy.AIMD` controller (the policy
    keeps its own copy, so the caller's stays as it was; it observes each
    batch when it is formed, which equals "when it finishes" for one replica).  Pass ``arrivals`` (sorted times) to
    replay a trace instead; then ``arrival_rate`` may be None.  The first
    ``warmup`` fraction of requests is dropped from the result.

    An arrival rate at or above :func:`~infergraph_lite.core.stage.capacity` raises
    :class:`UnstableLoadError` (the averages would depend only on how long
    you simulate); ``allow_unstable=True`` runs it anyway, to measure the
    saturated throughput.

    M/D/1: Poisson arrivals at 0.5 per ms, 1 ms service.  Pollaczek-Khinchine
    says mean latency is 1 + 0.5 * 1 / (2 * 0.5) = 1.5 ms:

    >>> r = simulate_batching(0.5, 1.0, n_requests=200_000)
    >>> round(r.mean_latency, 1), round(r.throughput, 2), round(r.utilization, 2)
    (1.5, 0.5, 0.5)
    """
    policy = BatchPolicy(max_batch_size, max_wait)  # validates both; its own copy of an AIMD
    replicas = check_count("replicas", replicas) or 1
    check_warmup(warmup)
    s = service_time_fn(service_time, np.random.default_rng([seed, 1]))

    times, rate = arrival_times(arrival_rate, n_requests, seed, arrivals)
    cap = capacity(service_time, policy.largest_cap, replicas)
    offered = rate / cap
    if offered >= 1 and not allow_unstable:
        raise UnstableLoadError(
            f"arrival rate {rate:.4g} is at or above the capacity {cap:.4g} "
            f"(replicas * best b/s(b)): offered load {offered:.3f}, the queue grows without bound. "
            "Lower the rate, raise max_batch_size or replicas, or pass allow_unstable=True to measure saturation."
        )
    firsts, starts, ends, caps = serve_queue(times, s, policy, replicas, is_deterministic(service_time))

    n = len(times)
    sizes = np.diff(np.append(firsts, n))
    start_per = np.repeat(starts, sizes)
    end_per = np.repeat(ends, sizes)
    size_per = np.repeat(sizes, sizes)
    skip = int(warmup * n)
    window_start = end_per[:skip].max() if skip else times[0]
    window_end = end_per[skip:].max()
    span = window_end - window_start
    return BatchingResult(
        arrival=times[skip:],
        start=start_per[skip:],
        finish=end_per[skip:],
        batch_size=size_per[skip:],
        throughput=float((n - skip) / span) if span > 0 else math.inf,
        utilization=busy_fraction(starts, ends, replicas, window_start, window_end),
        offered_load=float(offered),
        batches_first=firsts,
        batches_size=sizes,
        batches_start=starts,
        batches_end=ends,
        batches_cap=caps,
    )


def check_warmup(warmup: object) -> None:
    check_fraction("warmup", warmup, allow_zero=True)


def arrival_times(
    arrival_rate: float | None, n_requests: int, seed: int, arrivals: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, float]:
    # The simulators' arrivals: Poisson at arrival_rate (seeded), or a given trace and its mean rate.
    if arrivals is None:
        rate = check_number("arrival_rate", arrival_rate)
        n_requests = check_int("n_requests", n_requests, minimum=2)  # type: ignore[assignment]
        return np.random.default_rng(seed).exponential(1.0 / rate, n_requests).cumsum(), rate
    times = check_arrivals(arrivals)
    return times, (len(times) - 1) / (times[-1] - times[0]) if times[-1] > times[0] else math.inf


def check_arrivals(arrivals: Sequence[float] | np.ndarray) -> np.ndarray:
    """Return ``arrivals`` as a float array if it is 1-d, finite, >= 0 and sorted, with at least 2 times.

    >>> check_arrivals([0.0, 1.0, 0.5])
    Traceback (most recent call last):
    ...
    ValueError: arrivals must be finite, non-negative and sorted
    """
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or len(times) < 2:
        raise ValueError("arrivals must be a 1-d sequence of at least 2 times")
    if not np.all(np.isfinite(times)) or times[0] < 0 or np.any(np.diff(times) < 0):
        raise ValueError("arrivals must be finite, non-negative and sorted")
    return times


def is_deterministic(service_time: ServiceTime) -> bool:
    """Whether a service-time spec always gives the same time for the same batch size.

    A number or ``(alpha, beta)`` is; a callable (it may draw) and an
    :class:`~infergraph_lite.core.stage.Exponential` are not.  The simulators then compute each batch size's
    time once.

    >>> is_deterministic((2.0, 0.15)), is_deterministic(Exponential(1.0)), is_deterministic(lambda b: 1.0)
    (True, False, False)
    """
    return not callable(service_time) and not isinstance(service_time, Exponential)


def serve_queue(
    times: np.ndarray,
    s: Callable[[int], float],
    policy: BatchPolicy,
    replicas: int = 1,
    deterministic: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Serve sorted arrival ``times`` from one queue with ``replicas`` servers under ``policy``.

    Returns four arrays, one entry per batch in the order batches start: the
    index of its first request, its start, its end, and the policy's cap when
    it formed (-1 for none).  ``s(b)`` is a batch's service time;
    ``deterministic`` says it always returns the same time for the same ``b``
    (then each size is computed once).  This is the simulator's core: one
    server and batches of one take a vectorised path, everything else
    :func:`batch_by_batch`.

    >>> firsts, starts, ends, caps = serve_queue(np.array([0.0, 0.1, 0.2, 5.0]), lambda b: 1.0, BatchPolicy(None))
    >>> firsts.tolist(), starts.tolist(), ends.tolist()
    ([0, 1, 3], [0.0, 1.0, 5.0], [1.0, 2.0, 6.0])
    """
    if policy.controller is None and policy.cap == 1 and replicas == 1 and deterministic:
        firsts, starts, ends = _fifo_vectorised(times, s(1))
        return firsts, starts, ends, np.ones(len(firsts), dtype=int)
    return batch_by_batch(times, s, policy, replicas, deterministic)


def _fifo_vectorised(times: np.ndarray, service: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # One server, batches of one, a fixed service time s: Lindley's recursion
    # d[i] = max(a[i], d[i-1]) + s.  With e[i] = d[i] - (i+1)s it becomes
    # e[i] = max(e[i-1], a[i] - i*s): a running maximum, which numpy does in C.
    index = np.arange(len(times))
    ends = np.maximum.accumulate(times - index * service) + (index + 1) * service
    return index, ends - service, ends


@dataclass
class QueueState:
    """What a :data:`BatchHook` sees of :func:`batch_by_batch`'s loop, and may change.

    ``free_at`` is a heap (:mod:`heapq`) of the times each server is next free; a hook adds a server by
    pushing the time it can start, and removes the one free first by popping it.  ``first``, ``start`` and
    ``end`` list the batches placed so far (the index of each one's oldest request, its start and its end);
    a hook only reads them.
    """

    free_at: list[float]
    first: list[int]
    start: list[float]
    end: list[float]


BatchHook = Callable[[float, int, QueueState], bool]
"""``hook(start, next_request, state) -> changed``, called before each batch is placed.

``start`` is when the next batch would start on the server free first (``state.free_at[0]``),
``next_request`` the index of its oldest request (= requests placed so far).  The hook may change the
fleet in ``state.free_at``; it returns True when it did (the loop then works the start out again), False
to let the batch start.
"""


def batch_by_batch(
    times: np.ndarray,
    s: Callable[[int], float],
    policy: BatchPolicy,
    replicas: int = 1,
    deterministic: bool = True,
    on_batch_start: BatchHook | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The simulator's batch loop: one iteration per batch, on ``replicas`` servers sharing one queue.

    Arguments and result as :func:`serve_queue`.  Arrival times are known up front, so the next batch's start
    comes from the policy in closed form (on the server free first) and its size from one binary search.
    ``on_batch_start`` (a :data:`BatchHook`) may change the number of servers before each batch: the
    autoscaler (:func:`~infergraph_lite.simulation.autoscale.simulate_autoscaling`) drives this loop with it.

    Two servers, greedy batches of up to 2: the second server takes request 1 while the first is busy, and
    request 2 waits for the first to be free:

    >>> firsts, starts, ends, caps = batch_by_batch(np.array([0.0, 0.1, 0.2, 5.0]), lambda b: 1.0,
    ...                                             BatchPolicy(2), replicas=2)
    >>> firsts.tolist(), starts.tolist(), ends.tolist()
    ([0, 1, 2, 3], [0.0, 0.1, 1.0, 5.0], [1.0, 1.1, 2.0, 6.0])
    """
    n = len(times)
    arrival_list = times.tolist()  # bisect on a list is several times faster than np.searchsorted per call
    service_of: dict[int, float] = {}
    state = QueueState([0.0] * replicas, [], [], [])
    free_at, batch_first, batch_start, batch_end = state.free_at, state.first, state.start, state.end
    batch_cap: list[int] = []
    i = 0
    while i < n:
        cap = policy.cap
        full_at = arrival_list[i + cap - 1] if cap is not None and i + cap - 1 < n else math.inf
        start = policy.start_time(free_at[0], arrival_list[i], full_at)
        if on_batch_start is not None and on_batch_start(start, i, state):
            continue
        size = policy.take(bisect.bisect_right(arrival_list, start, i) - i)
        if deterministic:
            duration = service_of.get(size)
            if duration is None:
                duration = service_of[size] = s(size)
        else:
            duration = s(size)
        policy.observe(duration, size)  # at formation: for one replica the same as when it finishes
        batch_first.append(i)
        batch_start.append(start)
        batch_end.append(start + duration)
        batch_cap.append(-1 if cap is None else cap)
        heapq.heapreplace(free_at, start + duration)  # the server free first takes the batch
        i += size
    return np.array(batch_first), np.array(batch_start), np.array(batch_end), np.array(batch_cap)
