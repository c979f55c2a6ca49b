"""A graph's stages on a machine's cores: one event loop for every stage at once (``simulate_graph(cores=...)``).

:func:`~infergraph_lite.simulation.graph.simulate_graph` normally serves the stages one after another, each
replica a server of its own.  That cannot see two stages slowing each other down.  Here every stage's queue,
its replicas and the serving process's hand-offs advance together in time, and whatever is running shares the
cores by **processor sharing**: with ``n`` jobs running on ``C`` cores, each progresses at ``min(1, C / n)``
seconds of its work per second (as an operating system's scheduler shares cores among busy processes, to a
first approximation).  A job is a batch on a replica (its service time is the CPU time it needs) or one
hand-off of a request into a stage by the serving process's one thread (``hop_work``: served one at a time,
in order, as one interpreter lock would).

With no ``hop_work`` and never, over the whole run, more jobs than cores it gives exactly the stage-by-stage
result: the processor-sharing clock only falls behind while the cores are oversubscribed (the lag below stays
exactly 0.0 otherwise; once it has moved, later times carry its rounding).  With ``hop_work``, hand-offs due at
once (a batch of several answered together) also queue on the one thread, however many cores there are.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from infergraph_lite.core.stage import service_time_fn

__all__ = ["serve_on_cores"]

_ENTER, _TIMER = 0, 1  # timed events: a request reaches a stage's queue; a batching window closes


def serve_on_cores(
    plan: Any,
    times: np.ndarray,
    rngs: Mapping[str, np.random.Generator],
    hops: Mapping[str, float],
    hop_work: Mapping[str, float],
    cores: float,
) -> dict[str, tuple[np.ndarray, ...]]:
    """Serve every stage of ``plan`` (a checked stage graph) for sorted arrival ``times`` on ``cores`` cores.

    Returns, per stage, what the stage-by-stage loop returns: per request (request order) the time it reached
    the queue, its batch's start and end, its batch's size; per batch (in the order batches started) size,
    start and end; then the per-request outcome (all served: this loop does not shed).  ``cores=math.inf``
    shares nothing (only ``hop_work``'s one thread then serialises).  Hand-offs due at the same instant queue on
    the thread request by request, in request order, each request into its stages in topological order.

    Two stages of 1 s each on one core, two requests at once: request 0 leaves ``a`` at 1 s; then request 0
    in ``b`` and request 1 in ``a`` share the core, each at half speed, until both are done at 3 s; request 1's
    ``b`` then has the core to itself:

    >>> from infergraph_lite.core.stage import Stage, prepare_stages
    >>> plan = prepare_stages({"a": (Stage(service_time=1.0), ["request"]),
    ...                        "b": (Stage(service_time=1.0), ["a"])}, need="service_time")
    >>> out = serve_on_cores(plan, np.zeros(2), {"a": None, "b": None}, {"a": 0, "b": 0}, {"a": 0, "b": 0}, 1)
    >>> out["a"][2].tolist(), out["b"][2].tolist()
    ([1.0, 3.0], [3.0, 4.0])
    """
    names = list(plan.order)
    index = {name: k for k, name in enumerate(names)}
    n, m = len(times), len(names)
    stage_of = [plan.nodes[name][0] for name in names]
    policies = [stage.policy() for stage in stage_of]
    service = [service_time_fn(stage.service_time, rngs[name], allow_zero=True) for stage, name in zip(stage_of, names)]
    upstream = [[index[d] for d in dict.fromkeys(plan.nodes[name][1]) if d in plan.nodes] for name in names]
    # each dependent once, however often it names this stage (upstream counts each dependency once too)
    downstream = [[index[d] for d in dict.fromkeys(plan.dependents[name])] for name in names]
    entry_delay = [hops[name] for name in names]
    entry_work = [hop_work[name] for name in names]
    sources = [k for k in range(m) if not upstream[k]]  # stages a request enters on arrival
    # plain lists in the loop: numpy element access costs several times a list's per request
    waiting_for = [[len(upstream[k])] * n for k in range(m)]
    arrival_list = [float(x) for x in times]
    arrive = [[math.nan] * n for _ in range(m)]
    start, finish = [[math.nan] * n for _ in range(m)], [[math.nan] * n for _ in range(m)]
    size = [[0] * n for _ in range(m)]
    b_size: list[list[int]] = [[] for _ in range(m)]
    b_start: list[list[float]] = [[] for _ in range(m)]
    b_end: list[list[float]] = [[] for _ in range(m)]
    queues: list[deque[int]] = [deque() for _ in range(m)]
    free = [[0.0] * stage.replicas for stage in stage_of]  # heaps: when each idle replica became free
    timer_at = [math.inf] * m  # the earliest window-close event pending for each stage

    events: list[tuple[float, int, int, int, int]] = []  # (time, order, kind, stage, request)
    jobs: list[tuple[float, int, tuple]] = []  # running: (finish in served seconds, order, job)
    handoffs: deque[tuple[int, int]] = deque()  # (stage, request) waiting for the serving thread
    thread_busy = False
    t, lag, order, arrived = (arrival_list[0] if n else 0.0), 0.0, 0, 0
    dirty: set[int] = set()

    def push_event(at: float, kind: int, k: int, i: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, k, i))

    def run(work: float, job: tuple) -> None:
        # The served-seconds clock is t - lag: a job of `work` is done when that clock has advanced by `work`.
        nonlocal order
        order += 1
        heapq.heappush(jobs, ((t - lag) + work, order, job))

    def enter(k: int, i: int) -> None:
        # Requests reaching a queue at the same instant line up by request number, as the stage-by-stage loop's
        # stable sort of arrival times lines them up.
        arrive[k][i] = t
        queue = queues[k]
        queue.append(i)
        j = len(queue) - 1
        while j > 0 and queue[j - 1] > i and arrive[k][queue[j - 1]] == t:
            queue[j] = queue[j - 1]
            j -= 1
        queue[j] = i
        dirty.add(k)

    def ready(k: int, i: int) -> None:
        # Every dependency is done for request i: the serving thread hands it in, then the pure delay.
        nonlocal thread_busy
        if entry_work[k] > 0:
            handoffs.append((k, i))
            if not thread_busy:
                thread_busy = True
                run(entry_work[k], ("handoff", *handoffs.popleft()))
        elif entry_delay[k] > 0:
            push_event(t + entry_delay[k], _ENTER, k, i)
        else:
            enter(k, i)

    def start_batches(k: int) -> None:
        policy, queue, idle = policies[k], queues[k], free[k]
        while idle and queue:
            cap = policy.cap
            full_at = arrive[k][queue[cap - 1]] if cap is not None and len(queue) >= cap else math.inf
            begin = policy.start_time(idle[0], arrive[k][queue[0]], full_at)
            if begin > t:
                if begin < timer_at[k]:
                    timer_at[k] = begin
                    push_event(begin, _TIMER, k, -1)
                return
            members = [queue.popleft() for _ in range(policy.take(len(queue)))]
            heapq.heappop(idle)
            b = len(members)
            for i in members:
                start[k][i] = t
                size[k][i] = b
            b_size[k].append(b)
            b_start[k].append(t)
            b_end[k].append(math.nan)
            run(service[k](b), ("batch", k, len(b_start[k]) - 1, members))

    def complete(job: tuple) -> None:
        nonlocal thread_busy
        if job[0] == "handoff":
            _, k, i = job
            if handoffs:
                nk, ni = handoffs.popleft()
                run(entry_work[nk], ("handoff", nk, ni))
            else:
                thread_busy = False
            if entry_delay[k] > 0:
                push_event(t + entry_delay[k], _ENTER, k, i)
            else:
                enter(k, i)
            return
        _, k, batch, members = job
        b_end[k][batch] = t
        for i in members:
            finish[k][i] = t
        policies[k].observe(t - b_start[k][batch], len(members))  # the batch's wall time, sharing included
        heapq.heappush(free[k], t)
        dirty.add(k)
        for i in members:  # request by request, as arrivals are handed in
            for d in downstream[k]:
                waiting_for[d][i] -= 1
                if waiting_for[d][i] == 0:
                    ready(d, i)

    while True:
        rate = 1.0 if len(jobs) <= cores else cores / len(jobs)
        if not jobs:
            done_at = math.inf
        elif rate == 1.0:  # the served clock keeps pace with time: exact, so an idle machine matches simulate_graph
            done_at = jobs[0][0] + lag
        else:
            done_at = t + (jobs[0][0] - (t - lag)) / rate
        next_at = min(done_at, events[0][0] if events else math.inf,
                      arrival_list[arrived] if arrived < n else math.inf)
        if next_at == math.inf:
            break
        if rate < 1.0 and next_at > t:
            lag += (next_at - t) * (1.0 - rate)
        t = max(t, next_at)
        served = t - lag
        if done_at == next_at:  # the first job is done now, whatever the last bit of rounding says
            served = max(served, jobs[0][0])
        while jobs and jobs[0][0] <= served:
            complete(heapq.heappop(jobs)[2])
        while arrived < n and arrival_list[arrived] <= t:
            for k in sources:
                ready(k, arrived)
            arrived += 1
        while events and events[0][0] <= t:
            _, _, kind, k, i = heapq.heappop(events)
            if kind == _ENTER:
                enter(k, i)
            else:
                timer_at[k] = math.inf
                dirty.add(k)
        while dirty:  # upstream first: what a stage finishes at this instant reaches the next before it batches
            k = min(dirty)
            dirty.discard(k)
            start_batches(k)
            # a batch or hand-off of no work is done at once, at this instant, before time moves on
            while jobs and jobs[0][0] <= t - lag:
                complete(heapq.heappop(jobs)[2])

    outcome = np.zeros(n, dtype=np.int8)
    return {name: (np.array(arrive[k]), np.array(start[k]), np.array(finish[k]), np.array(size[k], dtype=int),
                   np.array(b_size[k], dtype=int), np.array(b_start[k]), np.array(b_end[k]), outcome)
            for k, name in enumerate(names)}


def check_cores(cores: object) -> float:
    """``cores`` as a positive number (fractional allowed: a core another process half uses; ``math.inf``
    shares nothing), naming it.

    >>> check_cores(np.int64(2)), check_cores(1.5)
    (2.0, 1.5)
    """
    value = float(cores) if isinstance(cores, numbers.Real) and not isinstance(cores, (bool, np.bool_)) else math.nan
    if not value > 0:
        raise ValueError(f"cores must be a number > 0 (the cores the stages share), got {cores!r}")
    return value


def entry_costs(name: str, value: float | Mapping[str, float], order: Sequence[str]) -> dict[str, float]:
    """Per-stage costs from one number or a mapping (a stage not named: 0), errors naming the argument."""
    from infergraph_lite.core.arguments import check_number

    if isinstance(value, Mapping):
        unknown = [stage for stage in value if stage not in order]
        if unknown:
            raise ValueError(f"{name} names {unknown[0]!r}, which is not a stage (stages: {', '.join(order)})")
        return {stage: check_number(f"{name}[{stage!r}]", value.get(stage, 0.0), positive=False) for stage in order}
    cost = check_number(name, value, positive=False)
    return dict.fromkeys(order, cost)
