"""Discrete-event simulation of a whole graph of stages (notebook 06), stage by stage, with one queue's core.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_number
from infergraph_lite.core.metrics import PerRequestTimes, busy_fraction
from infergraph_lite.core.stage import Exponential, prepare_stages, service_time_fn
from infergraph_lite.simulation.cores import check_cores, entry_costs, serve_on_cores
from infergraph_lite.simulation.queue import (
    REFUSED,
    SERVED,
    TIMED_OUT,
    SheddingSummary,
    UnstableLoadError,
    arrival_times,
    check_warmup,
    is_deterministic,
    serve_queue,
    spread_batches,
)

__all__ = ["GraphResult", "StageStats", "simulate_graph"]

@dataclass(frozen=True)
class StageStats(PerRequestTimes):
    """One stage of a simulated graph: per-request times and their summaries.

    The per-request arrays hold the measured requests (warm-up removed) in
    *request* order, aligned with :attr:`GraphResult.arrival`: ``arrival`` is
    when the request's job reached this stage (every dependency done for it),
    ``start`` and ``finish`` when its batch started and ended here.  The
    ``batches_*`` arrays describe every batch of the whole run in the order
    batches started.  A request shed before this stage has NaN here; ``refused`` and ``timed_out`` mark the
    requests this stage itself shed (its ``max_queue_size``, its queue_timeout), with NaN start and finish.
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
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    timed_out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


@dataclass(frozen=True)
class GraphResult(SheddingSummary):
    """End-to-end times of a simulated graph (warm-up removed), and every stage's :class:`StageStats`.

    A request's latency runs from its arrival until the *last* sink (a stage
    nothing depends on) has finished it.  A request some stage shed (``refused``: a full queue,
    ``timed_out``: its deadline passed while waiting) never finishes: its ``finish`` is NaN, the latency
    summaries and ``throughput`` count answered requests only.
    """

    arrival: np.ndarray
    finish: np.ndarray
    throughput: float            # requests finished per unit time over the measured window
    stages: dict[str, StageStats]
    sinks: tuple[str, ...]
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))    # refused by some stage
    timed_out: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # timed out at some stage

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
    queue_timeouts: Mapping[str, float] | None = None,
    hop_delay: float | Mapping[str, float] = 0.0,
    cores: float | None = None,
    hop_work: float | Mapping[str, float] = 0.0,
) -> GraphResult:
    """Simulate a graph of :class:`~infergraph_lite.core.stage.Stage` s under Poisson (or given) arrivals.

    ``stages`` is the seed's shape with a Stage in place of the function,
    ``{name: (Stage(service_time=...), [dependencies])}``; a dependency is
    another stage or one of ``inputs``.  Every request visits every stage.  A
    request's job enters a stage when all its dependencies have finished it
    (a join waits for its slowest branch), then queues under the stage's
    :class:`~infergraph_lite.core.policy.BatchPolicy` for one of its ``replicas``
    — exactly as in :func:`simulate_batching`, whose core
    (:func:`serve_queue`) serves each stage's queue.  Because every queue is
    FIFO and the graph has no cycles, the stages can be simulated one after
    another in topological order: a stage's arrival times are the element-wise
    maximum of its dependencies' finish times.

    What it models: **every stage's replicas are servers of their own** — a
    replica is busy only with its own batches, so two stages never slow each
    other down.  That is a server whose stages run on separate cores (worker
    processes, ``GraphServer(workers="processes")``, on at least as many free
    cores as busy stages), not stages sharing one interpreter lock or fewer
    cores than stages: there a graph's capacity is bounded by the cores
    instead, e.g. ``1 / (sum of the stages' work per request)`` for one core
    (notebook 06, section 7).

    Exponential service times draw from a generator per stage, seeded with
    ``[seed, 1 + position of the stage in the dict]`` (so a one-stage graph
    repeats :func:`simulate_batching` with the same seed).  The first
    ``warmup`` fraction of requests (by arrival) is left out of every
    statistic.  Bad stages or a bad graph raise, naming the node, before
    anything runs; so does a stage that cannot keep up
    (:class:`UnstableLoadError`) unless ``allow_unstable=True``.

    A stage with a ``max_queue_size`` sheds load as :func:`simulate_batching` does (K requests may wait;
    an arrival finding K waiting is refused), and ``queue_timeouts={stage: D}`` drops a request still waiting at
    that stage D after it got there (Triton's ``default_timeout_microseconds`` per model); such a stage is
    never unstable.  A shed request goes no further: ``refused``/``timed_out`` on the result say which.

    ``hop_delay`` is a pure delay on every entry into a stage (or ``{stage: d}``, per stage; a stage not
    named gets 0): a request whose dependencies are done for it reaches that stage's queue ``d`` later.  It
    occupies no server and never queues, so a chain of n stages adds exactly ``n * d`` to a lone request.
    It is the cost of handing a request from one stage to the next that no stage's service time holds —
    the wake-up, pickling and pipe of a real server's hop (measured from lone requests; notebook 06,
    section 7).  On a stage's :class:`StageStats`, ``arrival`` is then when the request reached its queue.

    ``cores=C`` models the opposite case: **the stages share C cores**.  Every stage's queue, its
    replicas and the hand-offs then advance in one event loop
    (:func:`~infergraph_lite.simulation.cores.serve_on_cores`), and whatever runs shares the cores by
    processor sharing: with n jobs running on C < n cores, each progresses at C / n seconds of its service
    time per second.  A batch's service time is then the CPU time it
    needs.  ``hop_work`` (seconds, or ``{stage: seconds}``) is CPU work of the serving process on every entry
    into a stage, done by one thread, one hand-off at a time in order (one interpreter lock), on the same
    cores: where ``hop_delay`` is a pure delay, ``hop_work`` is a delay that queues and takes a core (it may be
    given without ``cores``: the thread alone then serialises).  With no ``hop_work`` and never more jobs
    than cores the result is exactly the stage-by-stage one.  Load shedding (``max_queue_size``,
    ``queue_timeouts``) is not modelled on shared cores and is refused, naming the stage.  So, unless
    ``allow_unstable=True``, is a load the cores cannot carry (the sum of every stage's work per request at
    its best batch, and the hand-offs' work, against ``cores``) and one the hand-off thread cannot (the
    rate times the sum of ``hop_work`` at or above 1, with or without ``cores``); both are necessary for a
    stable run, not sufficient.  On shared cores a stage's ``utilization`` is the time its replicas were
    busy, slowed down included (not CPU use), and an :class:`~infergraph_lite.core.policy.AIMD` cap hears
    each batch's time as it took, sharing included, as a real batcher would.

    Two exponential stages in tandem at 60 % and 30 % load: by Jackson's
    theorem the mean latency is 1/(1 - 0.6) + 0.5/(1 - 0.3) = 3.21 ms; a hop
    delay of 0.25 ms on each stage entry adds exactly 2 * 0.25 ms to it.

    >>> from infergraph_lite.core.stage import Exponential, Stage
    >>> tandem = {"a": (Stage(service_time=Exponential(1.0)), ["request"]),
    ...           "b": (Stage(service_time=Exponential(0.5)), ["a"])}
    >>> r = simulate_graph(tandem, arrival_rate=0.6, n_requests=200_000)
    >>> round(r.mean_latency, 1), r.bottleneck, round(r.stages["a"].utilization, 1)
    (3.2, 'a', 0.6)
    >>> hopped = simulate_graph(tandem, arrival_rate=0.6, n_requests=200_000, hop_delay=0.25)
    >>> round(hopped.mean_latency - r.mean_latency, 6)
    0.5

    Two replicas of an exponential stage (mean 1) at 0.6 requests per unit time are M/M/2, each on a core of
    its own (mean latency 1.10); on one shared core two busy replicas each run at half speed, so the stage
    serves at rate 1 whenever it holds a request: M/M/1, mean 1 / (1 - 0.6) = 2.5.  On two cores nothing changes:

    >>> pair = {"a": (Stage(service_time=Exponential(1.0), replicas=2), ["request"])}
    >>> [round(simulate_graph(pair, 0.6, 100_000, cores=c).mean_latency, 1) for c in (None, 1, 2)]
    [1.1, 2.5, 1.1]
    """
    plan = prepare_stages(stages, inputs, need="service_time")
    check_warmup(warmup)
    queue_timeouts = dict(queue_timeouts or {})
    for name, value in queue_timeouts.items():
        if name not in plan.nodes:
            raise ValueError(f"queue_timeouts names {name!r}, which is not a stage (stages: {', '.join(plan.order)})")
        check_number(f"queue_timeouts[{name!r}]", value, positive=False)
    hops = entry_costs("hop_delay", hop_delay, plan.order)
    works = entry_costs("hop_work", hop_work, plan.order)
    shared = cores is not None or any(works.values())
    if cores is not None:
        cores = check_cores(cores)
    if shared:
        shedding = [name for name in plan.order if plan.nodes[name][0].max_queue_size is not None
                    or name in queue_timeouts]
        if shedding:
            raise ValueError(f"stage {shedding[0]!r} sheds load (max_queue_size or queue_timeouts), which is not "
                             "modelled with cores= or hop_work=: drop one or the other")
    times, rate = arrival_times(arrival_rate, n_requests, seed, arrivals)

    capacities = {name: plan.nodes[name][0].capacity() for name in plan.order}
    loads = {name: rate / cap if cap > 0 else math.inf for name, cap in capacities.items()}
    sheds = {name for name in plan.order if plan.nodes[name][0].max_queue_size is not None or name in queue_timeouts}
    unstable = sorted((name for name in plan.order if loads[name] >= 1 and name not in sheds),
                      key=lambda name: -loads[name])
    if unstable and not allow_unstable:
        worst = unstable[0]
        others = f" (also unstable: {', '.join(repr(u) for u in unstable[1:])})" if len(unstable) > 1 else ""
        raise UnstableLoadError(
            f"stage {worst!r} cannot keep up: arrival rate {rate:.4g} is at or above its capacity "
            f"{capacities[worst]:.4g} (replicas * best b/s(b)), offered load {loads[worst]:.3f}{others}. "
            "Add replicas or batching to that stage, lower the rate, or pass allow_unstable=True."
        )

    if shared and not allow_unstable:
        _check_shared_load(plan, rate, capacities, works, cores)

    n = len(times)
    position = {name: k for k, name in enumerate(plan.nodes)}
    served: dict[str, tuple[np.ndarray, ...]] = {}
    if shared:
        rngs = {name: np.random.default_rng([seed, 1 + position[name]]) for name in plan.order}
        served = serve_on_cores(plan, times, rngs, hops, works, math.inf if cores is None else cores)
    for name in plan.order if not shared else ():
        stage, deps = plan.nodes[name]
        sources = [served[d][2] if d in plan.nodes else times for d in dict.fromkeys(deps)] or [times]
        arrive = sources[0] if len(sources) == 1 else np.maximum.reduce(sources)
        if hops[name]:
            arrive = arrive + hops[name]
        rng = np.random.default_rng([seed, 1 + position[name]])
        served[name] = (arrive, *_serve_stage(arrive, stage, rng, queue_timeouts.get(name)))

    sinks = tuple(name for name in plan.order if not plan.dependents[name])
    done = served[sinks[0]][2] if len(sinks) == 1 else np.maximum.reduce([served[s][2] for s in sinks])
    skip = int(warmup * n)
    window_start = np.nanmax(done[:skip], initial=times[0]) if skip else times[0]
    window_end = np.nanmax(done[skip:], initial=window_start)
    span = window_end - window_start
    stats = {}
    refused, timed_out = np.zeros(n - skip, dtype=bool), np.zeros(n - skip, dtype=bool)
    for name in plan.nodes:  # in the order the stages were given
        arrive, start, finish, size, b_size, b_start, b_end, outcome = served[name]
        replicas = plan.nodes[name][0].replicas
        stats[name] = StageStats(
            name=name, arrival=arrive[skip:], start=start[skip:], finish=finish[skip:], batch_size=size[skip:],
            replicas=replicas, capacity=capacities[name], offered_load=float(loads[name]),
            utilization=busy_fraction(b_start, b_end, replicas, window_start, window_end),
            batches_size=b_size, batches_start=b_start, batches_end=b_end,
            refused=outcome[skip:] == REFUSED, timed_out=outcome[skip:] == TIMED_OUT,
        )
        refused |= stats[name].refused
        timed_out |= stats[name].timed_out
    answered = n - skip - int(np.count_nonzero(refused | timed_out))
    return GraphResult(
        arrival=times[skip:],
        finish=done[skip:],
        throughput=float(answered / span) if span > 0 else math.inf,
        stages=stats,
        sinks=sinks,
        refused=refused,
        timed_out=timed_out,
    )


def _check_shared_load(plan: Any, rate: float, capacities: Mapping[str, float], works: Mapping[str, float],
                       cores: float | None) -> None:
    # On shared cores every stage's work adds up: at best each stage needs 1 / (b / s(b)) seconds of a core per
    # request (its capacity per replica), and the serving thread sum(hop_work) of its one core.
    thread = rate * sum(works.values())
    if thread >= 1:
        raise UnstableLoadError(
            f"the hand-off thread cannot keep up: {rate:.4g} requests per second need {thread:.3f} of its one core "
            f"(hop_work summed over the stages entered: {sum(works.values()):.4g} s). Lower the rate or hop_work, or "
            "pass allow_unstable=True.")
    if cores is None:
        return
    need = {name: rate * plan.nodes[name][0].replicas / cap for name, cap in capacities.items() if cap > 0}
    total = sum(need.values()) + thread
    if total >= cores:
        busiest = max(need, key=lambda name: need[name]) if need else None
        most = (f"stage {busiest!r}: {need[busiest]:.3f}" if busiest is not None and need[busiest] >= thread
                else f"the hand-offs: {thread:.3f}")
        raise UnstableLoadError(
            f"cores={cores:g} cannot keep up: arrival rate {rate:.4g} needs {total:.3f} cores of work at each "
            f"stage's best batch (most for {most}). Add cores, batch more, lower the rate, or pass "
            "allow_unstable=True.")


def _serve_stage(arrive: np.ndarray, stage: Any, rng: np.random.Generator,
                 queue_timeout: float | None = None) -> tuple[np.ndarray, ...]:
    # Serve one stage's queue: sort its arrivals (stable, so simultaneous ones keep request order), run the
    # shared core, and map each request's start and finish back to request order.  Returns per request
    # (start, finish, batch size) and per batch (size, start, end), then the per-request outcome (SERVED,
    # REFUSED, TIMED_OUT; a request shed upstream, NaN here, stays SERVED here and NaN).
    if stage.max_queue_size is not None or queue_timeout is not None or np.isnan(arrive).any():
        return _serve_shedding(arrive, stage, rng, queue_timeout)
    n = len(arrive)
    in_order = bool(np.all(arrive[1:] >= arrive[:-1]))
    order = None if in_order else np.argsort(arrive, kind="stable")
    times = arrive if order is None else arrive[order]
    service, policy, replicas = stage.service_time, stage.policy(), stage.replicas
    deterministic = is_deterministic(service)
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
    outcome = np.zeros(n, dtype=np.int8)
    if order is None:
        return start_sorted, end_sorted, size_sorted, b_size, starts, ends, outcome
    start, finish, size = np.empty(n), np.empty(n), np.empty(n, dtype=int)
    start[order], finish[order], size[order] = start_sorted, end_sorted, size_sorted
    return start, finish, size, b_size, starts, ends, outcome


def _serve_shedding(arrive: np.ndarray, stage: Any, rng: np.random.Generator,
                    queue_timeout: float | None) -> tuple[np.ndarray, ...]:
    # A stage that sheds load, or whose arrivals lack the requests shed upstream (NaN): the batch loop
    # serves the requests that reached it, in arrival order, and marks those it refuses or times out.
    reached = np.flatnonzero(~np.isnan(arrive))
    order = reached[np.argsort(arrive[reached], kind="stable")]
    n = len(arrive)
    start, finish, size = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=int)
    outcome = np.zeros(n, dtype=np.int8)
    if len(order) == 0:
        return start, finish, size, np.zeros(0, dtype=int), np.zeros(0), np.zeros(0), outcome
    s = service_time_fn(stage.service_time, rng, allow_zero=True)
    shed = np.zeros(len(order), dtype=np.int8)
    firsts, starts, ends, _ = serve_queue(arrive[order], s, stage.policy(), stage.replicas,
                                          is_deterministic(stage.service_time), stage.max_queue_size, queue_timeout,
                                          shed)
    start[order], finish[order], size[order], b_size = spread_batches(shed == SERVED, firsts, starts, ends)
    outcome[order] = shed
    return start, finish, size, b_size, starts, ends, outcome


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
