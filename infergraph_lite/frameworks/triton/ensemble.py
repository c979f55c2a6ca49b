"""A Triton ensemble as the package's own graph shape, its data flow checked by :mod:`infergraph_lite.core.graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infergraph_lite.core.graph import GraphError, MissingDependencyError, prepare
from infergraph_lite.frameworks.triton.config import check_model_config, parse_model_config
from infergraph_lite.frameworks.triton.errors import TritonConfigError

__all__ = ["EnsembleGraph", "ensemble_to_graph"]


@dataclass(frozen=True)
class EnsembleGraph:
    """An ensemble's steps as the package's graph shape, validated by :mod:`infergraph_lite.core.graph`.

    ``nodes`` maps each step's name (its model name) to ``(step, [dependencies])``, a dependency being
    the step that produces an input tensor, or an ensemble input.  ``producers`` maps each tensor to
    the step that writes it; ``levels`` are the waves of steps Triton can run at the same time.
    """

    name: str
    nodes: dict[str, tuple[Any, list[str]]]
    inputs: list[str]
    outputs: list[str]
    producers: dict[str, str]
    levels: list[list[str]]
    config: Any = field(repr=False, default=None)


def ensemble_to_graph(config: str | Any, model: str | None = None) -> EnsembleGraph:
    """Read an ensemble's ``config.pbtxt`` (text or a parsed ``ModelConfig``) into an :class:`EnsembleGraph`.

    The schema check is :func:`~.config.parse_model_config`; the data flow is checked by the graph module:
    a step that reads a tensor nobody writes is a missing dependency, steps that feed each other
    are a cycle.  Errors are :class:`TritonConfigError` naming the model and field, with the
    graph module's error as their ``__cause__``.

    >>> g = ensemble_to_graph('''name: "e" platform: "ensemble" max_batch_size: 8
    ... input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
    ... output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    ... ensemble_scheduling { step [
    ...   { model_name: "a" input_map { key: "in" value: "x" } output_map { key: "out" value: "ta" } },
    ...   { model_name: "b" input_map { key: "in" value: "x" } output_map { key: "out" value: "tb" } },
    ...   { model_name: "c" input_map [ { key: "p" value: "ta" }, { key: "q" value: "tb" } ]
    ...     output_map { key: "out" value: "y" } } ] }''')
    >>> g.levels, g.nodes["c"][1]
    ([['a', 'b'], ['c']], ['a', 'b'])
    """
    parsed = parse_model_config(config, model) if isinstance(config, str) else config
    name = parsed.name or model or "ensemble"
    if parsed.platform != "ensemble":
        raise TritonConfigError(name, "platform", 'an ensemble model needs platform: "ensemble"')
    check_model_config(parsed, model)
    steps = list(parsed.ensemble_scheduling.step)
    if not steps:
        raise TritonConfigError(name, "ensemble_scheduling.step", "an ensemble needs at least one step")
    inputs = [t.name for t in parsed.input]
    if not inputs:
        raise TritonConfigError(name, "input", "declare the ensemble's input tensor(s) in input [ ... ]")
    step_names: list[str] = []
    for i, step in enumerate(steps):
        if not step.model_name:
            raise TritonConfigError(name, f"ensemble_scheduling.step[{i}].model_name", "a step needs a model_name")
        label = step.model_name if step.model_name not in step_names else f"{step.model_name}#{i}"
        step_names.append(label)
    producers: dict[str, str] = {}
    for i, (label, step) in enumerate(zip(step_names, steps)):
        if not step.output_map:
            raise TritonConfigError(name, f"ensemble_scheduling.step[{i}].output_map",
                                    f"step {label!r} writes no tensor")
        for key, tensor in step.output_map.items():
            if tensor in producers or tensor in inputs:
                first = producers.get(tensor, "the ensemble input")
                raise TritonConfigError(name, f"ensemble_scheduling.step[{i}].output_map[{key!r}]",
                                        f"tensor {tensor!r} is produced by two steps ({first} and {label})")
            producers[tensor] = label
    nodes: dict[str, tuple[Any, list[str]]] = {}
    for label, step in zip(step_names, steps):
        # Keys are the model's own tensor names, values the ensemble's: sorted by key for a stable order.
        nodes[label] = (step, [producers.get(tensor, tensor) for _, tensor in sorted(step.input_map.items())])
    try:
        waves = prepare(nodes, inputs, require_callable=False).levels
    except MissingDependencyError as err:
        step = nodes[err.node][0]
        index = step_names.index(err.node)
        key = next(k for k, t in step.input_map.items() if t in err.missing)
        raise TritonConfigError(
            name, f"ensemble_scheduling.step[{index}].input_map[{key!r}]",
            f"step {err.node!r} reads {', '.join(map(repr, err.missing))}, which no step (and no ensemble input) "
            "produces") from err
    except GraphError as err:
        raise TritonConfigError(name, "ensemble_scheduling.step", f"the steps' data flow is not a DAG: {err}") from err
    outputs = [t.name for t in parsed.output]
    for tensor in outputs:
        if tensor not in producers:
            raise TritonConfigError(name, "output", f"ensemble output {tensor!r} is not produced by any step")
    return EnsembleGraph(name, nodes, inputs, outputs, producers, waves, parsed)
