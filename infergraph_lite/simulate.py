"""Discrete-event simulation of one batching server (or several sharing a queue).

The policy is :class:`~infergraph_lite.policy.BatchPolicy` (Triton's dynamic
batcher), the same object :class:`~infergraph_lite.batching.DynamicBatcher`
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .policy import AIMD, BatchPolicy, check_count, check_number
from .stage import Exponential, ServiceTime, capacity, prepare_stages, service_time_fn

__all__ = ["BatchingResult", "GraphResult", "LatencySummary", "StageStats", "UnstableLoadError", "check_arrivals",
           "serve_queue",
           "simulate_batching", "simulate_graph"]


class UnstableLoadError(ValueError):
    """Requests arrive faster than the servers can possibly serve them: the queue grows without bound."""


class LatencySummary:
    """Per-request ``arrival`` and ``finish`` times and the latency summaries every result reports.

    A base for the simulators' frozen result dataclasses, which supply the two arrays.
    """

    arrival: np.ndarray
    finish: np.ndarray

    @property
    def latencies(self) -> np.ndarray:
        """Arrival to finish, per request."""
        return self.finish - self.arrival

    @property
    def mean_latency(self) -> float:
        return float(self.latencies.mean())

    def percentile(self, q: float) -> float:
        """The q-th percentile of latency, q in [0, 100] (``percentile(99)`` is p99)."""
        return float(np.percentile(self.latencies, q))


class _PerRequestTimes(LatencySummary):
    # What BatchingResult and StageStats add: when each request's batch started, and its size.
    start: np.ndarray
    batch_size: np.ndarray

    @property
    def queue_times(self) -> np.ndarray:
        """Time from arrival until the request's batch started."""
        return self.start - self.arrival

    @property
    def service_times(self) -> np.ndarray:
        return self.finish - self.start

    @property
    def mean_batch_size(self) -> float:
        """Mean size per *batch* (not per request, which would weight big batches more)."""
        return float(len(self.batch_size) / np.sum(1.0 / self.batch_size))


@dataclass(frozen=True)
class BatchingResult(_PerRequestTimes):
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
    ``b -> time`` or :class:`~infergraph_lite.stage.Exponential`, all in the
    same unit.  ``max_batch_size`` and ``max_wait`` make the
    :class:`~infergraph_lite.policy.BatchPolicy`: a fixed cap, None for no
    cap, or an :class:`~infergraph_lite.policy.AIMD` controller (the policy
    keeps its own copy, so the caller's stays as it was; it observes each
    batch when it is formed, which equals "when it finishes" for one replica).  Pass ``arrivals`` (sorted times) to
    replay a trace instead; then ``arrival_rate`` may be None.  The first
    ``warmup`` fraction of requests is dropped from the result.

    An arrival rate at or above :func:`~infergraph_lite.stage.capacity` raises
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
    _check_warmup(warmup)
    s = service_time_fn(service_time, np.random.default_rng([seed, 1]))

    times, rate = _arrival_times(arrival_rate, n_requests, seed, arrivals)
    cap = capacity(service_time, policy.largest_cap, replicas)
    offered = rate / cap
    if offered >= 1 and not allow_unstable:
        raise UnstableLoadError(
            f"arrival rate {rate:.4g} is at or above the capacity {cap:.4g} "
            f"(replicas * best b/s(b)): offered load {offered:.3f}, the queue grows without bound. "
            "Lower the rate, raise max_batch_size or replicas, or pass allow_unstable=True to measure saturation."
        )
    deterministic = not callable(service_time) and not isinstance(service_time, Exponential)
    firsts, starts, ends, caps = serve_queue(times, s, policy, replicas, deterministic)

    n = len(times)
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
        batches_first=firsts,
        batches_size=sizes,
        batches_start=starts,
        batches_end=ends,
        batches_cap=caps,
    )


def _check_warmup(warmup: object) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not (0 <= warmup < 1):
        raise ValueError(f"warmup must be a fraction in [0, 1), got {warmup!r}")


def _arrival_times(
    arrival_rate: float | None, n_requests: int, seed: int, arrivals: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, float]:
    # The simulators' arrivals: Poisson at arrival_rate (seeded), or a given trace and its mean rate.
    if arrivals is None:
        rate = check_number("arrival_rate", arrival_rate)
        if isinstance(n_requests, bool) or not isinstance(n_requests, (int, np.integer)) or n_requests < 2:
            raise ValueError(f"n_requests must be an integer >= 2, got {n_requests!r}")
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
    (then each size is computed once).  This is the simulator's core.

    >>> firsts, starts, ends, caps = serve_queue(np.array([0.0, 0.1, 0.2, 5.0]), lambda b: 1.0, BatchPolicy(None))
    >>> firsts.tolist(), starts.tolist(), ends.tolist()
    ([0, 1, 3], [0.0, 1.0, 5.0], [1.0, 2.0, 6.0])
    """
    if policy.controller is None and policy.cap == 1 and replicas == 1 and deterministic:
        firsts, starts, ends = _fifo_vectorised(times, s(1))
        return firsts, starts, ends, np.ones(len(firsts), dtype=int)
    return _batch_by_batch(times, s, policy, replicas, deterministic)


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
    policy: BatchPolicy,
    replicas: int,
    deterministic: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # The general case: one loop iteration per batch.  Arrival times are known up front, so the next
    # batch's start comes from the policy in closed form and its size from one binary search.
    n = len(times)
    arrival_list = times.tolist()  # bisect on a list is several times faster than np.searchsorted per call
    service_of: dict[int, float] = {}
    free_at = [0.0] * replicas  # a heap of the times each server becomes free
    batch_first: list[int] = []
    batch_start: list[float] = []
    batch_end: list[float] = []
    batch_cap: list[int] = []
    i = 0
    while i < n:
        cap = policy.cap
        free = heapq.heappop(free_at)
        full_at = arrival_list[i + cap - 1] if cap is not None and i + cap - 1 < n else math.inf
        start = policy.start_time(free, arrival_list[i], full_at)
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
        heapq.heappush(free_at, start + duration)
        i += size
    return np.array(batch_first), np.array(batch_start), np.array(batch_end), np.array(batch_cap)


# --- a graph of stages (notebook 06) -------------------------------------------------------------------


@dataclass(frozen=True)
class StageStats(_PerRequestTimes):
    """One stage of a simulated graph: per-request times and their summaries.

    The per-request arrays hold the measured requests (warm-up removed) in
    *request* order, aligned with :attr:`GraphResult.arrival`: ``arrival`` is
    when the request's job reached this stage (every dependency done for it),
    ``start`` and ``finish`` when its batch started and ended here.  The
    ``batches_*`` arrays describe every batch of the whole run in the order
    batches started.
    """

    name: str
    arrival: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    batch_size: np.ndarray      # size of the batch each measured request was served in
    replicas: int
    capacity: float             # replicas * best b / s(b) (inf for a stage that costs nothing)
    offered_load: float         # the graph's arrival rate / capacity
    utilization: float          # fraction of the replicas' time spent serving, over the measured window
    batches_size: np.ndarray
    batches_start: np.ndarray
    batches_end: np.ndarray

    @property
    def mean_wait(self) -> float:
        """Mean time a request waited in this stage's queue (including a batch window)."""
        return float(self.queue_times.mean())

    @property
    def mean_service(self) -> float:
        """Mean service time of the batch a request rode in."""
        return float(self.service_times.mean())


@dataclass(frozen=True)
class GraphResult(LatencySummary):
    """End-to-end times of a simulated graph (warm-up removed), and every stage's :class:`StageStats`.

    A request's latency runs from its arrival until the *last* sink (a stage
    nothing depends on) has finished it.
    """

    arrival: np.ndarray
    finish: np.ndarray
    throughput: float            # requests finished per unit time over the measured window
    stages: dict[str, StageStats]
    sinks: tuple[str, ...]

    @property
    def offered_load(self) -> float:
        """The highest offered load of any stage (>= 1: the graph cannot keep up)."""
        return max(s.offered_load for s in self.stages.values())

    @property
    def bottleneck(self) -> str:
        """The stage whose replicas are busiest (highest measured utilization); ties go to the earlier stage.

        It is the stage that saturates first as the load rises (with batching,
        ``offered_load`` says how far that is: a batching stage is busier than
        its offered load at light load, since its batches are small).
        """
        return max(self.stages, key=lambda name: self.stages[name].utilization)


def simulate_graph(
    stages: Mapping[str, tuple[Any, Sequence[str]]],
    arrival_rate: float | None,
    n_requests: int = 100_000,
    seed: int = 0,
    warmup: float = 0.1,
    inputs: Iterable[str] = ("request",),
    arrivals: Sequence[float] | np.ndarray | None = None,
    allow_unstable: bool = False,
) -> GraphResult:
    """Simulate a graph of :class:`~infergraph_lite.stage.Stage` s under Poisson (or given) arrivals.

    ``stages`` is the seed's shape with a Stage in place of the function,
    ``{name: (Stage(service_time=...), [dependencies])}``; a dependency is
    another stage or one of ``inputs``.  Every request visits every stage.  A
    request's job enters a stage when all its dependencies have finished it
    (a join waits for its slowest branch), then queues under the stage's
    :class:`~infergraph_lite.policy.BatchPolicy` for one of its ``replicas``
    — exactly as in :func:`simulate_batching`, whose core
    (:func:`serve_queue`) serves each stage's queue.  Because every queue is
    FIFO and the graph has no cycles, the stages can be simulated one after
    another in topological order: a stage's arrival times are the element-wise
    maximum of its dependencies' finish times.

    Exponential service times draw from a generator per stage, seeded with
    ``[seed, 1 + position of the stage in the dict]`` (so a one-stage graph
    repeats :func:`simulate_batching` with the same seed).  The first
    ``warmup`` fraction of requests (by arrival) is left out of every
    statistic.  Bad stages or a bad graph raise, naming the node, before
    anything runs; so does a stage that cannot keep up
    (:class:`UnstableLoadError`) unless ``allow_unstable=True``.

    Two exponential stages in tandem at 60 % and 30 % load: by Jackson's
    theorem the mean latency is 1/(1 - 0.6) + 0.5/(1 - 0.3) = 3.21 ms.

    >>> from infergraph_lite.stage import Exponential, Stage
    >>> tandem = {"a": (Stage(service_time=Exponential(1.0)), ["request"]),
    ...           "b": (Stage(service_time=Exponential(0.5)), ["a"])}
    >>> r = simulate_graph(tandem, arrival_rate=0.6, n_requests=200_000)
    >>> round(r.mean_latency, 1), r.bottleneck, round(r.stages["a"].utilization, 1)
    (3.2, 'a', 0.6)
    """
    plan = prepare_stages(stages, inputs, need="service_time")
    _check_warmup(warmup)
    times, rate = _arrival_times(arrival_rate, n_requests, seed, arrivals)

    capacities = {name: plan.nodes[name][0].capacity() for name in plan.order}
    loads = {name: rate / cap if cap > 0 else math.inf for name, cap in capacities.items()}
    unstable = sorted((name for name in plan.order if loads[name] >= 1), key=lambda name: -loads[name])
    if unstable and not allow_unstable:
        worst = unstable[0]
        others = f" (also unstable: {', '.join(repr(u) for u in unstable[1:])})" if len(unstable) > 1 else ""
        raise UnstableLoadError(
            f"stage {worst!r} cannot keep up: arrival rate {rate:.4g} is at or above its capacity "
            f"{capacities[worst]:.4g} (replicas * best b/s(b)), offered load {loads[worst]:.3f}{others}. "
            "Add replicas or batching to that stage, lower the rate, or pass allow_unstable=True."
        )

    n = len(times)
    position = {name: k for k, name in enumerate(plan.nodes)}
    served: dict[str, tuple[np.ndarray, ...]] = {}
    for name in plan.order:
        stage, deps = plan.nodes[name]
        sources = [served[d][2] if d in plan.nodes else times for d in dict.fromkeys(deps)] or [times]
        arrive = sources[0] if len(sources) == 1 else np.maximum.reduce(sources)
        rng = np.random.default_rng([seed, 1 + position[name]])
        served[name] = (arrive, *_serve_stage(arrive, stage, rng))

    sinks = tuple(name for name in plan.order if not plan.dependents[name])
    done = served[sinks[0]][2] if len(sinks) == 1 else np.maximum.reduce([served[s][2] for s in sinks])
    skip = int(warmup * n)
    window_start = done[:skip].max() if skip else times[0]
    window_end = done[skip:].max()
    span = window_end - window_start
    stats = {}
    for name in plan.nodes:  # in the order the stages were given
        arrive, start, finish, size, b_size, b_start, b_end = served[name]
        replicas = plan.nodes[name][0].replicas
        busy = float(np.sum(np.clip(b_end, window_start, window_end) - np.clip(b_start, window_start, window_end)))
        stats[name] = StageStats(
            name=name, arrival=arrive[skip:], start=start[skip:], finish=finish[skip:], batch_size=size[skip:],
            replicas=replicas, capacity=capacities[name], offered_load=float(loads[name]),
            utilization=float(busy / (replicas * span)) if span > 0 else 1.0,
            batches_size=b_size, batches_start=b_start, batches_end=b_end,
        )
    return GraphResult(
        arrival=times[skip:],
        finish=done[skip:],
        throughput=float((n - skip) / span) if span > 0 else math.inf,
        stages=stats,
        sinks=sinks,
    )


def _serve_stage(arrive: np.ndarray, stage: Any, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    # Serve one stage's queue: sort its arrivals (stable, so simultaneous ones keep request order), run the
    # shared core, and map each request's start and finish back to request order.  Returns per request
    # (start, finish, batch size) and per batch (size, start, end).
    n = len(arrive)
    in_order = bool(np.all(arrive[1:] >= arrive[:-1]))
    order = None if in_order else np.argsort(arrive, kind="stable")
    times = arrive if order is None else arrive[order]
    service, policy, replicas = stage.service_time, stage.policy(), stage.replicas
    deterministic = not callable(service) and not isinstance(service, Exponential)
    fifo = policy.controller is None and policy.cap == 1
    if fifo and replicas == 1 and isinstance(service, Exponential):
        starts, ends = _fifo_varying(times, rng.exponential(service.mean, n))
        firsts = None
    elif fifo and deterministic:
        starts, ends = _fifo_replicas(times, service_time_fn(service, allow_zero=True)(1), replicas)
        firsts = None
    else:
        s = service_time_fn(service, rng, allow_zero=True)
        firsts, starts, ends, _ = serve_queue(times, s, policy, replicas, deterministic)
        if len(firsts) == n:
            firsts = None
    if firsts is None:  # one request per batch
        b_size = np.ones(n, dtype=int)
        start_sorted, end_sorted, size_sorted = starts, ends, b_size
    else:
        b_size = np.diff(np.append(firsts, n))
        start_sorted, end_sorted = np.repeat(starts, b_size), np.repeat(ends, b_size)
        size_sorted = np.repeat(b_size, b_size)
    if order is None:
        return start_sorted, end_sorted, size_sorted, b_size, starts, ends
    start, finish, size = np.empty(n), np.empty(n), np.empty(n, dtype=int)
    start[order], finish[order], size[order] = start_sorted, end_sorted, size_sorted
    return start, finish, size, b_size, starts, ends


def _fifo_varying(times: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # One server, batches of one, the i-th request served for service[i]: Lindley's recursion
    # d[i] = max(a[i], d[i-1]) + s[i].  With S the running sum of s and e[i] = d[i] - S[i] it becomes
    # e[i] = max(e[i-1], a[i] - S[i-1]), a running maximum (the same trick as _fifo_vectorised).
    total = np.cumsum(service)
    ends = np.maximum.accumulate(times - (total - service)) + total
    return _exact_fifo_step(times, ends, service, 1)


def _fifo_replicas(times: np.ndarray, service: float, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    # c servers, batches of one, a fixed service time s: requests finish in the order they start, so the
    # server that takes request i is the one that served request i - c, and d[i] = max(a[i], d[i-c]) + s.
    # That is c interleaved one-server recursions, one per row of a (c, length) layout, each as in
    # _fifo_vectorised (a running maximum along a contiguous row, which numpy does fast).
    n = len(times)
    length = -(-n // replicas)
    padded = np.concatenate([times, np.full(length * replicas - n, times[-1])])
    lanes = np.ascontiguousarray(padded.reshape(length, replicas).T)  # lane r holds requests r, r + c, ...
    index = np.arange(length)
    lanes -= index * service
    np.maximum.accumulate(lanes, axis=1, out=lanes)
    lanes += (index + 1) * service
    ends = lanes.T.ravel()[:n]
    return _exact_fifo_step(times, ends, service, replicas)


def _exact_fifo_step(
    times: np.ndarray, ends: np.ndarray, service: np.ndarray | float, replicas: int
) -> tuple[np.ndarray, np.ndarray]:
    # The running maximum rounds differently from the event-by-event sum start + s, by a few units in the
    # last place; one more step of the recursion from its result makes start = max(arrival, end c requests
    # before) and end = start + s hold exactly, so no request starts (by a rounding error) before it arrives.
    previous = np.concatenate([np.full(min(replicas, len(times)), -np.inf), ends[:-replicas]])
    starts = np.maximum(times, previous)
    return starts, starts + service
