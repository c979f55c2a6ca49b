"""From a :class:`~infergraph_lite.core.stage.Stage` to what Dask runs: plain functions, no Dask needed.

:func:`from_stage` is the one mapping (every field mapped or refused by name); :func:`stage_item` is what each
task calls; :func:`prepare` validates a graph and its stages.  They live apart from
:mod:`~infergraph_lite.frameworks.dask.graph` and :mod:`~infergraph_lite.frameworks.dask.cluster` so that the
mapping can be read, tested and shown without importing Dask.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from infergraph_lite.core.graph import Graph, InvalidNodeError, Plan
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError, batch_item, prepare_stages

__all__ = ["ENGINE", "from_stage", "prepare", "stage_item"]

ENGINE = "Dask"  # how UnsupportedStageFieldError names this engine


def stage_item(fn: Any, *values: Any) -> Any:
    """Run a stage's batch function on one request: a batch of one item (one value, or a tuple of several).

    >>> stage_item(lambda xs: [x * 2 for x in xs], 21)
    42
    >>> stage_item(lambda pairs: [a + b for a, b in pairs], 1, 2)
    3
    >>> stage_item(lambda xs: exit(3), 1)
    Traceback (most recent call last):
    ...
    RuntimeError: SystemExit raised by a stage: 3
    """
    try:
        return fn([batch_item(values)])[0]
    except Exception:
        raise
    except BaseException as error:  # noqa: BLE001 - reported to the caller as this request's failure
        # A Dask worker lets SystemExit / KeyboardInterrupt through to shut itself down (its nanny restarts
        # it and the task is retried elsewhere); from a stage they are a failure of that request, reported so.
        raise RuntimeError(f"{type(error).__name__} raised by a stage: {error}") from None


def from_stage(name: str, stage: Stage) -> Callable[[list[Any]], Sequence[Any]]:
    """What Dask makes of a :class:`~infergraph_lite.core.stage.Stage`: the batch function its task calls.

    Every field is mapped or refused by name, before anything runs:

    - ``fn``: the task calls it on a batch of one item (:func:`stage_item`);
    - ``service_time``: not a setting of a real engine (what the simulator predicts); left unused;
    - ``max_batch_size``: 1 (each request's task runs alone); anything else, ``None`` or an ``AIMD``
      included, is refused: a task scheduler has no batcher;
    - ``max_wait``: 0; a wait is refused (there is no batcher to wait in);
    - ``replicas``: 1; more are refused (tasks run on the cluster's workers, ``n_workers``);
    - ``max_queue_size``: ``None``; a bound is refused (no request queue: ``DaskGraphCluster``'s
      ``max_requests`` bounds the requests in flight instead).

    >>> from_stage("n", Stage(fn=list)) is list
    True
    >>> from_stage("topic", Stage(fn=list, max_batch_size=16))
    Traceback (most recent call last):
    ...
    infergraph_lite.core.stage.UnsupportedStageFieldError: Dask cannot serve stage 'topic' with max_batch_size=16: \
a task scheduler has no batcher: each request's task runs alone, on a batch of one
    """
    if stage.fn is None:
        raise InvalidNodeError(name, "this Stage has no fn (a batch function list -> list) to run")
    if stage.max_batch_size != 1:
        raise UnsupportedStageFieldError(ENGINE, name, "max_batch_size", stage.max_batch_size,
                                         "a task scheduler has no batcher: each request's task runs alone, "
                                         "on a batch of one")
    if stage.max_wait != 0:
        raise UnsupportedStageFieldError(ENGINE, name, "max_wait", stage.max_wait,
                                         "a task scheduler has no batcher to wait in; a task starts when its "
                                         "inputs are ready")
    if stage.replicas != 1:
        raise UnsupportedStageFieldError(ENGINE, name, "replicas", stage.replicas,
                                         "a task runs on whichever worker is free; size the cluster with n_workers")
    if stage.max_queue_size is not None:
        raise UnsupportedStageFieldError(ENGINE, name, "max_queue_size", stage.max_queue_size,
                                         "a task scheduler has no request queue to bound; DaskGraphCluster's "
                                         "max_requests bounds the requests in flight")
    return stage.fn


def prepare(nodes: Graph, inputs: Iterable[str] | Mapping[str, Any]) -> Plan:
    """The graph's :class:`~infergraph_lite.core.graph.Plan`, with every Stage's fields checked by :func:`from_stage`.

    The one stage-graph validation (plain functions admitted, as ``run_graph`` takes them), so a bad graph or a
    field Dask cannot honour fails here, before any task graph is built or any cluster starts.

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> prepare(banana_nodes(), BANANA_INPUTS).order[-1]
    'combine'
    """
    plan = prepare_stages(nodes, inputs, need="fn", functions=True)
    for name, (func, _) in plan.nodes.items():
        if isinstance(func, Stage):
            from_stage(name, func)
    return plan
