"""The same graph on Dask: one task graph per request, on a local cluster bound to 127.0.0.1 (notebook 07).

Dask's task graph is the seed's dict seen from the other side.  Ours maps a node to
``(func, [dependency names])``; Dask's maps a key to a task that calls a function on references
to other keys::

    {"pre": (clean, ["text"]), ...}                     # ours
    {"text": DataNode("text", "  BANANA  "),            # Dask's: the input is data ...
     "pre": Task("pre", clean, TaskRef("text")), ...}   # ... and each node a task on its dependencies

:func:`to_dask_graph` makes the second from the first (validated by the graph module first, so a bad
graph fails before anything runs); :func:`run_dask` runs it; :class:`DaskGraphCluster` runs graphs on
a ``distributed.LocalCluster`` whose scheduler, nannies and workers all listen on 127.0.0.1, and
gives ``submit(inputs) -> Future`` for the package's load generators.

What a task scheduler is not: it has no request queue and no batching.  Every request is its own
graph, and each task of it runs on its own, so a stage's batch function always sees one item; the
throughput that Triton and Ray Serve gain by batching requests is not on offer here.

(The explicit ``DataNode``/``TaskRef`` spec, rather than Dask's older tuple form, matters: in a tuple
graph an input whose *value* is a string equal to some key name would be read as a reference.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dask.task_spec import DataNode, GraphNode, Task, TaskRef
from dask.typing import Key

from infergraph_lite.core.graph import Graph, Plan
from infergraph_lite.core.stage import Stage
from infergraph_lite.frameworks.dask.options import ENGINE, from_stage, prepare, stage_item

__all__ = ["ENGINE", "from_stage", "run_dask", "stage_item", "to_dask_graph"]


def to_dask_graph(
    nodes: Graph, inputs: Mapping[str, Any], *, request: int | str | None = None, plan: Plan | None = None
) -> dict[Key, GraphNode]:
    """The graph as a Dask task graph: each input a ``DataNode``, each node a ``Task`` on its dependencies.

    ``nodes`` is the seed's shape (``name -> (func, [deps])``, ``func`` called with one value per
    dependency) or a stage graph (``name -> (Stage(fn=...), [deps])``, ``fn`` called on a batch of
    one).  Keys are the names, or ``(name, request)`` when ``request`` is given, so that many
    requests' graphs can share one scheduler without their keys colliding.  Graph errors are raised
    here, before anything runs.

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> graph = to_dask_graph(banana_nodes(), BANANA_INPUTS)
    >>> sorted(graph)
    ['combine', 'modelA', 'modelB', 'pre', 'text']
    >>> sorted(graph["combine"].dependencies)
    ['modelA', 'modelB']
    >>> to_dask_graph({"a": (len, ["b"]), "b": (len, ["a"])}, {})
    Traceback (most recent call last):
    ...
    infergraph_lite.core.graph.CycleError: cycle: a -> b -> a
    """
    if plan is None:
        plan = prepare(nodes, inputs)
    plan.check_inputs(inputs)

    def key(name: str) -> Key:
        return name if request is None else (name, request)

    graph: dict[Key, GraphNode] = {key(name): DataNode(key(name), inputs[name]) for name in sorted(plan.inputs)}
    for name in plan.order:
        func, deps = plan.nodes[name]
        refs = [TaskRef(key(d)) for d in deps]
        if isinstance(func, Stage):
            graph[key(name)] = Task(key(name), stage_item, from_stage(name, func), *refs)
        else:
            graph[key(name)] = Task(key(name), func, *refs)
    return graph


def run_dask(nodes: Graph, inputs: Mapping[str, Any], *, client: Any = None) -> dict[str, Any]:
    """Run the graph once with Dask and return the inputs plus every node's value, as ``run_graph`` does.

    Without a ``client``, Dask's threaded scheduler runs it in this process; with a
    ``distributed.Client``, the cluster does.

    >>> from infergraph_lite.lessons.examples import banana_nodes, BANANA_INPUTS
    >>> run_dask(banana_nodes(), BANANA_INPUTS)["combine"]
    {'len': 6, 'a_count': 3}
    """
    plan = prepare(nodes, inputs)
    graph = to_dask_graph(nodes, inputs, plan=plan)
    if client is None:
        from dask.threaded import get

        values = get(graph, list(plan.order))
    else:
        values = client.get(graph, list(plan.order))
    return {**inputs, **dict(zip(plan.order, values))}
