"""Triton model configs as Triton's own protobuf messages: built from a Stage, written, read and checked.

A config is a ``ModelConfig`` message (``tritonclient``'s ``model_config_pb2``, the schema Triton itself
loads); it is written with ``google.protobuf.text_format`` and read back with its parser, so whatever the
text holds -- non-ASCII strings, a typo, an unbalanced bracket -- is the protobuf library's business, and a
parse error becomes a :class:`~.errors.TritonConfigError` naming the model.

The one mapping from a :class:`~infergraph_lite.core.stage.Stage` to a config is :func:`config_from_stage`;
:data:`TRITON_FIELDS` says, for every field of ``Stage``, what becomes of it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from infergraph_lite.core.graph import topological_order
from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks.triton.errors import TritonConfigError
from infergraph_lite.frameworks.triton.tensors import ENCODING_PARAMETER, TensorType

__all__ = ["ENGINE", "TRITON_FIELDS", "ModelConfig", "check_model_config", "config_from_stage", "config_text",
           "declare_tensors", "ensemble_config", "member_config", "model_config_type_name", "parse_model_config",
           "read_config"]

ModelConfig = model_config_pb2.ModelConfig
ENGINE = "Triton"  # how UnsupportedStageFieldError names this engine

#: What :func:`config_from_stage` does with each field of ``Stage``: mapped, ignored (and why) or refused.
TRITON_FIELDS: dict[str, str] = {
    "fn": "required: the model's model.py runs it on each dynamic batch (a Stage without one is refused)",
    "service_time": "ignored: a cost for the simulator, not a server setting; Triton measures the real fn",
    "max_batch_size": "an int b: max_batch_size b, and for b > 1 a dynamic_batching block (b = 1: the batch "
                      "dimension stays, no server-side batching); None (no cap) and AIMD have no Triton field: refused",
    "max_wait": "dynamic_batching { max_queue_delay_microseconds } (rounded to whole microseconds); with b = 1 every "
                "batch is full at once, in Triton as in BatchPolicy, so it is not written",
    "replicas": "instance_group [ { count, kind: KIND_CPU } ]",
    "max_queue_size": "dynamic_batching { default_queue_policy { max_queue_size } } (also with b = 1: the dynamic "
                      "batcher is where Triton bounds a queue; its batches of 1 are a plain FIFO)",
}


def _tensor(kind: type, name: str, tensor: TensorType) -> Any:
    return kind(name=name, data_type=model_config_pb2.DataType.Value(tensor.data_type), dims=list(tensor.dims))


def declare_tensors(config: Any, inputs: Sequence[tuple[str, TensorType]],
                    outputs: Sequence[tuple[str, TensorType]]) -> None:
    """Add typed ``input``/``output`` tensors to a ``ModelConfig``, and a parameter per tensor saying how it travels.

    >>> config = ModelConfig(name="n")
    >>> declare_tensors(config, [("text", TensorType.text())], [("n", TensorType.scalar("int64"))])
    >>> [t.name for t in config.input], config.parameters["infergraph.encoding.n"].string_value
    (['text'], 'scalar')
    """
    config.input.extend(_tensor(model_config_pb2.ModelInput, n, t) for n, t in inputs)
    config.output.extend(_tensor(model_config_pb2.ModelOutput, n, t) for n, t in outputs)
    for n, t in [*inputs, *outputs]:  # how the Python values travel, read back by the stub and the client
        config.parameters[ENCODING_PARAMETER + n].string_value = t.encoding


def config_from_stage(name: str, stage: Stage, *, inputs: Sequence[tuple[str, TensorType]] = (),
                      output: tuple[str, TensorType] | None = None) -> Any:
    """The ``ModelConfig`` of one node served by Triton's Python backend: every Stage field mapped or refused.

    ``inputs``/``output`` are ``(tensor name, TensorType)``; without them the config holds the knobs only.
    Each field's fate is in :data:`TRITON_FIELDS`; a value Triton cannot express raises
    :class:`~infergraph_lite.core.stage.UnsupportedStageFieldError` naming the stage and the field.

    >>> config = config_from_stage("topic", Stage(fn=list, max_batch_size=16, max_wait=0.002, replicas=2,
    ...                                           max_queue_size=64))
    >>> print(config_text(config), end="")
    name: "topic"
    backend: "python"
    max_batch_size: 16
    dynamic_batching { max_queue_delay_microseconds: 2000 default_queue_policy { max_queue_size: 64 } }
    instance_group { count: 2 kind: KIND_CPU }
    >>> config_from_stage("topic", Stage(fn=list, max_batch_size=None))
    Traceback (most recent call last):
    ...
    infergraph_lite.core.stage.UnsupportedStageFieldError: Triton cannot serve stage 'topic' with \
max_batch_size=None: ...
    """
    if not isinstance(stage, Stage):
        raise TypeError(f"stage {name!r}: expected a Stage, got {type(stage).__name__}")
    for f in dataclasses.fields(stage):  # a field added to Stage (or a subclass) is refused until it is mapped
        value = getattr(stage, f.name)
        if f.name not in TRITON_FIELDS and value != f.default:
            raise UnsupportedStageFieldError(ENGINE, name, f.name, value, "the Triton adapter does not map this field")
    if stage.fn is None:
        raise UnsupportedStageFieldError(ENGINE, name, "fn", None, "Triton serves a stage by running its batch "
                                                                  "function; give Stage(fn=...)")
    size = stage.max_batch_size
    if size is None or isinstance(size, AIMD):
        why = ("no cap has no Triton equivalent: max_batch_size must be a whole number" if size is None else
               "Triton's max_batch_size is fixed when the model loads; an adaptive cap has no Triton field")
        raise UnsupportedStageFieldError(ENGINE, name, "max_batch_size", size, why)
    config = ModelConfig(name=name, backend="python", max_batch_size=size)
    declare_tensors(config, inputs, [output] if output else [])
    if size > 1:
        config.dynamic_batching.max_queue_delay_microseconds = round(stage.max_wait * 1e6)
    if stage.max_queue_size is not None:
        config.dynamic_batching.default_queue_policy.max_queue_size = stage.max_queue_size
    if size > 1 and not config.HasField("dynamic_batching"):
        config.dynamic_batching.SetInParent()  # an empty block still turns the dynamic batcher on
    config.instance_group.add(count=stage.replicas, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    return config


def member_config(name: str, stage: Stage, inputs: Sequence[tuple[str, TensorType]],
                  output: tuple[str, TensorType]) -> str:
    """The ``config.pbtxt`` text of one node: :func:`config_from_stage`, written by :func:`config_text`.

    >>> print(member_config("n", Stage(fn=list, max_batch_size=8, max_wait=0.002, replicas=2),
    ...                     [("text", TensorType.text())], ("n", TensorType.scalar("int64"))), end="")
    name: "n"
    backend: "python"
    max_batch_size: 8
    input { name: "text" data_type: TYPE_STRING dims: [1] }
    output { name: "n" data_type: TYPE_INT64 dims: [1] }
    dynamic_batching { max_queue_delay_microseconds: 2000 }
    instance_group { count: 2 kind: KIND_CPU }
    parameters { key: "infergraph.encoding.n" value { string_value: "scalar" } }
    parameters { key: "infergraph.encoding.text" value { string_value: "text" } }
    """
    return config_text(config_from_stage(name, stage, inputs=inputs, output=output))


def ensemble_config(name: str, stages: Mapping[str, tuple[Any, Sequence[str]]], types: Mapping[str, TensorType],
                    inputs: Sequence[str], outputs: Sequence[str], max_batch_size: int) -> Any:
    """The ensemble's ``ModelConfig``: one step per node, each tensor named after the node that writes it.

    >>> stages = {"shout": (Stage(fn=list), ["text"])}
    >>> config = ensemble_config("e", stages, {"text": TensorType.text(), "shout": TensorType.text()},
    ...                          ["text"], ["shout"], 1)
    >>> [(s.model_name, dict(s.input_map), dict(s.output_map)) for s in config.ensemble_scheduling.step]
    [('shout', {'text': 'text'}, {'shout': 'shout'})]
    """
    config = ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    declare_tensors(config, [(n, types[n]) for n in inputs], [(n, types[n]) for n in outputs])
    for node in topological_order(stages, inputs):
        deps = list(dict.fromkeys(stages[node][1]))
        config.ensemble_scheduling.step.add(model_name=node, model_version=-1, input_map={d: d for d in deps},
                                            output_map={node: node})
    return config


# --- writing ---------------------------------------------------------------------------------------------------


def _one_line(message: Any) -> str:
    return text_format.MessageToString(message, as_one_line=True, as_utf8=True, use_short_repeated_primitives=True)


def _field_lines(config: Any) -> Iterator[str]:
    # text_format renders each top-level entry; one entry a line (and one ensemble step a line) keeps it readable.
    present = {f.name for f, _ in config.ListFields()}
    for field in config.DESCRIPTOR.fields:  # the schema's order: name, platform, backend, ..., parameters
        if field.name not in present:
            continue
        value = getattr(config, field.name)
        if field.name == "ensemble_scheduling":
            yield "ensemble_scheduling {"
            for step in value.step:
                yield "  " + _one_line(model_config_pb2.ModelEnsembling(step=[step]))
            yield "}"
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in sorted(value):
                part = ModelConfig()
                entries = getattr(part, field.name)
                if field.message_type.fields_by_name["value"].message_type is not None:
                    entries[key].CopyFrom(value[key])  # a map of messages (parameters) takes no assignment
                else:
                    entries[key] = value[key]
                yield _one_line(part)
        elif field.is_repeated and field.message_type is not None:
            for item in value:
                part = ModelConfig()
                getattr(part, field.name).add().CopyFrom(item)
                yield _one_line(part)
        else:
            part = ModelConfig()
            part.MergeFrom(config)
            for other in present - {field.name}:
                part.ClearField(other)
            yield _one_line(part)


def config_text(config: Any) -> str:
    """A ``ModelConfig`` as ``config.pbtxt`` text, by ``google.protobuf.text_format``: one entry per line, UTF-8.

    >>> text = config_text(ModelConfig(name="café", backend="python", max_batch_size=4))
    >>> print(text, end="")
    name: "café"
    backend: "python"
    max_batch_size: 4
    >>> read_config(text).name
    'café'
    """
    return "\n".join(_field_lines(config)) + "\n"


# --- reading ---------------------------------------------------------------------------------------------------


_PAIRS = {"}": "{", "]": "[", ">": "<"}
_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*|[{}\[\]<>]|\n')


def _bracket_problem(text: str) -> str | None:
    # Only for the error message: which bracket is unbalanced, in words a learner can act on.
    opened: list[tuple[str, int]] = []
    line = 1
    for token in _TOKENS.findall(text):
        if token == "\n":
            line += 1
        elif token in "{[<":
            opened.append((token, line))
        elif token in _PAIRS:
            if not opened:
                return f"line {line} closes a {token!r} that was never opened"
            first, where = opened.pop()
            if first != _PAIRS[token]:
                return f"line {line} has {token!r} where the {first!r} opened on line {where} should be closed"
    if opened:
        first, where = opened[-1]
        return f"the {first!r} opened on line {where} is never closed"
    return None


def parse_model_config(text: str, model: str | None = None) -> Any:
    """Parse a ``config.pbtxt`` with Triton's real schema; a mistake raises :class:`TritonConfigError`.

    Returns ``tritonclient``'s ``ModelConfig`` protobuf message.  The error names the model and
    the field the schema rejects (a misspelt field, a wrong enum value, a string where a number goes).

    >>> parse_model_config('name: "m" max_batch_size: 8').max_batch_size
    8
    >>> parse_model_config('name: "m" max_batch_sise: 8')
    Traceback (most recent call last):
    ...
    infergraph_lite...TritonConfigError: model 'm', field max_batch_sise: ... has no field named "max_batch_sise".
    >>> parse_model_config('name: "m" instance_group [ { count: 1 }')
    Traceback (most recent call last):
    ...
    infergraph_lite...TritonConfigError: model 'm': the '[' opened on line 1 is never closed (1:40 : '': Expected ",".)
    """
    if not isinstance(text, str):
        raise TypeError(f"a config to parse is text (a str), got {type(text).__name__}")
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as err:
        message = str(err)
        # The error cannot say the model's name (the text did not parse): the caller's, else the text's own.
        found = re.search(r'^\s*name\s*:\s*"([^"]*)"', text, re.M)
        name = model or (found.group(1) if found else None)
        unbalanced = _bracket_problem(text)
        if unbalanced:
            raise TritonConfigError(name, None, f"{unbalanced} ({message})") from None
        named = re.search(r'field named "([^"]+)"', message)
        where = re.match(r"(\d+):(\d+)", message)
        field_name = named.group(1) if named else None
        lines = text.splitlines()
        if field_name is None and where and 0 < int(where.group(1)) <= len(lines):
            # a bad value: the field is the last "name:" before the error's column
            before = re.findall(r"(\w+)\s*:", lines[int(where.group(1)) - 1][: int(where.group(2))])
            field_name = before[-1] if before else None
        raise TritonConfigError(name, field_name, message) from None


def read_config(text: str, name: str | None = None) -> Any:
    """Read a ``config.pbtxt``: Triton's schema (:func:`parse_model_config`), then its rules
    (:func:`check_model_config`).  Returns the ``ModelConfig``; every mistake is a :class:`TritonConfigError`.

    >>> read_config('name: "m" backend: "python" max_batch_size: 4').max_batch_size
    4
    >>> read_config('name: "m" backend: "python" input [ { name: "x" ]', "m")
    Traceback (most recent call last):
    ...
    infergraph_lite...TritonConfigError: model 'm': line 1 has ']' where the '{' opened on line 1 should be closed ...
    """
    config = parse_model_config(text, name)
    check_model_config(config, name)
    return config


def check_model_config(config: Any, model: str | None = None) -> None:
    """What the schema cannot say: the rules a model config must also follow before Triton loads it.

    A name, a backend or platform, batch size >= 0, every input/output named and typed, preferred
    batch sizes within ``max_batch_size``, instance counts >= 1.  Raises :class:`TritonConfigError`.

    >>> check_model_config(parse_model_config('name: "m" backend: "python" max_batch_size: -1'))
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.triton.errors.TritonConfigError: model 'm', field max_batch_size: must be >= 0, got -1
    """
    name = config.name or model
    if not config.name:
        raise TritonConfigError(model, "name", "every model config needs a name")
    if model is not None and config.name != model:
        raise TritonConfigError(model, "name", f"the config says {config.name!r} but its folder is {model!r}")
    if not (config.backend or config.platform):
        raise TritonConfigError(name, "backend", 'say which backend runs it (backend: "python") or '
                                                 'platform: "ensemble"')
    if config.max_batch_size < 0:
        raise TritonConfigError(name, "max_batch_size", f"must be >= 0, got {config.max_batch_size}")
    for kind in ("input", "output"):
        for tensor in getattr(config, kind):
            if not tensor.name:
                raise TritonConfigError(name, kind, f"an {kind} tensor has no name")
            if tensor.data_type == 0:
                raise TritonConfigError(name, f"{kind}.data_type", f"tensor {tensor.name!r} needs a data_type")
            if not tensor.dims:
                raise TritonConfigError(name, f"{kind}.dims", f"tensor {tensor.name!r} needs dims (e.g. [ 1 ])")
    if config.HasField("dynamic_batching"):
        if config.max_batch_size < 1:
            raise TritonConfigError(name, "dynamic_batching", "needs max_batch_size >= 1 to batch anything")
        for size in config.dynamic_batching.preferred_batch_size:  # hand-written configs may hold them
            if not 1 <= size <= config.max_batch_size:
                raise TritonConfigError(name, "dynamic_batching.preferred_batch_size",
                                        f"{size} is outside 1..max_batch_size ({config.max_batch_size})")
    for group in config.instance_group:
        if group.count < 1:
            raise TritonConfigError(name, "instance_group.count", f"must be >= 1, got {group.count}")


def model_config_type_name(value: int) -> str:
    """Triton's data type enum number as its config name.

    >>> model_config_type_name(12)
    'TYPE_FP64'
    """
    return model_config_pb2.DataType.Name(value)
