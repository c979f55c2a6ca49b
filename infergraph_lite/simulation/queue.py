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
stage, with the same core, and the autoscaler
(:func:`~infergraph_lite.simulation.autoscale.simulate_autoscaling`) drives the
same loop, :func:`batch_by_batch`, through a hook that may change the number of
servers before each batch.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from infergraph_lite.core.arguments import check_count, check_fraction, check_int, check_number
from infergraph_lite.core.metrics import LatencySummary, PerRequestTimes, busy_fraction
from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.core.stage import Exponential, ServiceTime, capacity, service_time_fn

__all__ = ["REFUSED", "SERVED", "TIMED_OUT", "BatchHook", "BatchingResult", "QueueState", "SheddingSummary",
           "UnstableLoadError", "arrival_times", "batch_by_batch", "check_arrivals", "check_warmup", "is_deterministic",
           "serve_queue", "simulate_batching", "spread_batches"]


class UnstableLoadError(ValueError):
    """Requests arrive faster than the servers can possibly serve them: the queue grows without bound."""


class SheddingSummary(LatencySummary):
    """What shedding cost: the fraction of requests refused or timed out, and the goodput.

    A base for results with per-request ``refused`` and ``timed_out`` masks and a ``throughput`` of answers.
    """

    refused: np.ndarray
    timed_out: np.ndarray
    throughput: float

    @property
    def dropped_fraction(self) -> float:
        """The fraction of measured requests never answered (refused, or timed out while waiting)."""
        return float(np.mean(self.refused | self.timed_out)) if len(self.refused) else 0.0

    def goodput(self, slo: float) -> float:
        """Answers within ``slo`` (same unit as the times) per time unit: ``throughput`` x fraction answered
        within it."""
        latencies = self.latencies
        return float(self.throughput * np.mean(latencies <= slo)) if len(latencies) else 0.0


@dataclass(frozen=True)
class BatchingResult(PerRequestTimes, SheddingSummary):
    """Per-request times of a simulated run (warm-up already removed) and their summaries.

    The per-request arrays are aligned, one entry per measured request, in
    arrival order.  The ``batches_*`` arrays describe every batch of the whole
    run, warm-up included, in the order batches started: the index of its
    first (oldest) request in the full arrival sequence, its size, start and
    end, and the cap the policy had when it formed (an AIMD's moves).

    Under ``max_queue_size`` or ``queue_timeout`` some requests are never served: ``refused`` (the queue was full
    when it arrived) and ``timed_out`` (still waiting at its deadline) mark them, and their ``start`` and
    ``finish`` are NaN and ``batch_size`` 0.  Every latency summary (``latencies``, ``mean_latency``,
    ``percentile``) and ``throughput`` count the answered requests only; ``dropped_fraction`` and
    :meth:`goodput` say what the shedding cost.
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
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))    # per request: queue full
    timed_out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # per request: deadline passed


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
    max_queue_size: int | None = None,
    queue_timeout: float | None = None,
    window: str = "oldest_request",
) -> BatchingResult:
    """Simulate a dynamic-batching server under Poisson (or given) arrivals.

    ``arrival_rate`` is in requests per time unit; ``service_time`` is a
    number, ``(alpha, beta)`` for ``alpha + beta * b``, a callable
    ``b -> time`` or :class:`~infergraph_lite.core.stage.Exponential`, all in the
    same unit.  ``max_batch_size`` and ``max_wait`` make the
    :class:`~infergraph_lite.core.policy.BatchPolicy`: a fixed cap, None for no
    cap, or an :class:`~infergraph_lite.core.policy.AIMD` controller (the policy
    keeps its own copy, so the caller's stays as it was; it observes each
    batch when it finishes, as the real batcher's does).  ``window`` is the policy's rule for when
    ``max_wait`` starts: ``"oldest_request"`` (Triton's) or ``"first_pick"`` (Ray Serve's ``@serve.batch``).
    Pass ``arrivals`` (sorted times) to
    replay a trace instead; then ``arrival_rate`` may be None.  The first
    ``warmup`` fraction of requests is dropped from the result.

    An arrival rate at or above :func:`~infergraph_lite.core.stage.capacity` raises
    :class:`UnstableLoadError` (the averages would depend only on how long
    you simulate); ``allow_unstable=True`` runs it anyway, to measure the
    saturated throughput.

    Overload can be shed instead of queued, as Triton's ``default_queue_policy`` does: ``max_queue_size=K``
    refuses an arrival that finds K requests waiting (those being served do not count), ``queue_timeout=D`` drops
    a request still waiting D after it arrived (``default_timeout_microseconds``, ``timeout_action:
    REJECT``).  Either keeps the queue bounded, so any arrival rate is allowed.  One exponential server
    with K = 4 waiting is M/M/1/5, whose blocking probability at load 2 is (1 - 2) 2^5 / (1 - 2^6) = 0.508:

    >>> r = simulate_batching(2.0, Exponential(1.0), max_queue_size=4, n_requests=200_000)
    >>> round(r.refused.mean(), 2), round(r.throughput, 2)   # the server answers 2 * (1 - 0.508) per ms
    (0.51, 0.98)

    M/D/1: Poisson arrivals at 0.5 per ms, 1 ms service.  Pollaczek-Khinchine
    says mean latency is 1 + 0.5 * 1 / (2 * 0.5) = 1.5 ms:

    >>> r = simulate_batching(0.5, 1.0, n_requests=200_000)
    >>> round(r.mean_latency, 1), round(r.throughput, 2), round(r.utilization, 2)
    (1.5, 0.5, 0.5)
    """
    policy = BatchPolicy(max_batch_size, max_wait, window)  # validates them; its own copy of an AIMD
    replicas = check_count("replicas", replicas) or 1
    check_warmup(warmup)
    s = service_time_fn(service_time, np.random.default_rng([seed, 1]))

    times, rate = arrival_times(arrival_rate, n_requests, seed, arrivals)
    cap = capacity(service_time, policy.largest_cap, replicas)
    offered = rate / cap
    shedding = max_queue_size is not None or queue_timeout is not None
    if shedding:
        max_queue_size = check_count("max_queue_size", max_queue_size, allow_none=True)
        queue_timeout = None if queue_timeout is None else check_number("queue_timeout", queue_timeout, positive=False)
    if offered >= 1 and not allow_unstable and not shedding:
        raise UnstableLoadError(
            f"arrival rate {rate:.4g} is at or above the capacity {cap:.4g} "
            f"(replicas * best b/s(b)): offered load {offered:.3f}, the queue grows without bound. "
            "Lower the rate, raise max_batch_size or replicas, or pass allow_unstable=True to measure saturation."
        )
    n = len(times)
    outcome = np.zeros(n, dtype=np.int8) if shedding else None
    firsts, starts, ends, caps = serve_queue(times, s, policy, replicas, is_deterministic(service_time),
                                             max_queue_size, queue_timeout, outcome)
    if outcome is None:
        sizes = np.diff(np.append(firsts, n))
        start_per = np.repeat(starts, sizes)
        end_per = np.repeat(ends, sizes)
        size_per = np.repeat(sizes, sizes)
    else:
        start_per, end_per, size_per, sizes = spread_batches(outcome == SERVED, firsts, starts, ends)
    skip = int(warmup * n)
    window_start = np.nanmax(end_per[:skip], initial=times[0]) if skip else times[0]
    window_end = np.nanmax(end_per[skip:], initial=window_start)
    span = window_end - window_start
    answered = n - skip if outcome is None else int(np.count_nonzero(outcome[skip:] == SERVED))
    return BatchingResult(
        arrival=times[skip:],
        start=start_per[skip:],
        finish=end_per[skip:],
        batch_size=size_per[skip:],
        throughput=float(answered / span) if span > 0 else math.inf,
        utilization=busy_fraction(starts, ends, replicas, window_start, window_end),
        offered_load=float(offered),
        batches_first=firsts,
        batches_size=sizes,
        batches_start=starts,
        batches_end=ends,
        batches_cap=caps,
        refused=np.zeros(n - skip, dtype=bool) if outcome is None else outcome[skip:] == REFUSED,
        timed_out=np.zeros(n - skip, dtype=bool) if outcome is None else outcome[skip:] == TIMED_OUT,
    )


def spread_batches(
    served: np.ndarray, firsts: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per request, the start, end and size of its batch (NaN, NaN, 0 if not ``served``); and each batch's size.

    Each batch takes the next served requests from its first one (what :func:`batch_by_batch` does when it
    sheds load), so a batch's size is how many served requests lie between its first and the next batch's.

    >>> start, end, size, sizes = spread_batches(np.array([True, True, False, True]), np.array([0, 3]),
    ...                                          np.array([0.0, 2.0]), np.array([1.0, 3.0]))
    >>> start.tolist(), size.tolist(), sizes.tolist()
    ([0.0, 0.0, nan, 2.0], [2, 2, 0, 1], [2, 1])
    """
    n = len(served)
    served_index = np.flatnonzero(served)
    sizes = np.diff(np.append(np.searchsorted(served_index, firsts), len(served_index)))
    start, end, size = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=int)
    start[served_index] = np.repeat(starts, sizes)
    end[served_index] = np.repeat(ends, sizes)
    size[served_index] = np.repeat(sizes, sizes)
    return start, end, size, sizes


def check_warmup(warmup: object) -> None:
    check_fraction("warmup", warmup, allow_zero=True)


def arrival_times(
    arrival_rate: float | None, n_requests: int, seed: int, arrivals: Sequence[float] | np.ndarray | None
) -> tuple[np.ndarray, float]:
    # The simulators' arrivals: Poisson at arrival_rate (seeded), or a given trace and its mean rate.
    if arrivals is None:
        rate = check_number("arrival_rate", arrival_rate)
        n_requests = check_int("n_requests", n_requests, minimum=2)
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
    max_queue_size: int | None = None,
    queue_timeout: float | None = None,
    outcome: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Serve sorted arrival ``times`` from one queue with ``replicas`` servers under ``policy``.

    Returns four arrays, one entry per batch in the order batches start: the
    index of its first request, its start, its end, and the policy's cap when
    it formed (-1 for none).  ``s(b)`` is a batch's service time;
    ``deterministic`` says it always returns the same time for the same ``b``
    (then each size is computed once).  This is the simulator's core: one
    server and batches of one take a vectorised path, everything else
    :func:`batch_by_batch` (also whenever ``max_queue_size`` or ``queue_timeout`` sheds load: see there).

    >>> firsts, starts, ends, caps = serve_queue(np.array([0.0, 0.1, 0.2, 5.0]), lambda b: 1.0, BatchPolicy(None))
    >>> firsts.tolist(), starts.tolist(), ends.tolist()
    ([0, 1, 3], [0.0, 1.0, 5.0], [1.0, 2.0, 6.0])
    """
    shedding = max_queue_size is not None or queue_timeout is not None
    if policy.controller is None and policy.cap == 1 and replicas == 1 and deterministic and not shedding:
        firsts, starts, ends = _fifo_vectorised(times, s(1))
        return firsts, starts, ends, np.ones(len(firsts), dtype=int)
    return batch_by_batch(times, s, policy, replicas, deterministic, max_queue_size=max_queue_size,
                          queue_timeout=queue_timeout, outcome=outcome)


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


SERVED, REFUSED, TIMED_OUT = 0, 1, 2
"""Per-request outcomes :func:`batch_by_batch` writes into ``outcome`` when a queue limit or timeout is set."""


def batch_by_batch(
    times: np.ndarray,
    s: Callable[[int], float],
    policy: BatchPolicy,
    replicas: int = 1,
    deterministic: bool = True,
    on_batch_start: BatchHook | None = None,
    max_queue_size: int | None = None,
    queue_timeout: float | None = None,
    outcome: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The simulator's batch loop: one iteration per batch, on ``replicas`` servers sharing one queue.

    Arguments and result as :func:`serve_queue`.  Arrival times are known up front, so the next batch's start
    comes from the policy in closed form (on the server free first) and its size from one binary search.
    ``on_batch_start`` (a :data:`BatchHook`) may change the number of servers before each batch: the
    autoscaler (:func:`~infergraph_lite.simulation.autoscale.simulate_autoscaling`) drives this loop with it.

    Overload, as Triton's ``default_queue_policy`` sheds it: with ``max_queue_size=K`` an arrival that finds
    K requests *waiting* (not counting those being served) is refused; with ``queue_timeout=D`` a request still
    waiting D after its arrival is dropped at that moment (Triton's ``default_timeout_microseconds`` with
    ``timeout_action: REJECT``; a request whose batch starts by then is served).  Either needs ``outcome``,
    an int8 array of ``len(times)`` zeros (:data:`SERVED`) in which the loop marks each :data:`REFUSED` and
    :data:`TIMED_OUT` request; a batch then takes the next ``size`` *served* requests from its first, so
    ``firsts`` no longer tell the sizes (the served indices do).  The hook's ``next_request`` is the oldest
    waiting request.

    Two servers, greedy batches of up to 2: the second server takes request 1 while the first is busy, and
    request 2 waits for the first to be free:

    >>> firsts, starts, ends, caps = batch_by_batch(np.array([0.0, 0.1, 0.2, 5.0]), lambda b: 1.0,
    ...                                             BatchPolicy(2), replicas=2)
    >>> firsts.tolist(), starts.tolist(), ends.tolist()
    ([0, 1, 2, 3], [0.0, 0.1, 1.0, 5.0], [1.0, 1.1, 2.0, 6.0])

    One server, batches of one, room for one waiting request: request 2 finds request 1 waiting and is
    refused; request 3 arrives after both have started:

    >>> outcome = np.zeros(4, dtype=np.int8)
    >>> firsts, starts, ends, caps = batch_by_batch(np.array([0.0, 0.1, 0.2, 1.5]), lambda b: 1.0,
    ...                                             BatchPolicy(1), max_queue_size=1, outcome=outcome)
    >>> outcome.tolist(), firsts.tolist(), starts.tolist()
    ([0, 0, 1, 0], [0, 1, 3], [0.0, 1.0, 2.0])
    """
    n = len(times)
    arrival_list = times.tolist()  # bisect on a list is several times faster than np.searchsorted per call
    service_of: dict[int, float] = {}
    state = QueueState([0.0] * replicas, [], [], [])
    free_at, batch_first, batch_start, batch_end = state.free_at, state.first, state.start, state.end
    batch_cap: list[int] = []
    shedding = max_queue_size is not None or queue_timeout is not None
    if shedding:
        if outcome is None or outcome.shape != (n,):
            raise ValueError("max_queue_size or queue_timeout needs outcome, an int8 array with one entry per arrival")
        limit = n if max_queue_size is None else check_count("max_queue_size", max_queue_size)
        patience = math.inf if queue_timeout is None else check_number("queue_timeout", queue_timeout, positive=False)
    waiting: list[int] = []  # shedding: admitted requests in arrival order; those from `head` on still wait
    head = decided = 0       # shedding: the oldest waiting request's place in `waiting`; arrivals decided so far

    def admit_until(t: float) -> None:
        # Every arrival up to t joins the queue if fewer than `limit` wait (no batch starts before t).
        nonlocal decided
        while decided < n and arrival_list[decided] <= t:
            if len(waiting) - head < limit:
                waiting.append(decided)
            else:
                outcome[decided] = REFUSED  # type: ignore[index]
            decided += 1

    reports: list[tuple[float, int, float, int]] = []  # AIMD: (end, batch, duration, size) not yet observed
    learned_at = -math.inf  # when the policy last observed a batch: a cap it changed applies from then on
    i = 0
    while True:
        cap = policy.cap
        if not shedding:
            if i >= n:
                break
            full_at = arrival_list[i + cap - 1] if cap is not None and i + cap - 1 < n else math.inf
        else:
            if head == len(waiting):  # an empty queue: the next arrival is admitted (limit >= 1)
                if decided >= n:
                    break
                waiting.append(decided)
                decided += 1
            i = waiting[head]
            queued = len(waiting) - head  # the batch is full when the cap-th admitted request arrives
            if cap is None:
                full_at = math.inf
            elif queued >= cap:
                full_at = arrival_list[waiting[head + cap - 1]]
            else:  # until a batch starts the queue only grows, so the next arrivals are admitted up to the limit
                later = decided + cap - queued - 1
                full_at = arrival_list[later] if cap <= limit and later < n else math.inf
        start = max(policy.start_time(free_at[0], arrival_list[i], full_at), learned_at)
        if reports and reports[0][0] <= start:
            # A batch finished before this one could start: the policy hears how long it took first (as the
            # real batcher's worker does when its batch returns), and the start is worked out again.
            learned_at, _, took, size = heapq.heappop(reports)
            policy.observe(took, size)
            continue
        if shedding and start > arrival_list[i] + patience:
            # The oldest waiting request's deadline passes before any batch can take it: it leaves then,
            # after the arrivals up to that moment have seen it in the queue.
            admit_until(arrival_list[i] + patience)
            outcome[i] = TIMED_OUT  # type: ignore[index]
            head += 1
            continue
        if on_batch_start is not None and on_batch_start(start, i, state):
            continue
        if shedding:
            admit_until(start)
            size = policy.take(len(waiting) - head)
            head += size
        else:
            size = policy.take(bisect.bisect_right(arrival_list, start, i) - i)
        if deterministic:
            duration = service_of.get(size)
            if duration is None:
                duration = service_of[size] = s(size)
        else:
            duration = s(size)
        if policy.controller is not None:  # an AIMD learns a batch's time when it finishes, not when it forms
            heapq.heappush(reports, (start + duration, len(batch_first), duration, size))
        batch_first.append(i)
        batch_start.append(start)
        batch_end.append(start + duration)
        batch_cap.append(-1 if cap is None else cap)
        heapq.heapreplace(free_at, start + duration)  # the server free first takes the batch
        i += size
    return np.array(batch_first), np.array(batch_start), np.array(batch_end), np.array(batch_cap)
