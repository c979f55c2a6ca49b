"""A reactive autoscaler in the style of Ray Serve's, and one stage simulated while its replicas change.

Ray Serve's default policy (``ray.serve.autoscaling_policy``, "replica queue length"), every control
interval:

1. average the *ongoing requests* (queued plus being served) over the last ``look_back_period_s``, from
   reports the replicas push every ``metrics_interval_s`` (so what it sees is up to that old);
2. desired replicas = that average / ``target_ongoing_requests`` (a count of requests per replica, queued ones
   included, not a busy fraction: see :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig`), the change
   from the replicas actually *running* (``len(self._running_replicas)`` in Ray's ``autoscaling_state.py``; a
   replica still starting does not count) smoothed by an up- or down-scaling factor, and clipped to
   ``[min_replicas, max_replicas]``;
3. compare that with the *target* (the replicas already ordered, running or not) and act only when the same
   direction has been decided for ``upscale_delay_s`` (or ``downscale_delay_s``) in a row: a short burst does
   not buy replicas, a short lull does not give them back.

Replicas take time to start (``startup_s``): loading the model, and on GPUs often provisioning a node first —
tens of seconds to minutes, not the fraction of a second a warm process needs.  While they start, the queue
keeps growing, the averaged ongoing count keeps rising, and the controller orders more: the fleet overshoots,
then holds the excess for ``downscale_delay_s``.  :class:`AutoscaleResult` records both the replicas ordered and
those running, so the lag between them can be plotted.

The settings are one :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig`, the object notebook 07
hands to Ray (:meth:`~infergraph_lite.core.autoscaling.AutoscalingConfig.to_ray_config`).
:func:`simulate_autoscaling` runs one stage — the shared :class:`~infergraph_lite.core.policy.BatchPolicy`,
in the simulator's one batch loop (:func:`~infergraph_lite.simulation.queue.batch_by_batch`) — under a
time-varying load; a hook on that loop runs the controller every control interval of simulated time.  The
queue carries over from one interval to the next; a new replica starts serving ``startup_s`` after it is
ordered; a removed replica finishes the batch it is serving and then leaves.  Without autoscaling it is
:func:`~infergraph_lite.simulation.queue.simulate_batching`'s loop with a fixed fleet.

Introduced in notebook 06.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from infergraph_lite.core.arguments import check_number
from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.metrics import LatencySummary
from infergraph_lite.core.stage import Stage, prepare_stages, service_time_fn
from infergraph_lite.simulation.queue import QueueState, batch_by_batch, check_arrivals, is_deterministic

__all__ = ["AutoscaleResult", "AutoscalingConfig", "GraphAutoscaleResult", "simulate_autoscaling",
           "simulate_graph_autoscaling", "step_arrivals"]


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
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))  # replicas up at each run
    mean_ongoing: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the look-back average it decided on

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
    autoscaling: AutoscalingConfig | None = None,
    seed: int = 0,
    *,
    time_unit: float = 1e-3,
    control_interval_s: float = 0.1,
    startup_s: float = 0.0,
) -> AutoscaleResult:
    """Serve ``arrivals`` (sorted times) with one batching stage whose replicas Ray's autoscaling rule sets.

    ``arrivals`` and the stage's service times are in the simulator's unit, ``time_unit`` seconds (ms by
    default, as in the notebooks); the :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig`'s times
    are in seconds, as Ray's.  The stage's batching policy runs as in
    :func:`~infergraph_lite.simulation.queue.simulate_batching`; with ``autoscaling=None`` its ``replicas``
    stay fixed.  With autoscaling the stage starts at ``initial_replicas`` (default ``min_replicas``), and every
    ``control_interval_s`` (Ray's control loop, 0.1 s) the controller counts the ongoing requests (arrived, not
    yet finished; a report every ``metrics_interval_s``) and may order replicas up or down, as described in the
    module docstring; an ordered replica serves ``startup_s`` later.  All requests are measured (no warm-up:
    the changing load is the point).

    >>> stage = Stage(service_time=1.0)
    >>> run = simulate_autoscaling(stage, step_arrivals([0.5, 1.5], [2_000.0, 2_000.0]),
    ...                            AutoscalingConfig(target_ongoing_requests=2, max_replicas=4, upscale_delay_s=0.2,
    ...                                              look_back_period_s=0.2, metrics_interval_s=0.1))
    >>> int(run.replicas[0]), int(run.replicas.max())   # one replica at 50 % load; more when the load triples
    (1, 4)
    """
    check_stage("stage", stage)
    if autoscaling is not None and not isinstance(autoscaling, AutoscalingConfig):
        raise ValueError(f"autoscaling must be an AutoscalingConfig or None, got {autoscaling!r}")
    times = check_arrivals(arrivals)
    unit = check_number("time_unit", time_unit)
    check_number("control_interval_s", control_interval_s)
    check_number("startup_s", startup_s, positive=False)
    return _autoscale_stage(stage, times, autoscaling, np.random.default_rng([seed, 1]), unit, control_interval_s,
                            startup_s)


def check_stage(name: str, stage: object) -> None:
    if not isinstance(stage, Stage) or stage.service_time is None:
        raise ValueError(f"stage {name!r}: the autoscaling simulation needs a Stage with a service_time, "
                         f"got {stage!r}")


def _autoscale_stage(stage: Stage, times: np.ndarray, autoscaling: AutoscalingConfig | None,
                     rng: np.random.Generator, unit: float, control_interval_s: float,
                     startup_s: float) -> AutoscaleResult:
    # One stage's sorted arrivals through the batch loop, its replicas set by the controller (if any).
    service = stage.service_time
    assert service is not None  # check_stage refused a Stage without one
    policy = stage.policy()
    s = service_time_fn(service, rng, allow_zero=True)
    if autoscaling is None:
        controller = None
        replicas = stage.replicas
        changes = [(float(times[0]), replicas)]
    else:
        if autoscaling.start_replicas < 1:
            raise ValueError(f"simulate_autoscaling does not scale to zero: min_replicas (or initial_replicas) "
                             f"must be >= 1, got {autoscaling.start_replicas}")
        controller = _Controller(autoscaling, times, unit, control_interval_s, startup_s)
        replicas = controller.ordered
        changes = controller.changes
    firsts, starts, ends, _ = batch_by_batch(times, s, policy, replicas, is_deterministic(service),
                                             on_batch_start=controller)
    sizes = np.diff(np.append(firsts, len(times)))
    start_of, finish_of = np.repeat(starts, sizes), np.repeat(ends, sizes)

    end = float(finish_of.max())
    bounds = [t for t, _ in changes[1:]] + [end]
    replica_time = sum(r * (max(t1, t0) - t0) for (t0, r), t1 in zip(changes, bounds))
    log = controller.log if controller is not None else ([], [], [], [], [])
    return AutoscaleResult(
        arrival=times, start=start_of, finish=finish_of,
        control_times=np.array(log[0]), replicas=np.array(log[1], dtype=int),
        ongoing=np.array(log[2], dtype=int), replica_time=float(replica_time), running=np.array(log[3], dtype=int),
        mean_ongoing=np.array(log[4], dtype=float),
    )


@dataclass(frozen=True)
class GraphAutoscaleResult(LatencySummary):
    """A whole graph served with each stage under its own autoscaler: end-to-end times, and each stage's run.

    ``stages[name]`` is that stage's :class:`AutoscaleResult`, its per-request arrays in *request* order
    (aligned with ``arrival``); ``finish`` is when the last sink finished each request.
    """

    arrival: np.ndarray
    finish: np.ndarray
    stages: dict[str, AutoscaleResult]

    @property
    def replica_time(self) -> float:
        """Replicas x time over every stage."""
        return float(sum(r.replica_time for r in self.stages.values()))


def simulate_graph_autoscaling(
    stages: Mapping[str, tuple[Stage, Sequence[str]]],
    arrivals: Sequence[float] | np.ndarray,
    autoscaling: Mapping[str, AutoscalingConfig] | None = None,
    seed: int = 0,
    *,
    inputs: Iterable[str] = ("request",),
    time_unit: float = 1e-3,
    control_interval_s: float = 0.1,
    startup_s: float | Mapping[str, float] = 0.0,
) -> GraphAutoscaleResult:
    """Serve ``arrivals`` through a graph of stages, each stage scaled by its own autoscaler, as Ray Serve does.

    Ray Serve autoscales every deployment on its own (each has its own ``autoscaling_config`` and decides on
    its own ongoing requests), so a graph's stages scale one by one: a stage downstream of a bottleneck sees its
    load only once the bottleneck has scaled up and passes the backlog on.  ``autoscaling`` maps stage names to
    an :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig`; a stage not named keeps its ``replicas``.
    ``startup_s`` is one start-up time for every stage or one per stage name (a GPU stage starts slower).  As in
    :func:`~infergraph_lite.simulation.graph.simulate_graph` the stages are simulated in topological order, a
    request entering a stage when all its dependencies have finished it; each stage runs
    :func:`simulate_autoscaling`'s loop on its own arrivals (stage ``k`` of the dict draws from the generator
    ``[seed, 1 + k]``).

    >>> graph = {"pre": (Stage(service_time=0.5), ["request"]), "model": (Stage(service_time=2.0), ["pre"])}
    >>> step = step_arrivals([0.3, 1.2], [3_000.0, 3_000.0])
    >>> config = AutoscalingConfig(target_ongoing_requests=3, max_replicas=4, upscale_delay_s=0.2,
    ...                            look_back_period_s=0.5, metrics_interval_s=0.1)
    >>> run = simulate_graph_autoscaling(graph, step, {"pre": config, "model": config})
    >>> int(run.stages["pre"].replicas.max()), int(run.stages["model"].replicas.max())   # the model scales more
    (1, 4)
    """
    plan = prepare_stages(stages, inputs, need="service_time")
    times = check_arrivals(arrivals)
    autoscaling = dict(autoscaling or {})
    unknown = sorted(set(autoscaling) - set(plan.nodes))
    if unknown:
        raise ValueError(f"autoscaling names stages the graph does not have: {unknown}")
    for name, config in autoscaling.items():
        if not isinstance(config, AutoscalingConfig):
            raise ValueError(f"autoscaling[{name!r}] must be an AutoscalingConfig, got {config!r}")
    startups = dict(startup_s) if isinstance(startup_s, Mapping) else dict.fromkeys(plan.nodes, startup_s)
    missing = sorted(set(plan.nodes) - set(startups))
    if missing or set(startups) - set(plan.nodes):
        raise ValueError(f"startup_s must name every stage once: missing {missing}, "
                         f"unknown {sorted(set(startups) - set(plan.nodes))}")
    for name, value in startups.items():
        check_number(f"startup_s[{name!r}]", value, positive=False)
    unit = check_number("time_unit", time_unit)
    check_number("control_interval_s", control_interval_s)

    position = {name: k for k, name in enumerate(plan.nodes)}
    finish: dict[str, np.ndarray] = {}
    results: dict[str, AutoscaleResult] = {}
    for name in plan.order:
        stage, deps = plan.nodes[name]
        sources = [finish[d] if d in plan.nodes else times for d in dict.fromkeys(deps)] or [times]
        arrive = sources[0] if len(sources) == 1 else np.maximum.reduce(sources)
        order = np.argsort(arrive, kind="stable")  # this stage's queue in the order requests reach it
        run = _autoscale_stage(stage, arrive[order], autoscaling.get(name),
                               np.random.default_rng([seed, 1 + position[name]]), unit, control_interval_s,
                               startups[name])
        start, done = np.empty(len(times)), np.empty(len(times))
        start[order], done[order] = run.start, run.finish
        finish[name] = done
        results[name] = dataclasses.replace(run, arrival=arrive, start=start, finish=done)
    sinks = [name for name in plan.order if not plan.dependents[name]]
    end = finish[sinks[0]] if len(sinks) == 1 else np.maximum.reduce([finish[s] for s in sinks])
    return GraphAutoscaleResult(arrival=times, finish=end, stages={name: results[name] for name in plan.nodes})


class _Controller:
    # Ray's control loop as a hook on the batch loop (a BatchHook): before each batch, if the batch would start
    # at or after the next control time, every earlier batch is placed, so the controller runs at that time
    # first; and a replica ordered away leaves when it is next free instead of taking the batch.
    def __init__(self, config: AutoscalingConfig, times: np.ndarray, unit: float, interval_s: float,
                 startup_s: float):
        self.config, self.arrivals = config, times.tolist()
        # Every time in the simulator's unit, rounded to 1e-9 of it so that 0.043 s is 43 ms and not
        # 43.00000000000001; the decision counts are Ray's, int(delay / control interval).
        def units(seconds: float) -> float:
            return round(seconds / unit, 9)

        self.interval, self.look_back, self.startup = units(interval_s), units(config.look_back_period_s), \
            units(startup_s)
        self.up_after = int(units(config.upscale_delay_s) / self.interval)
        self.down_after = int(units(config.downscale_delay_s) / self.interval)
        self.sample_every = max(1, round(config.metrics_interval_s / interval_s))  # control steps per report
        self.ordered = config.start_replicas
        self.retiring = 0            # replicas ordered away, leaving as soon as they are next free
        self.counter = 0             # Ray's decision counter: > 0 consecutive ups, < 0 consecutive downs
        self.control_t = float(times[0]) + self.interval
        self.steps = 0
        self.samples: deque[tuple[float, int]] = deque()
        self.in_flight: list[tuple[float, int]] = []  # heap of (end, size) of placed batches not yet counted done
        self.placed = 0              # batches moved into in_flight so far
        self.finished = 0
        self.starting: list[float] = []  # when each ordered replica that is not yet running will be
        self.changes = [(float(times[0]), self.ordered)]  # (time, replicas ordered from then)
        self.log: tuple[list[float], list[int], list[int], list[int], list[float]] = ([], [], [], [], [])

    def __call__(self, start: float, next_request: int, state: QueueState) -> bool:
        if start >= self.control_t:
            self._control(next_request, state)
            return True
        if self.retiring:  # the replica free first was ordered away: it leaves now instead of serving
            heapq.heappop(state.free_at)
            self.retiring -= 1
            return True
        return False

    def _control(self, next_request: int, state: QueueState) -> None:
        config, t = self.config, self.control_t
        first, end = state.first, state.end
        for k in range(self.placed, len(end)):
            size = (first[k + 1] if k + 1 < len(first) else next_request) - first[k]
            heapq.heappush(self.in_flight, (end[k], size))
        self.placed = len(end)
        while self.in_flight and self.in_flight[0][0] <= t:
            self.finished += heapq.heappop(self.in_flight)[1]
        ongoing = bisect.bisect_right(self.arrivals, t) - self.finished
        if self.steps % self.sample_every == 0:
            self.samples.append((t, ongoing))
        while len(self.samples) > 1 and self.samples[0][0] <= t - self.look_back:
            self.samples.popleft()
        mean_ongoing = sum(o for _, o in self.samples) / len(self.samples)
        self.starting = [ready for ready in self.starting if ready > t]
        running = self.ordered - len(self.starting)
        # Ray scales from the replicas running (a factor multiplies the change from them) and compares the
        # result with its target, the replicas ordered: one still starting is ordered, not running.
        desired = config.desired(mean_ongoing, running) if running > 0 else self.ordered
        if desired > self.ordered:
            self.counter = max(self.counter, 0) + 1
            act = self.counter > self.up_after
        elif desired < self.ordered:
            self.counter = min(self.counter, 0) - 1
            act = -self.counter > self.down_after
        else:
            self.counter, act = 0, False
        if act:
            self.counter = 0
            if desired > self.ordered:
                cancel = min(self.retiring, desired - self.ordered)  # replicas not yet gone simply stay
                self.retiring -= cancel
                for _ in range(desired - self.ordered - cancel):
                    heapq.heappush(state.free_at, t + self.startup)
                    self.starting.append(t + self.startup)
            else:
                drop = self.ordered - desired
                while drop and self.starting:  # Ray stops replicas still starting first; none has served yet
                    state.free_at.remove(self.starting.pop())
                    drop -= 1
                heapq.heapify(state.free_at)
                self.retiring += drop
            self.ordered = desired
            self.changes.append((t, self.ordered))
        self.log[0].append(t)
        self.log[1].append(self.ordered)
        self.log[2].append(ongoing)
        self.log[3].append(self.ordered - sum(ready > t for ready in self.starting))
        self.log[4].append(mean_ongoing)
        self.control_t += self.interval
        self.steps += 1
