"""From a :class:`~infergraph_lite.core.stage.Stage` to Ray Serve's settings: plain functions, no Ray needed.

:func:`from_stage` is the one mapping; :mod:`~infergraph_lite.frameworks.ray.serve` deploys what it
returns.  It lives apart from that module so that the mapping can be read, tested and shown without
importing Ray.  Field by field::

    Stage.fn              ->  the deployment's batch function (StageReplica)
    Stage.max_batch_size  ->  @serve.batch(max_batch_size=...); 1: no @serve.batch; None and AIMD refused
    Stage.max_wait (s)    ->  @serve.batch(batch_wait_timeout_s=...)  (a cap of 1 never waits)
    Stage.replicas        ->  .options(num_replicas=...)  (an autoscaling_config replaces it)
    Stage.max_queue_size  ->  .options(max_queued_requests=...)  (None: -1, no limit)
    Stage.service_time    ->  not a setting: a real engine takes the time its fn takes
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.graph import InvalidNodeError
from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError

__all__ = ["ENGINE", "ServeStage", "batch_options", "deployment_options", "from_stage"]

ENGINE = "Ray Serve"  # how UnsupportedStageFieldError names this engine


@dataclass(frozen=True)
class ServeStage:
    """One stage as Ray Serve runs it: its batch function, its deployment's ``.options(...)`` and its
    ``@serve.batch`` arguments (``None``: the stage does not batch)."""

    fn: Callable[[list[Any]], Sequence[Any]]
    options: dict[str, Any]
    batching: dict[str, Any] | None


def batch_options(stage: Stage, *, name: str = "stage") -> dict[str, Any] | None:
    """``@serve.batch`` arguments for a stage, or None for a stage that does not batch (``max_batch_size=1``).

    ``max_wait`` is the same knob as Serve's ``batch_wait_timeout_s`` (seconds).  Serve's batcher needs
    a whole-number cap, so ``max_batch_size=None`` (no cap) and an ``AIMD`` cap are refused by name
    (``name`` is the stage's, for the error) rather than replaced by some number.

    >>> batch_options(Stage(fn=list, max_batch_size=16, max_wait=0.002))
    {'max_batch_size': 16, 'batch_wait_timeout_s': 0.002}
    >>> batch_options(Stage(fn=list)) is None
    True
    >>> batch_options(Stage(fn=list, max_batch_size=None), name="topic")
    Traceback (most recent call last):
    ...
    infergraph_lite.core.stage.UnsupportedStageFieldError: Ray Serve cannot serve stage 'topic' with \
max_batch_size=None: @serve.batch needs a whole-number max_batch_size; give the stage one
    """
    size = stage.max_batch_size
    if isinstance(size, AIMD):
        raise UnsupportedStageFieldError(ENGINE, name, "max_batch_size", size,
                                         "@serve.batch has a fixed max_batch_size; an AIMD cap has no Serve "
                                         "equivalent. Give the stage an integer max_batch_size")
    if size is None:
        raise UnsupportedStageFieldError(ENGINE, name, "max_batch_size", size,
                                         "@serve.batch needs a whole-number max_batch_size; give the stage one")
    if size == 1:
        return None  # a cap of 1 starts every request at once, so max_wait never comes into play
    return {"max_batch_size": int(size), "batch_wait_timeout_s": stage.max_wait}


def deployment_options(
    stage: Stage, num_cpus: float, autoscaling: AutoscalingConfig | Mapping[str, Any] | None = None, *,
    name: str = "stage"
) -> dict[str, Any]:
    """The ``.options(...)`` of a stage's deployment: replicas (or autoscaling), CPU share, queue limits.

    ``max_ongoing_requests`` (requests a replica holds at once) must be at least the batch size, or
    Serve could never form a full batch; ``max_queue_size`` becomes ``max_queued_requests`` (a limit
    that Serve enforces per caller, here the one ingress, so per stage).

    >>> deployment_options(Stage(fn=list, max_batch_size=16, replicas=2, max_queue_size=100), num_cpus=0.25)
    {'num_replicas': 2, 'ray_actor_options': {'num_cpus': 0.25}, 'max_ongoing_requests': 32, 'max_queued_requests': 100}
    """
    batching = batch_options(stage, name=name)
    options: dict[str, Any] = {"num_replicas": stage.replicas}
    if autoscaling is not None:
        options = {"autoscaling_config": autoscaling.to_ray_config() if isinstance(autoscaling, AutoscalingConfig)
                   else dict(autoscaling)}
    options["ray_actor_options"] = {"num_cpus": num_cpus}
    options["max_ongoing_requests"] = max(8, 2 * batching["max_batch_size"]) if batching else 8
    options["max_queued_requests"] = -1 if stage.max_queue_size is None else stage.max_queue_size
    return options


def from_stage(
    name: str, stage: Stage, num_cpus: float = 1.0, autoscaling: Mapping[str, Any] | None = None
) -> ServeStage:
    """What Ray Serve makes of a stage: every field mapped (see the module's table) or refused by name,
    with :class:`~infergraph_lite.core.stage.UnsupportedStageFieldError`, before Ray starts.

    >>> served = from_stage("topic", Stage(fn=list, max_batch_size=16, max_wait=0.002, replicas=2), num_cpus=0.25)
    >>> served.batching, served.options["num_replicas"], served.fn is list
    ({'max_batch_size': 16, 'batch_wait_timeout_s': 0.002}, 2, True)
    """
    if stage.fn is None:
        raise InvalidNodeError(name, "this Stage has no fn (a batch function list -> list) to serve")
    return ServeStage(stage.fn, deployment_options(stage, num_cpus, autoscaling, name=name),
                      batch_options(stage, name=name))
