"""One request through a stage graph's batch functions, outside any server: the values that type its tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infergraph_lite.core.stage import Stage, batch_item, prepare_stages
from infergraph_lite.frameworks.triton.tensors import TensorType, tensor_type_of

__all__ = ["infer_tensor_types", "run_stages_once"]


def run_stages_once(stages: Mapping[str, tuple[Stage, Sequence[str]]], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run a stage graph's batch functions on one request, in order: the inputs plus every node's value.

    The graph is validated first (:func:`~infergraph_lite.core.stage.prepare_stages`: real Stages with an
    ``fn``).  A node with several dependencies gets a tuple of their values, as a served stage does.

    >>> run_stages_once({"n": (Stage(fn=lambda xs: [len(x) for x in xs]), ["text"])}, {"text": "abc"})
    {'text': 'abc', 'n': 3}
    """
    plan = prepare_stages(stages, inputs, need="fn")
    values = dict(inputs)
    for name in plan.order:
        stage, deps = plan.nodes[name]
        assert stage.fn is not None  # prepare_stages(need="fn") saw to it
        (values[name],) = stage.fn([batch_item([values[d] for d in deps])])
    return values


def infer_tensor_types(stages: Mapping[str, tuple[Stage, Sequence[str]]], example: Mapping[str, Any]
                       ) -> dict[str, TensorType]:
    """Run the graph once on ``example`` (batches of one) and type every input and node output.

    >>> stages = {"n": (Stage(fn=lambda xs: [len(x) for x in xs]), ["text"])}
    >>> types = infer_tensor_types(stages, {"text": "abc"})
    >>> types["text"].encoding, types["n"]
    ('text', TensorType(encoding='scalar', data_type='TYPE_INT64', dims=(1,)))
    """
    return {name: tensor_type_of(value) for name, value in run_stages_once(stages, example).items()}
