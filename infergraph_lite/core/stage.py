"""A stage of a served graph: a node's batching knobs, replicas, and what it costs or computes.

From notebook 06 on, a :class:`Stage` stands where the seed's callable stood::

    stages = {
        "pre":     (Stage(service_time=0.4), ["request"]),
        "modelA":  (Stage(service_time=(2.0, 0.15), max_batch_size=16, max_wait=1.0, replicas=2), ["pre"]),
        "modelB":  (Stage(service_time=Exponential(1.5)), ["pre"]),
        "combine": (Stage(service_time=0.1), ["modelA", "modelB"]),
    }

The same dict is simulated (``service_time``), served for real (``fn``, a
batch function ``list -> list``), or both.  A stage whose node reads several
dependencies receives, per request, a tuple of their values in the order
listed; with one dependency, the value itself.

Service times take every form :func:`~infergraph_lite.simulation.queue.simulate_batching`
takes: a number (the same for any batch), ``(alpha, beta)`` for
``alpha + beta * b``, a callable ``b -> time``, or :class:`Exponential`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.graph import InvalidNodeError, Plan, prepare
from infergraph_lite.core.policy import AIMD, BatchPolicy

__all__ = ["STAGE_FIELDS", "Exponential", "ServiceTime", "Stage", "UnsupportedStageFieldError", "batch_item",
           "capacity", "mean_service_time", "prepare_stages", "service_time_fn"]


@dataclass(frozen=True)
class Exponential:
    """A memoryless service time with the given mean, whatever the batch size.

    Queueing-network theory (Jackson's theorem, fork-join results) is exact
    for exponential servers, which is why the simulator accepts them.

    >>> Exponential(1.5).mean
    1.5
    """

    mean: float

    def __post_init__(self) -> None:
        check_number("Exponential mean", self.mean)


ServiceTime = float | tuple[float, float] | Callable[[int], float] | Exponential


def service_time_fn(
    service_time: ServiceTime, rng: np.random.Generator | None = None, *, allow_zero: bool = False
) -> Callable[[int], float]:
    """Turn a service-time spec into a function ``b -> time``, checking it.

    A number is a constant; ``(alpha, beta)`` means ``alpha + beta * b``;
    :class:`Exponential` draws from ``rng`` (seed 0 if none is given).
    ``allow_zero`` admits a stage that costs nothing (a join).

    >>> service_time_fn((2.0, 0.5))(4)
    4.0
    >>> service_time_fn(-1.0)
    Traceback (most recent call last):
    ...
    ValueError: service_time must be > 0, got -1.0
    """
    if isinstance(service_time, Exponential):
        draw = (rng if rng is not None else np.random.default_rng(0)).exponential
        mean = service_time.mean
        return lambda b: float(draw(mean))
    if callable(service_time):
        function = service_time

        def checked(b: int) -> float:
            t = function(b)
            if not (isinstance(t, (int, float, np.floating, np.integer)) and t >= 0 and math.isfinite(t)) or (
                t == 0 and not allow_zero
            ):
                raise ValueError(f"service_time({b}) returned {t!r}; a batch must take a positive, finite time")
            return float(t)

        return checked
    if isinstance(service_time, tuple):
        if len(service_time) != 2:
            raise ValueError(f"service_time as a tuple must be (alpha, beta), got {service_time!r}")
        ok = all(isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(v) and v >= 0
                 for v in service_time)
        if not ok or (sum(service_time) <= 0 and not allow_zero):
            raise ValueError(f"service_time (alpha, beta) must be >= 0 with alpha + beta > 0, got {service_time!r}")
        alpha, beta = float(service_time[0]), float(service_time[1])
        return lambda b: alpha + beta * b
    t = check_number("service_time", service_time, positive=not allow_zero)
    return lambda b: t


def mean_service_time(service_time: ServiceTime, b: int) -> float:
    """The mean time of a batch of ``b``: the spec's value, or an Exponential's mean.

    >>> mean_service_time(Exponential(2.0), 8), mean_service_time((1.0, 0.5), 4)
    (2.0, 3.0)
    """
    if isinstance(service_time, Exponential):
        return service_time.mean
    return service_time_fn(service_time, allow_zero=True)(b)


def capacity(service_time: ServiceTime, max_batch_size: int | AIMD | None = 1, replicas: int = 1) -> float:
    """The most requests per unit time the servers can finish: ``replicas * max_b b / s(b)``.

    With no cap the best batch is unbounded; for ``(alpha, beta)`` that limit
    is ``1 / beta``.  For a callable with no cap, batches up to 4096 are tried;
    an :class:`AIMD` cap counts as its ``max_size``.  A stage that costs nothing
    has infinite capacity.

    >>> capacity((1.0, 0.25), max_batch_size=4)   # 4 requests every 2 time units
    2.0
    >>> capacity((1.0, 0.25), max_batch_size=None)
    4.0
    """
    largest = BatchPolicy(max_batch_size).largest_cap
    replicas = check_count("replicas", replicas) or 1
    if largest is None:
        if isinstance(service_time, tuple):
            beta = float(service_time[1])  # alpha + beta*b per batch: b / s(b) rises towards 1 / beta
            return replicas * (math.inf if beta == 0 else 1.0 / beta)
        if not callable(service_time):
            return math.inf  # the same time for any batch: no limit at all
    best = 0.0
    for b in range(1, (largest or 4096) + 1):
        mean = mean_service_time(service_time, b)
        if mean == 0:
            return math.inf
        best = max(best, b / mean)
    return replicas * best


def batch_item(values: Sequence[Any]) -> Any:
    """A request's item for a stage's batch function, from its dependencies' values in the order listed.

    One dependency passes its value as itself; several pass a tuple of their values (a stage with no
    dependencies, the empty tuple).  Every engine (GraphServer, Ray Serve, Dask, Triton) builds a
    stage's item here, so they cannot disagree.

    >>> batch_item(["banana"])
    'banana'
    >>> batch_item([6, 3])
    (6, 3)
    """
    return values[0] if len(values) == 1 else tuple(values)


class UnsupportedStageFieldError(ValueError):
    """An engine cannot honour one of a :class:`Stage`'s settings: it refuses by name rather than drop it.

    Every adapter (GraphServer, Triton, Ray Serve, Dask) maps each ``Stage`` field onto its own setting or
    raises this, before anything starts.

    >>> raise UnsupportedStageFieldError("dask", "topic", "max_batch_size", 16, "a task graph has no batcher")
    Traceback (most recent call last):
    ...
    infergraph_lite.core.stage.UnsupportedStageFieldError: dask cannot serve stage 'topic' with max_batch_size=16: \
a task graph has no batcher
    """

    def __init__(self, engine: str, stage: str, field: str, value: object, why: str):
        super().__init__(f"{engine} cannot serve stage {stage!r} with {field}={value!r}: {why}")
        self.engine, self.stage, self.field, self.value = engine, stage, field, value


@dataclass(frozen=True)
class Stage:
    """One node of a served graph: batching knobs, replicas, a service time and/or a real batch function.

    ``max_batch_size``/``max_wait`` are the :class:`~infergraph_lite.core.policy.BatchPolicy`
    (``max_wait`` in the same unit as ``service_time``; seconds for a real
    ``fn``), ``replicas`` how many servers share the stage's queue (Triton's
    ``instance_group { count }``), ``max_queue_size`` how many requests may
    wait before new ones are refused (None: no limit).  A stage needs a
    ``service_time`` to be simulated and an ``fn`` to be served; ``0`` is
    allowed for a stage that costs nothing.

    >>> Stage(service_time=(2.0, 0.15), max_batch_size=16, max_wait=1.0, replicas=2).policy()
    BatchPolicy(max_batch_size=16, max_wait=1.0)
    >>> Stage(service_time=1.0, replicas=0)
    Traceback (most recent call last):
    ...
    ValueError: replicas must be an integer >= 1, got 0
    """

    service_time: ServiceTime | None = None
    max_batch_size: int | AIMD | None = 1
    max_wait: float = 0.0
    replicas: int = 1
    fn: Callable[[list[Any]], Sequence[Any]] | None = None
    max_queue_size: int | None = None

    def __post_init__(self) -> None:
        if self.service_time is None and self.fn is None:
            raise ValueError("a Stage needs a service_time (to simulate it), an fn (to serve it), or both")
        if self.service_time is not None:
            service_time_fn(self.service_time, allow_zero=True)  # raises on a malformed spec
        if self.fn is not None and not callable(self.fn):
            raise ValueError(f"fn must be a batch function list -> list, got {self.fn!r}")
        policy = BatchPolicy(self.max_batch_size, self.max_wait)  # validates both
        if not isinstance(self.max_batch_size, AIMD):
            object.__setattr__(self, "max_batch_size", policy.cap)
        object.__setattr__(self, "max_wait", policy.max_wait)
        object.__setattr__(self, "replicas", check_count("replicas", self.replicas))
        object.__setattr__(self, "max_queue_size", check_count("max_queue_size", self.max_queue_size,
                                                               allow_none=True))

    def policy(self) -> BatchPolicy:
        """A fresh :class:`~infergraph_lite.core.policy.BatchPolicy` with this stage's knobs."""
        return BatchPolicy(self.max_batch_size, self.max_wait)

    def capacity(self) -> float:
        """Requests per time unit this stage can finish at best (needs a ``service_time``)."""
        if self.service_time is None:
            raise ValueError("this Stage has no service_time, so its capacity is unknown: profile its fn first")
        return capacity(self.service_time, self.max_batch_size, self.replicas)


STAGE_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Stage))
"""Every :class:`Stage` field, in order: each engine's ``from_stage`` maps or refuses (by name) each one.

>>> STAGE_FIELDS
('service_time', 'max_batch_size', 'max_wait', 'replicas', 'fn', 'max_queue_size')
"""


def prepare_stages(
    stages: Mapping[str, tuple[Any, Sequence[str]]],
    inputs: Iterable[str] | Mapping[str, Any] = ("request",),
    *,
    need: str | None = None,
    functions: bool = False,
) -> Plan:
    """Validate a stage graph once: the graph checks of :func:`~infergraph_lite.core.graph.prepare`,
    then every node holds a :class:`Stage` (with a ``service_time`` if ``need="service_time"``,
    an ``fn`` if ``need="fn"``).  ``functions=True`` also admits the seed's plain functions in place
    of Stages (an engine that runs both, as Dask does).  Errors name the node.

    >>> plan = prepare_stages({"a": (Stage(service_time=1.0), ["request"])})
    >>> plan.order
    ['a']
    >>> prepare_stages({"a": (Stage(service_time=1.0), ["request"])}, need="fn")
    Traceback (most recent call last):
    ...
    infergraph_lite.core.graph.InvalidNodeError: node 'a': this Stage has no fn (a batch function list -> list) to serve
    >>> prepare_stages({"a": (len, ["request"]), "b": (Stage(fn=list), ["a"])}, need="fn", functions=True).order
    ['a', 'b']
    """
    if need not in (None, "fn", "service_time"):
        raise ValueError(f"need must be None, 'fn' or 'service_time', got {need!r}")
    plan = prepare(stages, inputs, require_callable=False)
    for name, (stage, _) in plan.nodes.items():
        if functions and not isinstance(stage, Stage):
            if not callable(stage):
                raise InvalidNodeError(name, f"expected a function or a Stage, got {type(stage).__name__} {stage!r}")
            continue
        if not isinstance(stage, Stage):
            raise InvalidNodeError(name, f"expected a Stage in place of the function, got {type(stage).__name__}")
        if need == "service_time" and stage.service_time is None:
            raise InvalidNodeError(name, "this Stage has no service_time to simulate; give one or profile its fn")
        if need == "fn" and stage.fn is None:
            raise InvalidNodeError(name, "this Stage has no fn (a batch function list -> list) to serve")
    return plan
