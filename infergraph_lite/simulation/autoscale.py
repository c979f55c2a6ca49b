"""A reactive autoscaler in the style of Ray Serve's, and one stage simulated while its replicas change.

Ray Serve's default policy (``ray.serve.autoscaling_policy``, "replica queue length"), every control
interval:

1. average the *ongoing requests* (queued plus being served) over the last ``look_back`` period;
2. desired replicas = that average / ``target_ongoing_requests`` (smoothed by an up- or down-scaling factor,
   and clipped to ``[min_replicas, max_replicas]``);
3. act only when the same direction has been decided for ``upscale_delay`` (or ``downscale_delay``) in a
   row: a short burst does not buy replicas, a short lull does not give them back.

:func:`simulate_autoscaling` runs one stage — the shared
:class:`~infergraph_lite.core.policy.BatchPolicy`, like :func:`~infergraph_lite.simulation.queue.simulate_batching` —
under a time-varying load, calling the controller every ``interval`` of simulated time.  The queue carries
over from one interval to the next; a new replica starts serving ``startup_time`` after it is ordered; a
removed replica finishes the batch it is serving and then leaves.  Without an autoscaler it is exactly
:func:`~infergraph_lite.simulation.queue.simulate_batching` with a fixed fleet.

Introduced in notebook 06.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.metrics import LatencySummary
from infergraph_lite.core.stage import Exponential, Stage, service_time_fn
from infergraph_lite.simulation.queue import check_arrivals

__all__ = ["AutoscaleResult", "Autoscaler", "simulate_autoscaling", "step_arrivals"]


@dataclass(frozen=True)
class Autoscaler:
    """Ray Serve's autoscaling knobs (``autoscaling_config``), in the simulation's time unit.

    Ray's defaults are in seconds: ``target_ongoing_requests=2``, ``upscale_delay_s=30``,
    ``downscale_delay_s=600``, ``look_back_period_s=30``, a control loop every 0.1 s.  Here every time is in
    the unit of the service times (ms in the notebooks), so pass values that suit your time scale.

    >>> Autoscaler(target_ongoing_requests=4, max_replicas=8).decide_every(interval=100.0, delay=1_000.0)
    10
    """

    target_ongoing_requests: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 10
    upscale_delay: float = 30_000.0
    downscale_delay: float = 600_000.0
    interval: float = 100.0
    look_back: float = 30_000.0
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    startup_time: float = 0.0
    initial_replicas: int | None = None

    def __post_init__(self) -> None:
        check_number("target_ongoing_requests", self.target_ongoing_requests)
        check_count("min_replicas", self.min_replicas)
        check_count("max_replicas", self.max_replicas)
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        for name in ("upscale_delay", "downscale_delay", "startup_time"):
            check_number(name, getattr(self, name), positive=False)
        for name in ("interval", "look_back", "upscaling_factor", "downscaling_factor"):
            check_number(name, getattr(self, name))
        if self.initial_replicas is not None:
            check_count("initial_replicas", self.initial_replicas)
            if not self.min_replicas <= self.initial_replicas <= self.max_replicas:
                raise ValueError("initial_replicas must lie in [min_replicas, max_replicas]")

    @staticmethod
    def decide_every(interval: float, delay: float) -> int:
        """How many consecutive decisions in one direction a delay asks for: Ray's ``int(delay / interval)``."""
        return int(delay / interval)

    def desired(self, mean_ongoing: float, current: int) -> int:
        """Ray's desired replica count for this average of ongoing requests, scaled and clipped.

        >>> Autoscaler(target_ongoing_requests=2, max_replicas=10).desired(mean_ongoing=9.0, current=2)
        5
        """
        wanted = mean_ongoing / self.target_ongoing_requests  # = current * (ongoing per replica / target)
        factor = self.upscaling_factor if wanted > current else self.downscaling_factor
        scaled = math.ceil(current + factor * (wanted - current) - 1e-9)
        if math.ceil(wanted - 1e-9) < current and scaled == current:  # a small factor must not stall a downscale
            scaled -= 1
        return max(self.min_replicas, min(self.max_replicas, scaled))


@dataclass(frozen=True)
class AutoscaleResult(LatencySummary):
    """Per-request times of an autoscaled (or fixed) run, and the controller's record."""

    arrival: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    control_times: np.ndarray   # when the controller ran
    replicas: np.ndarray        # replicas it had ordered after each run (the fleet size in force from then)
    ongoing: np.ndarray         # ongoing requests it saw at each run
    replica_time: float         # replicas x time, summed from the first arrival to the last finish

    def percentile_over_time(self, q: float, window: float) -> tuple[np.ndarray, np.ndarray]:
        """The q-th percentile of latency of the requests arriving in each ``window`` of time: (window
        starts, values; NaN where no request arrived)."""
        edges = np.arange(self.arrival[0], self.arrival[-1] + window, window)
        which = np.searchsorted(edges, self.arrival, side="right") - 1
        values = np.full(len(edges), np.nan)
        latencies = self.latencies
        for k in np.unique(which):
            values[k] = np.percentile(latencies[which == k], q)
        return edges, values


def step_arrivals(rates: Sequence[float], durations: Sequence[float], seed: int = 0) -> np.ndarray:
    """Poisson arrivals whose rate steps through ``rates``, each held for its ``duration``.

    >>> a = step_arrivals([1.0, 3.0, 1.0], [1_000.0, 1_000.0, 1_000.0])
    >>> [int(np.sum((a >= t) & (a < t + 1_000))) for t in (0, 1_000, 2_000)]   # about 1000, 3000, 1000
    [1012, 2901, 954]
    """
    if len(rates) != len(durations) or not rates:
        raise ValueError("give one duration per rate, and at least one of each")
    rng = np.random.default_rng(seed)
    parts, t0 = [], 0.0
    for rate, duration in zip(rates, durations):
        check_number("rate", rate)
        check_number("duration", duration)
        count = rng.poisson(rate * duration)
        parts.append(t0 + np.sort(rng.uniform(0.0, duration, count)))
        t0 += duration
    return np.concatenate(parts)


def simulate_autoscaling(
    stage: Stage,
    arrivals: Sequence[float] | np.ndarray,
    autoscaler: Autoscaler | None = None,
    seed: int = 0,
) -> AutoscaleResult:
    """Serve ``arrivals`` (sorted times) with one batching stage whose replicas an :class:`Autoscaler` sets.

    The stage's batching policy runs as in :func:`~infergraph_lite.simulation.queue.simulate_batching`; with
    ``autoscaler=None`` its ``replicas`` stay fixed (and the result is exactly simulate_batching's).  With an
    autoscaler the stage starts at ``initial_replicas`` (default ``min_replicas``), and every ``interval`` the
    controller sees the ongoing requests (arrived, not yet finished) and may order replicas up or down, as
    described in the module docstring.  All requests are measured (no warm-up: the changing load is the point).

    >>> stage = Stage(service_time=1.0)
    >>> run = simulate_autoscaling(stage, step_arrivals([0.5, 1.5], [2_000.0, 2_000.0]),
    ...                            Autoscaler(target_ongoing_requests=2, max_replicas=4, upscale_delay=200.0,
    ...                                       look_back=200.0))
    >>> int(run.replicas[0]), int(run.replicas.max())   # one replica at 50 % load; more when the load triples
    (1, 4)
    """
    if not isinstance(stage, Stage) or stage.service_time is None:
        raise ValueError("simulate_autoscaling needs a Stage with a service_time")
    times = check_arrivals(arrivals)
    policy = stage.policy()
    s = service_time_fn(stage.service_time, np.random.default_rng([seed, 1]), allow_zero=True)
    deterministic = not callable(stage.service_time) and not isinstance(stage.service_time, Exponential)
    service_of: dict[int, float] = {}
    n = len(times)
    arrival_list = times.tolist()

    ordered = stage.replicas if autoscaler is None else (autoscaler.initial_replicas or autoscaler.min_replicas)
    free_at = [0.0] * ordered  # heap: when each replica in the fleet is next free
    retiring = 0  # replicas ordered away, leaving as soon as they are next free
    in_flight: list[tuple[float, int]] = []  # heap of (end, size) of batches started, to count finishes
    finished = 0
    control_t = (times[0] + autoscaler.interval) if autoscaler is not None else math.inf
    samples: deque[tuple[float, int]] = deque()
    counter = 0  # Ray's decision counter: > 0 consecutive ups, < 0 consecutive downs
    control_times, ordered_log, ongoing_log = [], [], []
    changes = [(float(times[0]), ordered)]  # (time, replicas ordered from then)

    start_of = np.empty(n)
    finish_of = np.empty(n)
    i = 0
    while i < n:
        cap = policy.cap
        full_at = arrival_list[i + cap - 1] if cap is not None and i + cap - 1 < n else math.inf
        start = policy.start_time(free_at[0], arrival_list[i], full_at)
        if start >= control_t:
            # Every batch that starts before control_t is placed: run the controller at control_t.
            assert autoscaler is not None
            while in_flight and in_flight[0][0] <= control_t:
                finished += heapq.heappop(in_flight)[1]
            ongoing = bisect.bisect_right(arrival_list, control_t) - finished
            samples.append((control_t, ongoing))
            while samples[0][0] <= control_t - autoscaler.look_back:
                samples.popleft()
            mean_ongoing = sum(o for _, o in samples) / len(samples)
            desired = autoscaler.desired(mean_ongoing, ordered)
            if desired > ordered:
                counter = max(counter, 0) + 1
                act = counter > autoscaler.decide_every(autoscaler.interval, autoscaler.upscale_delay)
            elif desired < ordered:
                counter = min(counter, 0) - 1
                act = -counter > autoscaler.decide_every(autoscaler.interval, autoscaler.downscale_delay)
            else:
                counter, act = 0, False
            if act:
                counter = 0
                if desired > ordered:
                    cancel = min(retiring, desired - ordered)  # replicas not yet gone simply stay
                    retiring -= cancel
                    for _ in range(desired - ordered - cancel):
                        heapq.heappush(free_at, control_t + autoscaler.startup_time)
                else:
                    retiring += ordered - desired
                ordered = desired
                changes.append((control_t, ordered))
            control_times.append(control_t)
            ordered_log.append(ordered)
            ongoing_log.append(ongoing)
            control_t += autoscaler.interval
            continue
        heapq.heappop(free_at)  # the replica that is free first takes the batch ...
        if retiring:  # ... unless it was ordered away: then it leaves now instead
            retiring -= 1
            continue
        size = policy.take(bisect.bisect_right(arrival_list, start, i) - i)
        if deterministic:
            duration = service_of.get(size)
            if duration is None:
                duration = service_of[size] = s(size)
        else:
            duration = s(size)
        policy.observe(duration, size)
        start_of[i:i + size] = start
        finish_of[i:i + size] = start + duration
        heapq.heappush(free_at, start + duration)
        heapq.heappush(in_flight, (start + duration, size))
        i += size

    end = float(finish_of.max())
    bounds = [t for t, _ in changes[1:]] + [end]
    replica_time = sum(r * (max(t1, t0) - t0) for (t0, r), t1 in zip(changes, bounds))
    return AutoscaleResult(
        arrival=times, start=start_of, finish=finish_of,
        control_times=np.array(control_times), replicas=np.array(ordered_log, dtype=int),
        ongoing=np.array(ongoing_log, dtype=int), replica_time=float(replica_time),
    )
