"""Capacity planning for a served graph: per-stage batching and replicas that meet a p99 target at least cost.

InferLine's idea (Crankshaw et al., "InferLine: latency-aware provisioning and scaling for prediction serving
pipelines", SoCC 2020): a greedy search over each model's batch size and replicas with a simulator of the whole
pipeline in the loop.  InferLine starts from a feasible, expensive configuration and greedily takes cost away;
this planner runs the other way: it starts from the cheapest configuration that can keep up, greedily takes
the change — one more replica somewhere, or another batch size or batch window for a model — that cuts the
simulated end-to-end p99 the most per unit of cost until the target is met, then tries to take replicas away
again.  Every candidate is checked by :func:`~infergraph_lite.simulation.graph.simulate_graph`
with the same arrivals and draws (common random numbers), so candidates are compared fairly.

Cost is replicas times their price per hour, and per million requests at the planned arrival rate.
:func:`brute_force_plan` tries every configuration in order of cost, to check the greedy planner on small
graphs; :func:`uniform_plan` is the naive baseline (the same batching and replica count everywhere).

Introduced in notebook 06.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infergraph_lite.core.arguments import check_count, check_fraction, check_number
from infergraph_lite.core.stage import Exponential, Stage, mean_service_time, prepare_stages
from infergraph_lite.simulation.graph import GraphResult, simulate_graph

__all__ = ["CapacityPlan", "PlanningProblem", "brute_force_plan", "cost_per_hour", "cost_per_million",
           "plan_capacity", "tunable_stages", "uniform_plan"]

StageGraph = Mapping[str, tuple[Any, Sequence[str]]]
Price = float | Mapping[str, float]
# one stage's knobs: (max_batch_size, max_wait, replicas)
Knobs = tuple[int | None, float, int]


def _price_of(price: Price, name: str) -> float:
    if isinstance(price, Mapping):
        if name not in price:
            raise ValueError(f"price_per_replica_hour has no price for stage {name!r}")
        return check_number(f"price of stage {name!r}", price[name], positive=False)
    return check_number("price_per_replica_hour", price, positive=False)


def cost_per_hour(stages: StageGraph, price_per_replica_hour: Price) -> float:
    """What the deployment costs per hour: every stage's replicas times its price per replica-hour.

    ``price_per_replica_hour`` is one price for every replica or a mapping ``stage -> price``.

    >>> stages = {"pre": (Stage(service_time=0.3, replicas=2), ["request"]),
    ...           "model": (Stage(service_time=(2.0, 0.15), max_batch_size=8, replicas=3), ["pre"])}
    >>> cost_per_hour(stages, {"pre": 0.10, "model": 2.50})
    7.7
    """
    return round(sum(_price_of(price_per_replica_hour, name) * stage.replicas
                     for name, (stage, _) in stages.items()), 10)


def cost_per_million(
    stages: StageGraph, arrival_rate: float, price_per_replica_hour: Price, time_unit: float = 1e-3
) -> float:
    """Cost of serving a million requests with this deployment kept busy at ``arrival_rate``.

    ``arrival_rate`` is in requests per time unit; ``time_unit`` is that unit in seconds (1e-3: rates per ms,
    as in the notebooks).  A million requests take ``1e6 / arrival_rate`` time units, during which every
    replica is paid for.

    >>> stages = {"model": (Stage(service_time=1.0, replicas=4), ["request"])}
    >>> round(cost_per_million(stages, arrival_rate=2.0, price_per_replica_hour=2.5), 4)   # 500 s of 4 replicas
    1.3889
    """
    rate = check_number("arrival_rate", arrival_rate)
    hours = 1e6 / rate * check_number("time_unit", time_unit) / 3600
    return cost_per_hour(stages, price_per_replica_hour) * hours


def tunable_stages(stages: StageGraph) -> list[str]:
    """The stages whose batching the planners may change: those whose batch cost depends on the batch size.

    A service time ``(alpha, beta)`` or a callable of ``b`` is a model profile, where batching trades latency
    for capacity.  A single number means "the same time for any batch" and an :class:`Exponential` has no
    batch profile, so their batching stays as given (only their replicas change).

    >>> tunable_stages({"pre": (Stage(service_time=0.3), ["request"]),
    ...                 "model": (Stage(service_time=(2.0, 0.15)), ["pre"])})
    ['model']
    """
    return [name for name, (stage, _) in stages.items()
            if isinstance(stage.service_time, tuple) or (callable(stage.service_time)
                                                         and not isinstance(stage.service_time, Exponential))]


@dataclass(frozen=True)
class CapacityPlan:
    """A planned deployment: the stage graph with its chosen knobs, its simulated p99 and what it costs."""

    stages: dict[str, tuple[Stage, list[str]]]
    p99_target: float
    p99: float                 # simulated end-to-end p99 of this configuration
    feasible: bool             # p99 <= p99_target
    cost_per_hour: float
    cost_per_million: float
    evaluations: int           # configurations simulated to find it
    result: GraphResult | None = field(default=None, repr=False, compare=False)
    steps: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def replicas(self) -> dict[str, int]:
        return {name: stage.replicas for name, (stage, _) in self.stages.items()}

    @property
    def total_replicas(self) -> int:
        return sum(self.replicas.values())

    def knobs(self) -> dict[str, Knobs]:
        """Per stage ``(max_batch_size, max_wait, replicas)``."""
        return {name: _knobs(stage) for name, (stage, _) in self.stages.items()}

    def table(self) -> str:
        """One line per stage (batching, replicas, utilization), then p99 and cost."""
        lines = [f"{'stage':>12}  {'max_batch':>9}  {'max_wait':>8}  {'replicas':>8}  {'utilization':>11}"]
        for name, (stage, _) in self.stages.items():
            util = f"{self.result.stages[name].utilization:.2f}" if self.result is not None else "-"
            cap = "none" if stage.max_batch_size is None else str(stage.max_batch_size)
            lines.append(f"{name:>12}  {cap:>9}  {stage.max_wait:>8g}  {stage.replicas:>8}  {util:>11}")
        verdict = "meets" if self.feasible else "MISSES"
        lines.append(f"p99 {self.p99:.2f} {verdict} the target {self.p99_target:g}; {self.total_replicas} replicas, "
                     f"{self.cost_per_hour:.2f} per hour, {self.cost_per_million:.3f} per million requests")
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class PlanningProblem:
    """What every planner is asked: serve ``stages`` at ``arrival_rate`` with an end-to-end p99 of at most
    ``p99_target``, at the least cost.  Validated when made, before anything is simulated.

    - ``stages``: the stage graph (``{name: (Stage(service_time=...), [dependencies])}``), each stage's
      knobs the starting point; ``inputs``: the names a dependency may have besides a stage;
    - ``arrival_rate`` (requests per time unit), ``p99_target`` (time units);
    - ``price_per_replica_hour``: one price, or one per stage; ``time_unit``: the simulation's unit in seconds
      (1e-3: ms), for the cost per million requests;
    - the choices: ``batch_sizes`` and ``max_waits`` for model stages (see :func:`tunable_stages`;
      ``max_waits=None``: no window, and windows of half and one single-request service time), 1 to
      ``max_replicas`` replicas for every stage, each stage's offered load at most ``max_load``;
    - the simulation that judges a candidate: ``n_requests`` requests, ``seed`` (the same arrivals and draws
      for every candidate).

    >>> stages = {"pre": (Stage(service_time=0.3), ["request"]),
    ...           "model": (Stage(service_time=(2.0, 0.15)), ["pre"])}
    >>> problem = PlanningProblem(stages, arrival_rate=2.0, p99_target=15.0, n_requests=5_000)
    >>> plan_capacity(problem).replicas == brute_force_plan(problem).replicas == {'pre': 1, 'model': 1}
    True
    >>> PlanningProblem(stages, arrival_rate=2.0, p99_target=15.0, max_load=1.5)
    Traceback (most recent call last):
    ...
    ValueError: max_load must be a fraction in (0, 1), got 1.5
    """

    stages: StageGraph
    arrival_rate: float
    p99_target: float
    price_per_replica_hour: Price = 1.0
    time_unit: float = 1e-3
    batch_sizes: Sequence[int | None] = (1, 2, 4, 8, 16, 32)
    max_waits: Sequence[float] | None = None
    max_replicas: int = 16
    max_load: float = 0.9
    n_requests: int = 20_000
    seed: int = 0
    inputs: Iterable[str] = ("request",)

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("inputs", tuple(self.inputs))
        prepare_stages(self.stages, self.inputs, need="service_time")  # a bad graph or stage, named
        check_number("arrival_rate", self.arrival_rate)
        check_number("p99_target", self.p99_target)
        check_number("time_unit", self.time_unit)
        check_count("max_replicas", self.max_replicas)
        check_fraction("max_load", self.max_load)
        check_count("n_requests", self.n_requests)
        put("batch_sizes", tuple(self.batch_sizes))
        for b in self.batch_sizes:
            check_count("batch_sizes entry", b, allow_none=True)
        if self.max_waits is not None:
            put("max_waits", tuple(self.max_waits))
            for w in self.max_waits:
                check_number("max_waits entry", w, positive=False)
        for name in self.stages:
            _price_of(self.price_per_replica_hour, name)

    def price(self, name: str) -> float:
        """What one replica of stage ``name`` costs per hour."""
        return _price_of(self.price_per_replica_hour, name)

    def batching_options(self, name: str) -> list[tuple[int | None, float]]:
        """The ``(max_batch_size, max_wait)`` pairs a planner may give stage ``name`` (only its own for a stage
        that is not tunable)."""
        stage = self.stages[name][0]
        if name not in tunable_stages(self.stages):
            return [(stage.max_batch_size, stage.max_wait)]
        waits = self.max_waits
        if waits is None:  # no window, and windows of half and one single-request service time
            one = mean_service_time(stage.service_time, 1)
            waits = (0.0, round(one / 2, 10), round(one, 10))
        return [(b, float(w)) for b in self.batch_sizes for w in waits]


def _problem(problem: PlanningProblem | StageGraph, arrival_rate: float | None, p99_target: float | None,
             options: Mapping[str, Any], **defaults: Any) -> PlanningProblem:
    # A planner takes a PlanningProblem, or the same fields as arguments (the keyword calls of notebook 06).
    if isinstance(problem, PlanningProblem):
        if arrival_rate is not None or p99_target is not None or options:
            raise ValueError("give a PlanningProblem or its fields (stages, arrival_rate, p99_target, ...), not both")
        return problem
    return PlanningProblem(problem, arrival_rate, p99_target, **{**defaults, **options})  # type: ignore[arg-type]


def _knobs(stage: Stage) -> Knobs:
    return (stage.max_batch_size, stage.max_wait, stage.replicas)  # type: ignore[return-value]


class _Evaluator:
    # Simulates configurations (dicts stage -> knobs) with common random numbers, once each.
    def __init__(self, problem: PlanningProblem):
        self.problem, self.stages = problem, problem.stages
        self.cache: dict[tuple, GraphResult | None] = {}

    def graph(self, config: Mapping[str, Knobs]) -> dict[str, tuple[Stage, list[str]]]:
        out = {}
        for name, (stage, deps) in self.stages.items():
            b, w, r = config[name]
            out[name] = (dataclasses.replace(stage, max_batch_size=b, max_wait=w, replicas=r), list(deps))
        return out

    def stable(self, name: str, knobs: Knobs) -> bool:
        b, _, r = knobs
        stage = dataclasses.replace(self.stages[name][0], max_batch_size=b, replicas=r)
        return self.problem.arrival_rate <= self.problem.max_load * stage.capacity()

    def p99(self, config: Mapping[str, Knobs]) -> float:
        result = self.run(config)
        return math.inf if result is None else result.percentile(99)

    def run(self, config: Mapping[str, Knobs]) -> GraphResult | None:
        key = tuple(config[name] for name in self.stages)
        if key not in self.cache:
            if not all(self.stable(name, config[name]) for name in self.stages):
                self.cache[key] = None
            else:
                p = self.problem
                self.cache[key] = simulate_graph(self.graph(config), p.arrival_rate, n_requests=p.n_requests,
                                                 seed=p.seed, inputs=p.inputs)
        return self.cache[key]

    @property
    def evaluations(self) -> int:
        return sum(result is not None for result in self.cache.values())

    def plan(self, config: dict[str, Knobs], steps: list[str]) -> CapacityPlan:
        p = self.problem
        stages = self.graph(config)
        result = self.run(config)
        p99 = math.inf if result is None else result.percentile(99)
        return CapacityPlan(
            stages=stages, p99_target=p.p99_target, p99=p99, feasible=p99 <= p.p99_target,
            cost_per_hour=cost_per_hour(stages, p.price_per_replica_hour),
            cost_per_million=cost_per_million(stages, p.arrival_rate, p.price_per_replica_hour, p.time_unit),
            evaluations=self.evaluations, result=result, steps=tuple(steps),
        )


def plan_capacity(
    problem: PlanningProblem | StageGraph,
    arrival_rate: float | None = None,
    p99_target: float | None = None,
    *,
    min_gain: float = 0.002,
    **fields: Any,
) -> CapacityPlan:
    """Choose ``max_batch_size``, ``max_wait`` and ``replicas`` per stage so the simulated end-to-end p99 meets
    the target at the least cost (a greedy planner with the simulator in the loop, as InferLine's).

    Takes a :class:`PlanningProblem`, or its fields: ``plan_capacity(stages, arrival_rate, p99_target,
    price_per_replica_hour=..., max_waits=..., n_requests=...)``.

    1. *Cheapest configuration that keeps up:* every model stage (see :func:`tunable_stages`) at its largest
       batch size with no window (its highest capacity), and every stage at the fewest replicas that keep its
       offered load at or below ``max_load``.
    2. *Greedy:* while the p99 misses the target, simulate every single change — another batch size / window
       for a model stage, or one more replica of a stage together with a fresh choice of its batching — and
       take the one that cuts the p99 most per unit of added cost (a change that costs nothing and helps comes
       first; a cut counts up to what is still missing, and cuts below ``min_gain`` of the p99 count as noise).
    3. *Trim:* while some stage can lose a replica (re-choosing its batching) and still meet the target, take
       the replica away, the most expensive stage first.

    Every candidate is simulated with the problem's ``n_requests`` and ``seed``.  Returns the plan even when
    no configuration met the target (``feasible`` says so).

    >>> stages = {"pre": (Stage(service_time=0.3), ["request"]),
    ...           "model": (Stage(service_time=(2.0, 0.15)), ["pre"])}
    >>> plan = plan_capacity(stages, 2.0, p99_target=15.0, price_per_replica_hour={"pre": 0.1, "model": 2.5},
    ...                      n_requests=5_000)
    >>> plan.feasible, plan.replicas, plan.knobs()["model"][0] > 1
    (True, {'pre': 1, 'model': 1}, True)
    """
    problem = _problem(problem, arrival_rate, p99_target, fields)
    stages, target, max_replicas = problem.stages, problem.p99_target, problem.max_replicas
    evaluator = _Evaluator(problem)
    options = {name: problem.batching_options(name) for name in stages}
    price = {name: problem.price(name) for name in stages}
    steps: list[str] = []

    # 1. cheapest configuration that keeps up
    config: dict[str, Knobs] = {}
    for name in stages:
        b, w = max(options[name], key=lambda o: (dataclasses.replace(stages[name][0], max_batch_size=o[0],
                                                                   replicas=1).capacity(), -o[1]))
        r = next((r for r in range(1, max_replicas + 1) if evaluator.stable(name, (b, w, r))), None)
        if r is None:
            raise ValueError(f"stage {name!r} cannot keep up with {problem.arrival_rate:g} requests per time unit "
                             f"even with max_replicas={max_replicas} at max_load={problem.max_load:g}")
        config[name] = (b, w, r)
    current = evaluator.p99(config)
    steps.append(f"start: cheapest configuration that keeps up, p99 {current:.3g}")

    # 2. greedy: the change that cuts p99 most per unit of cost.  A new replica comes with a fresh choice of
    #    batching for its stage: with more replicas a model can afford smaller batches (and often must be
    #    given them to gain anything, since an upstream batch arrives as one clump that one replica takes).
    while current > target:
        best: tuple[float, float, str, dict[str, Knobs]] | None = None  # (tier, -score, text, config)
        for name in stages:
            b, w, r = config[name]
            candidates = [((ob, ow, r), 0.0, f"{name}: max_batch_size {ob}, max_wait {ow:g}")
                          for ob, ow in options[name] if (ob, ow) != (b, w)]
            if r < max_replicas:
                candidates += [((ob, ow, r + 1), price[name], f"+1 replica of {name} ({r + 1}), max_batch_size {ob}, "
                                f"max_wait {ow:g}") for ob, ow in options[name]]
            for knobs, added, text in candidates:
                trial = {**config, name: knobs}
                if not evaluator.stable(name, knobs):
                    continue
                # what a change is worth: the p99 it removes, up to what is still missing, per unit of cost
                gain = min(current - evaluator.p99(trial), current - target)
                if gain <= min_gain * current:
                    continue
                key = (0.0, -gain) if added == 0 else (1.0, -gain / added)
                if best is None or key < best[:2]:
                    best = (*key, text, trial)
        if best is None:
            steps.append("no single change lowers p99 further: the target cannot be met")
            break
        config, current = best[3], evaluator.p99(best[3])
        steps.append(f"{best[2]} -> p99 {current:.3g}")

    # 3. trim: take replicas away while the target still holds
    trimmed = current <= target
    while trimmed:
        trimmed = False
        for name in sorted(stages, key=lambda n: (-price[n], n)):
            b, w, r = config[name]
            if r == 1:
                continue
            feasible = [(evaluator.p99(trial), ob, ow, trial) for ob, ow in options[name]
                        for trial in [{**config, name: (ob, ow, r - 1)}] if evaluator.stable(name, (ob, ow, r - 1))]
            feasible = [f for f in feasible if f[0] <= target]
            if feasible:
                p99, ob, ow, config = min(feasible, key=lambda f: f[0])
                steps.append(f"-1 replica of {name} ({r - 1}), max_batch_size {ob}, max_wait {ow:g} -> p99 {p99:.3g}")
                current, trimmed = p99, True
                break
    return evaluator.plan(config, steps)


def brute_force_plan(
    problem: PlanningProblem | StageGraph,
    arrival_rate: float | None = None,
    p99_target: float | None = None,
    **fields: Any,
) -> CapacityPlan:
    """The cheapest configuration that meets the target, by trying them all in order of cost.

    Takes a :class:`PlanningProblem` or its fields, as :func:`plan_capacity` (with fields, ``max_replicas``
    defaults to 4).  The same choices and the same simulation as :func:`plan_capacity`; configurations are
    simulated cheapest first, and among those of the first cost that meets the target the one with the lowest
    p99 wins.  Exponential in the number of stages: for checking the planner on small graphs.

    >>> stages = {"pre": (Stage(service_time=0.3), ["request"]),
    ...           "model": (Stage(service_time=(2.0, 0.15)), ["pre"])}
    >>> brute_force_plan(stages, 2.0, p99_target=15.0, n_requests=5_000).replicas
    {'pre': 1, 'model': 1}
    """
    problem = _problem(problem, arrival_rate, p99_target, fields, max_replicas=4)
    evaluator = _Evaluator(problem)
    price = {name: problem.price(name) for name in problem.stages}
    per_stage = [[(b, w, r) for r in range(1, problem.max_replicas + 1) for b, w in problem.batching_options(name)
                  if evaluator.stable(name, (b, w, r))] for name in problem.stages]
    names = list(problem.stages)
    combos = sorted(itertools.product(*per_stage),
                    key=lambda c: round(sum(price[n] * k[2] for n, k in zip(names, c)), 10))
    best: tuple[float, dict[str, Knobs]] | None = None
    best_cost = math.inf
    for combo in combos:
        cost = round(sum(price[n] * k[2] for n, k in zip(names, combo)), 10)
        if cost > best_cost:
            break
        config = dict(zip(names, combo))
        p99 = evaluator.p99(config)
        if p99 <= problem.p99_target and (best is None or p99 < best[0]):
            best, best_cost = (p99, config), cost
    if best is None:
        fallback = dict(zip(names, combos[-1])) if combos else {}
        if not fallback:
            raise ValueError("no configuration keeps up with the load within max_replicas")
        return evaluator.plan(fallback, ["no configuration meets the target"])
    return evaluator.plan(best[1], [])


def uniform_plan(
    problem: PlanningProblem | StageGraph,
    arrival_rate: float | None = None,
    p99_target: float | None = None,
    *,
    max_batch_size: int | None = 8,
    max_wait: float = 0.0,
    **fields: Any,
) -> CapacityPlan:
    """The naive baseline: the same replica count for every stage (the fewest that meets the target) and the
    same batching (``max_batch_size``, ``max_wait``) for every model stage.

    Takes a :class:`PlanningProblem` or its fields, as :func:`plan_capacity` (with fields, ``max_load``
    defaults to 0.99: the baseline only skips configurations that cannot keep up).

    >>> stages = {"pre": (Stage(service_time=0.3), ["request"]),
    ...           "model": (Stage(service_time=(2.0, 0.15)), ["pre"])}
    >>> uniform_plan(stages, 2.0, p99_target=15.0, n_requests=5_000).replicas
    {'pre': 1, 'model': 1}
    """
    problem = _problem(problem, arrival_rate, p99_target, fields, max_load=0.99)
    check_count("max_batch_size", max_batch_size, allow_none=True)
    check_number("max_wait", max_wait, positive=False)
    evaluator = _Evaluator(problem)
    tunable = set(tunable_stages(problem.stages))
    config: dict[str, Knobs] = {}
    for r in range(1, problem.max_replicas + 1):
        config = {name: (max_batch_size, max_wait, r) if name in tunable else (stage.max_batch_size, stage.max_wait, r)
                  for name, (stage, _) in problem.stages.items()}
        if evaluator.p99(config) <= problem.p99_target:
            break
    return evaluator.plan(config, [])
