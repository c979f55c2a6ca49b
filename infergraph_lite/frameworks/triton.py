"""The stage graph on a real NVIDIA Triton server: model repository, config reader, server, client.

A stage graph ``{name: (Stage, [deps])}`` becomes a Triton *model repository*:
one Python-backend model per node, whose ``model.py`` calls the node's real
batch function (``stage.fn``), and one ``platform: "ensemble"`` model whose
``ensemble_scheduling`` steps wire the nodes by tensor names, as the graph's
edges do.  The batching knobs map one to one::

    Stage.max_batch_size  ->  max_batch_size
    Stage.max_wait (s)    ->  dynamic_batching { max_queue_delay_microseconds }
    Stage.replicas        ->  instance_group [ { count, kind: KIND_CPU } ]

Every config is parsed with Triton's own protobuf schema (``tritonclient``'s
``model_config_pb2``) and the ensemble is turned back into the package's graph
shape and checked by :mod:`infergraph_lite.graph` (cycles, missing tensors,
levels) before any server starts.  :class:`TritonServer` runs the
``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel on 127.0.0.1,
and :class:`TritonClient` drives it (``submit(item) -> Future``, the load
generators' interface) and reads its statistics: the real batch sizes.

Introduced in notebook 07; exercise 5.4 and the 07 exercises use it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from infergraph_lite.core.graph import GraphError, MissingDependencyError, prepare, topological_order
from infergraph_lite.serving.metrics import StageTimes

__all__ = [
    "EnsembleGraph",
    "ModelStats",
    "NodeModel",
    "Repository",
    "TensorType",
    "TritonClient",
    "TritonConfigError",
    "TritonServer",
    "TritonStartError",
    "TritonUnavailableError",
    "add_model_version",
    "check_model_config",
    "ensemble_to_graph",
    "infer_tensor_types",
    "member_config",
    "parse_model_config",
    "parse_pbtxt",
    "read_repository",
    "run_stages_once",
    "tensor_type_of",
    "to_model_repository",
    "triton_available",
]

Encoding = Literal["text", "json", "scalar", "array"]
ENCODING_PARAMETER = "infergraph.encoding."  # + tensor name; a config parameter telling how values travel

# numpy dtype <-> Triton's config data type; the wire name is the config name without "TYPE_" (BYTES for strings).
_DATA_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}
_NUMPY_TYPES = {v: k for k, v in _DATA_TYPES.items()}


# --- errors ------------------------------------------------------------------------------------------


class TritonConfigError(ValueError):
    """A model config (or an ensemble's wiring) is wrong; ``.model`` and ``.field`` say where.

    >>> str(TritonConfigError("embed", "max_batch_size", "must be >= 1, got 0"))
    "model 'embed', field max_batch_size: must be >= 1, got 0"
    """

    def __init__(self, model: str | None, field: str | None, problem: str):
        self.model, self.field, self.problem = model, field, problem
        where = [f"model {model!r}" if model else "", f"field {field}" if field else ""]
        super().__init__(", ".join(w for w in where if w) + f": {problem}" if any(where) else problem)


class TritonUnavailableError(RuntimeError):
    """The ``tritonserver`` binary cannot run here (no wheel for this platform, or not installed)."""


class TritonStartError(RuntimeError):
    """The server did not become ready; the message names the cause, ``.log`` holds the server's log."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(message)


# --- tensors: how a Python value travels as a Triton tensor ------------------------------------------


@dataclass(frozen=True)
class TensorType:
    """How one node's output (or a graph input) travels between Triton models.

    ``encoding`` is ``"text"`` (a ``str``), ``"json"`` (any JSON value: dicts, lists of tokens),
    ``"scalar"`` (one number or bool) or ``"array"`` (a numpy array of fixed shape ``dims``);
    ``data_type`` is Triton's name (``TYPE_STRING`` carries text and JSON).  Each request's
    tensor has a leading batch dimension in front of ``dims``.

    >>> t = TensorType.array("float64", (3,))
    >>> t.data_type, t.wire_type, t.encode([np.zeros(3), np.ones(3)]).shape
    ('TYPE_FP64', 'FP64', (2, 3))
    >>> TensorType.json().decode(TensorType.json().encode([{"a": 1}]))
    [{'a': 1}]
    """

    encoding: Encoding
    data_type: str = "TYPE_STRING"
    dims: tuple[int, ...] = (1,)

    @classmethod
    def text(cls) -> TensorType:
        return cls("text")

    @classmethod
    def json(cls) -> TensorType:
        return cls("json")

    @classmethod
    def scalar(cls, dtype: str | np.dtype | type) -> TensorType:
        return cls("scalar", _DATA_TYPES[np.dtype(dtype).name])

    @classmethod
    def array(cls, dtype: str | np.dtype | type, dims: Sequence[int]) -> TensorType:
        return cls("array", _DATA_TYPES[np.dtype(dtype).name], tuple(int(d) for d in dims))

    @property
    def wire_type(self) -> str:
        """The data type's name on the wire (client API): ``BYTES``, ``FP32``, ..."""
        return "BYTES" if self.data_type == "TYPE_STRING" else self.data_type.removeprefix("TYPE_")

    def encode(self, values: Sequence[Any]) -> np.ndarray:
        """A batch of values as one tensor, batch dimension first."""
        if self.encoding == "text":
            return np.array([[str(v).encode()] for v in values], dtype=object).reshape(len(values), 1)
        if self.encoding == "json":
            return np.array([[json.dumps(v, default=_to_json).encode()] for v in values],
                            dtype=object).reshape(len(values), 1)
        dtype = _NUMPY_TYPES[self.data_type]
        if self.encoding == "scalar":
            return np.asarray(values, dtype=dtype).reshape(len(values), 1)
        return np.stack([np.asarray(v, dtype=dtype) for v in values]) if len(values) else np.zeros(
            (0, *self.dims), dtype)

    def decode(self, tensor: np.ndarray) -> list[Any]:
        """The values of a batch tensor, one per row."""
        if self.encoding in ("text", "json"):
            cells = [c.decode() if isinstance(c, bytes) else str(c) for c in tensor.reshape(len(tensor), -1)[:, 0]]
            return cells if self.encoding == "text" else [json.loads(c) for c in cells]
        if self.encoding == "scalar":
            return [x.item() for x in tensor.reshape(len(tensor))]
        return list(tensor)


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def tensor_type_of(value: Any) -> TensorType:
    """The tensor type that carries ``value``: numbers and arrays typed, strings as text, the rest as JSON.

    >>> tensor_type_of("hello").encoding, tensor_type_of(3).data_type, tensor_type_of(np.zeros((2, 4))).dims
    ('text', 'TYPE_INT64', (2, 4))
    >>> tensor_type_of({"label": "food"}).encoding
    'json'
    """
    if isinstance(value, str):
        return TensorType.text()
    if isinstance(value, bool | np.bool_):
        return TensorType.scalar("bool")
    if isinstance(value, int | np.integer):
        return TensorType.scalar("int64")
    if isinstance(value, float | np.floating):
        return TensorType.scalar("float64")
    if isinstance(value, np.ndarray) and value.dtype.name in _DATA_TYPES:
        return TensorType.array(value.dtype, value.shape)
    try:
        json.dumps(value, default=_to_json)
    except (TypeError, ValueError) as err:
        raise TypeError(f"a {type(value).__name__} cannot travel as a Triton tensor: {err}") from None
    return TensorType.json()


def _default_type(data_type: str, dims: Sequence[int]) -> TensorType:
    # A tensor declared without an infergraph encoding (a hand-written config): strings are text.
    if data_type == "TYPE_STRING":
        return TensorType.text()
    if list(dims) == [1]:
        return TensorType("scalar", data_type)
    return TensorType("array", data_type, tuple(dims))


def run_stages_once(stages: Mapping[str, tuple[Any, Sequence[str]]], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Run a stage graph's batch functions on one request, in order: the inputs plus every node's value.

    A node with several dependencies gets a tuple of their values, as a served stage does.

    >>> run_stages_once({"n": (_FakeStage(fn=lambda xs: [len(x) for x in xs]), ["text"])}, {"text": "abc"})
    {'text': 'abc', 'n': 3}
    """
    values = dict(inputs)
    for name in topological_order(stages, inputs):
        stage, deps = stages[name]
        args = tuple(values[d] for d in deps)
        (values[name],) = _batch_fn(name, stage)([args[0] if len(args) == 1 else args])
    return values


def infer_tensor_types(stages: Mapping[str, tuple[Any, Sequence[str]]], example: Mapping[str, Any]
                       ) -> dict[str, TensorType]:
    """Run the graph once on ``example`` (batches of one) and type every input and node output.

    >>> stages = {"n": (_FakeStage(fn=lambda xs: [len(x) for x in xs]), ["text"])}
    >>> types = infer_tensor_types(stages, {"text": "abc"})
    >>> types["text"].encoding, types["n"]
    ('text', TensorType(encoding='scalar', data_type='TYPE_INT64', dims=(1,)))
    """
    return {name: tensor_type_of(value) for name, value in run_stages_once(stages, example).items()}


@dataclass(frozen=True)
class _FakeStage:
    # Enough of a Stage for doctests: the fields this module reads.
    fn: Callable[[list], list] | None = None
    max_batch_size: int = 1
    max_wait: float = 0.0
    replicas: int = 1


def _shout_stages() -> dict[str, tuple[Any, list[str]]]:
    # The one-node graph of the doctests, as a factory.
    return {"shout": (_FakeStage(fn=lambda xs: [x.upper() for x in xs]), ["text"])}


def _batch_fn(name: str, stage: Any) -> Callable[[list], list]:
    fn = getattr(stage, "fn", None)
    if not callable(fn):
        raise TritonConfigError(name, "fn", "a node served by Triton needs a real batch function (Stage(fn=...))")
    return fn


# --- reading configs: the small schema-free parser and Triton's own schema ----------------------------

_PBTXT_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^\s{}\[\]:,"#]+))')


def parse_pbtxt(text: str) -> dict[str, list[Any]]:
    """Parse protobuf text format (what Triton's ``config.pbtxt`` is) into ``{field: [values]}``, no schema.

    Every field maps to a list, since any field may repeat; messages become dicts.  For checking a
    config against Triton's real schema use :func:`parse_model_config`.

    >>> parse_pbtxt('name: "e" input [ { name: "T" dims: [ 1 ] } ]')
    {'name': ['e'], 'input': [{'name': ['T'], 'dims': [1]}]}
    """
    tokens = [m.group(2) or m.group(3) or m.group(4) for m in _PBTXT_TOKEN.finditer(text) if not m.group(1)]
    tokens = [t for t in tokens if t is not None]
    position = 0

    def scalar(token: str) -> Any:
        if token.startswith('"'):
            return token[1:-1].encode().decode("unicode_escape")
        for kind in (int, float):
            try:
                return kind(token)
            except ValueError:
                pass
        return token  # an enum name such as TYPE_STRING

    def value() -> list[Any]:
        nonlocal position
        token = tokens[position]
        position += 1
        if token == "{":
            return [message("}")]
        if token == "[":
            items = []
            while tokens[position] != "]":
                if tokens[position] == ",":
                    position += 1
                    continue
                items += value()
            position += 1
            return items
        return [scalar(token)]

    def message(end: str | None) -> dict[str, list[Any]]:
        nonlocal position
        fields: dict[str, list[Any]] = {}
        while position < len(tokens) and tokens[position] != end:
            name = tokens[position]
            position += 1
            if position < len(tokens) and tokens[position] == ":":
                position += 1
            fields.setdefault(name, []).extend(value())
        position += 1
        return fields

    return message(None)


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
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    name = model or (re.search(r'^\s*name\s*:\s*"([^"]*)"', text, re.M) or [None, None])[1]
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as err:
        message = str(err)
        named = re.search(r'field named "([^"]+)"', message)
        where = re.match(r"(\d+):(\d+)", message)
        field_name = named.group(1) if named else None
        if field_name is None and where:  # a bad value: the field is the last "name:" before the error's column
            line = text.splitlines()[int(where.group(1)) - 1][: int(where.group(2))]
            before = re.findall(r"(\w+)\s*:", line)
            field_name = before[-1] if before else None
        raise TritonConfigError(name, field_name, message) from None


def check_model_config(config: Any, model: str | None = None) -> None:
    """What the schema cannot say: the rules a model config must also follow before Triton loads it.

    A name, a backend or platform, batch size >= 0, every input/output named and typed, preferred
    batch sizes within ``max_batch_size``, instance counts >= 1.  Raises :class:`TritonConfigError`.

    >>> check_model_config(parse_model_config('name: "m" backend: "python" max_batch_size: -1'))
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.triton.TritonConfigError: model 'm', field max_batch_size: must be >= 0, got -1
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
        for size in config.dynamic_batching.preferred_batch_size:
            if not 1 <= size <= config.max_batch_size:
                raise TritonConfigError(name, "dynamic_batching.preferred_batch_size",
                                        f"{size} is outside 1..max_batch_size ({config.max_batch_size})")
    for group in config.instance_group:
        if group.count < 1:
            raise TritonConfigError(name, "instance_group.count", f"must be >= 1, got {group.count}")


# --- the ensemble as the package's own graph ----------------------------------------------------------


@dataclass(frozen=True)
class EnsembleGraph:
    """An ensemble's steps as the package's graph shape, validated by :mod:`infergraph_lite.graph`.

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
    """Read an ensemble's ``config.pbtxt`` (text or parsed) into an :class:`EnsembleGraph`.

    The schema check is :func:`parse_model_config`; the data flow is checked by the graph module:
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


# --- writing a model repository from a stage graph -----------------------------------------------------

_MODEL_PY = '''\
# Generated by infergraph_lite.frameworks.triton.to_model_repository: Triton runs this file in its Python backend stub.
# It rebuilds the stage graph with FACTORY and serves node NODE's batch function, stages[NODE].fn.
from infergraph_lite.frameworks.triton import NodeModel

FACTORY = {factory!r}
NODE = {node!r}


class TritonPythonModel(NodeModel):
    factory, node = FACTORY, NODE
'''


@dataclass(frozen=True)
class Repository:
    """A model repository on disk: where it is, its models, and the ensemble's interface."""

    path: Path
    ensemble: str
    models: list[str]
    inputs: dict[str, TensorType]
    outputs: dict[str, TensorType]

    def config(self, model: str) -> str:
        """The text of a model's ``config.pbtxt``."""
        return (self.path / model / "config.pbtxt").read_text()


def _factory_spec(factory: str | Callable[[], Any], repository: Path) -> str:
    # A "module:attribute" the stub can import; a function defined in a notebook (__main__) is copied
    # into the repository as source, so it must import what it needs inside its body.
    if isinstance(factory, str):
        name, _, attribute = factory.partition(":")
        if not (name and attribute):
            raise ValueError(f"factory should be 'module:function', got {factory!r}")
        return factory
    module = getattr(factory, "__module__", None)
    qualname = getattr(factory, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        return f"{module}:{qualname}"
    try:
        source = textwrap.dedent(inspect.getsource(factory))
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of factory {factory!r} to copy it into the repository: {err}"
                         ) from None
    # A plain file at the repository's top: Triton takes every folder there for a model, but ignores files.
    target = repository / f"_factory_{factory.__name__}.py"
    target.write_text("# Copied by to_model_repository from the notebook that built this repository.\n" + source)
    return f"file:{target.relative_to(repository)}:{factory.__name__}"


def _check_factory(spec: str, repository: Path, graph: Mapping[str, Any]) -> None:
    # The stubs will call the factory; call it here first, so a typo fails now, not in a server's log.
    try:
        built = load_factory(spec, repository)()
    except Exception as exc:
        raise TritonConfigError(None, "factory", f"factory {spec!r} failed here: {type(exc).__name__}: {exc}") from exc
    for node in graph:
        entry = built.get(node) if isinstance(built, Mapping) else None
        if entry is None or not callable(getattr(entry[0], "fn", None)):
            raise TritonConfigError(node, "factory", f"factory {spec!r} does not rebuild node {node!r} with a batch "
                                                     "function (Stage(fn=...))")


def load_factory(spec: str, repository: str | Path | None = None) -> Callable[[], Any]:
    """Import the factory a repository records (``module:function`` or ``file:path.py:function``).

    >>> load_factory("infergraph_lite.lessons.models:load_texts").__name__
    'load_texts'
    """
    if spec.startswith("file:"):
        relative, _, attribute = spec.removeprefix("file:").rpartition(":")
        path = Path(repository or ".") / relative
        module_spec = importlib.util.spec_from_file_location(f"_infergraph_factory_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load factory file {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module_name, _, attribute = spec.partition(":")
        module = importlib.import_module(module_name)
    target: Any = module
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def _int_batch_size(name: str, stage: Any) -> int:
    size = getattr(stage, "max_batch_size", 1)
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise TritonConfigError(name, "max_batch_size", f"Triton needs a whole number >= 1; the stage has {size!r} "
                                                        "(no cap and adaptive caps have no Triton equivalent)")
    if size < 1:
        raise TritonConfigError(name, "max_batch_size", f"must be >= 1, got {size}")
    return int(size)


def _tensor_lines(kind: str, tensors: Sequence[tuple[str, TensorType]]) -> list[str]:
    rows = [f'  {{ name: "{n}" data_type: {t.data_type} dims: [ {", ".join(map(str, t.dims))} ] }}'
            for n, t in tensors]
    return [f"{kind} [", ",\n".join(rows), "]"]


def _parameter_lines(tensors: Iterable[tuple[str, TensorType]]) -> list[str]:
    rows = [f'  {{ key: "{ENCODING_PARAMETER}{n}" value: {{ string_value: "{t.encoding}" }} }}' for n, t in tensors]
    return ["parameters [", ",\n".join(rows), "]"] if rows else []


def member_config(name: str, stage: Any, inputs: Sequence[tuple[str, TensorType]], output: tuple[str, TensorType],
                  preferred_batch_size: Sequence[int] = ()) -> str:
    """The ``config.pbtxt`` of one node as a Python-backend model, batching knobs from its Stage.

    >>> print(member_config("n", _FakeStage(max_batch_size=8, max_wait=0.002, replicas=2),
    ...                     [("text", TensorType.text())], ("n", TensorType.scalar("int64"))))
    name: "n"
    backend: "python"
    max_batch_size: 8
    input [
      { name: "text" data_type: TYPE_STRING dims: [ 1 ] }
    ]
    output [
      { name: "n" data_type: TYPE_INT64 dims: [ 1 ] }
    ]
    dynamic_batching { max_queue_delay_microseconds: 2000 }
    instance_group [ { count: 2 kind: KIND_CPU } ]
    parameters [
      { key: "infergraph.encoding.text" value: { string_value: "text" } },
      { key: "infergraph.encoding.n" value: { string_value: "scalar" } }
    ]
    """
    size = _int_batch_size(name, stage)
    replicas = getattr(stage, "replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int | np.integer) or replicas < 1:
        raise TritonConfigError(name, "instance_group.count", f"replicas must be a whole number >= 1, got {replicas!r}")
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {size}"]
    lines += _tensor_lines("input", inputs) + _tensor_lines("output", [output])
    if size > 1:  # max_batch_size 1 is batching off: no dynamic batcher, each request runs alone
        delay = round(float(getattr(stage, "max_wait", 0.0)) * 1e6)
        knobs = [f"max_queue_delay_microseconds: {delay}"] if delay else []
        if preferred_batch_size:
            knobs.append(f"preferred_batch_size: [ {', '.join(str(int(b)) for b in preferred_batch_size)} ]")
        lines.append(f"dynamic_batching {{ {' '.join(knobs)} }}" if knobs else "dynamic_batching { }")
    lines.append(f"instance_group [ {{ count: {int(replicas)} kind: KIND_CPU }} ]")
    lines += _parameter_lines([*inputs, output])
    return "\n".join(lines) + "\n"


def ensemble_config(name: str, stages: Mapping[str, tuple[Any, Sequence[str]]], types: Mapping[str, TensorType],
                    inputs: Sequence[str], outputs: Sequence[str], max_batch_size: int) -> str:
    """The ensemble's ``config.pbtxt``: one step per node, tensors named after the node that writes them."""
    lines = [f'name: "{name}"', 'platform: "ensemble"', f"max_batch_size: {max_batch_size}"]
    lines += _tensor_lines("input", [(n, types[n]) for n in inputs])
    lines += _tensor_lines("output", [(n, types[n]) for n in outputs])
    steps = []
    for node in topological_order(stages, inputs):
        deps = list(dict.fromkeys(stages[node][1]))
        maps = ", ".join(f'{{ key: "{d}" value: "{d}" }}' for d in deps)
        steps.append(f'    {{\n      model_name: "{node}"\n      model_version: -1\n'
                     f"      input_map [ {maps} ]\n"
                     f'      output_map {{ key: "{node}" value: "{node}" }}\n    }}')
    lines += ["ensemble_scheduling {", "  step [", ",\n".join(steps), "  ]", "}"]
    lines += _parameter_lines([(n, types[n]) for n in [*inputs, *outputs]])
    return "\n".join(lines) + "\n"


def _write_model(path: Path, name: str, config: str, factory: str | None, node: str | None, version: int) -> None:
    parse_and_check = parse_model_config(config, name)
    check_model_config(parse_and_check, name)
    (path / name).mkdir(parents=True, exist_ok=True)
    (path / name / "config.pbtxt").write_text(config)
    (path / name / str(version)).mkdir(exist_ok=True)
    if factory is not None:
        (path / name / str(version) / "model.py").write_text(_MODEL_PY.format(factory=factory, node=node))


def to_model_repository(
    stages: Mapping[str, tuple[Any, Sequence[str]]],
    path: str | Path,
    *,
    factory: str | Callable[[], Any],
    example: Mapping[str, Any] | None = None,
    tensors: Mapping[str, TensorType] | None = None,
    name: str = "pipeline",
    outputs: Sequence[str] | None = None,
    preferred_batch_size: Mapping[str, Sequence[int]] | None = None,
    ensemble: str | None = None,
) -> Repository:
    """Write a Triton model repository for a stage graph: a Python-backend model per node, and an ensemble.

    ``factory`` rebuilds the same stage graph inside Triton's Python stub (where nothing from this
    process exists): ``"module:function"``, or a zero-argument function -- one defined in a notebook is
    copied into the repository, so it must import what it needs inside its body.  Tensor types come
    from ``tensors`` or, for the rest, from one run of the graph on ``example``.  The ensemble exposes
    ``outputs`` (default: the nodes nobody reads).  Pass ``ensemble`` (a hand-written ensemble config)
    to serve the graph with *its* wiring: the member models then take their tensor names from its steps.

    Every config is parsed with Triton's schema and the ensemble's data flow checked by the graph module
    before this returns, so a bad repository never reaches a server.

    >>> import tempfile
    >>> stages = {"shout": (_FakeStage(fn=lambda xs: [x.upper() for x in xs], max_batch_size=4), ["text"])}
    >>> repo = to_model_repository(stages, tempfile.mkdtemp(),
    ...                            factory="infergraph_lite.frameworks.triton:_shout_stages",
    ...                            example={"text": "hi"})
    >>> repo.models, list(repo.inputs), list(repo.outputs)
    (['shout', 'pipeline'], ['text'], ['shout'])
    """
    path = Path(path)
    graph = prepare(stages, example or [d for _, deps in stages.values() for d in deps if d not in stages],
                    require_callable=False).nodes
    graph_inputs = list(dict.fromkeys(d for _, deps in graph.values() for d in deps if d not in graph))
    types = dict(tensors or {})
    if any(n not in types for n in [*graph_inputs, *graph]):
        if example is None:
            missing = [n for n in [*graph_inputs, *graph] if n not in types]
            raise ValueError(f"no tensor type for {missing}: pass tensors={{name: TensorType}} or an example input")
        types = {**infer_tensor_types(stages, example), **types}
    path.mkdir(parents=True, exist_ok=True)
    spec = _factory_spec(factory, path)
    _check_factory(spec, path, graph)
    preferred = preferred_batch_size or {}
    if ensemble is not None:
        wiring = ensemble_to_graph(ensemble)
        written = _write_for_ensemble(path, stages, types, wiring, spec, preferred, graph_inputs)
        (path / wiring.name).mkdir(exist_ok=True)
        (path / wiring.name / "config.pbtxt").write_text(ensemble)
        (path / wiring.name / "1").mkdir(exist_ok=True)
        ens_types = {t.name: _default_type(model_config_type_name(t.data_type), t.dims) for t in wiring.config.input}
        out_types = {t.name: _default_type(model_config_type_name(t.data_type), t.dims) for t in wiring.config.output}
        return Repository(path, wiring.name, [*written, wiring.name], ens_types, out_types)
    sinks = [n for n in graph if not any(n in deps for _, deps in graph.values())]
    outputs = list(outputs or sinks)
    for out in outputs:
        if out not in graph:
            raise ValueError(f"output {out!r} is not a node of the graph")
    for node, (stage, deps) in graph.items():
        inputs = [(d, types[d]) for d in dict.fromkeys(deps)]
        config = member_config(node, stage, inputs, (node, types[node]), preferred.get(node, ()))
        _write_model(path, node, config, spec, node, 1)
    ens_batch = min(_int_batch_size(n, s) for n, (s, _) in graph.items())
    text = ensemble_config(name, graph, types, graph_inputs, outputs, ens_batch)
    _write_model(path, name, text, None, None, 1)
    ensemble_to_graph(text, name)  # the data flow, checked by the graph module
    return Repository(path, name, [*graph, name], {n: types[n] for n in graph_inputs}, {n: types[n] for n in outputs})


def model_config_type_name(value: int) -> str:
    """Triton's data type enum number as its config name (``11`` -> ``'TYPE_FP64'``)."""
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


def _write_for_ensemble(path: Path, stages: Mapping[str, tuple[Any, Sequence[str]]], types: Mapping[str, TensorType],
                        wiring: EnsembleGraph, spec: str, preferred: Mapping[str, Sequence[int]],
                        graph_inputs: Sequence[str]) -> list[str]:
    # Members named and wired as a hand-written ensemble says: each step's input_map keys are the model's
    # input tensors, matched to the node's dependencies by which step (or ensemble input) writes them.
    written = []
    for index, (label, (step, _)) in enumerate(wiring.nodes.items()):
        node = step.model_name
        where = f"ensemble_scheduling.step[{index}]"
        if node not in stages:
            raise TritonConfigError(wiring.name, f"{where}.model_name",
                                    f"step {label!r} runs model {node!r}, which is not a node of the graph "
                                    f"({', '.join(stages)})")
        stage, deps = stages[node]
        deps = list(deps)
        inputs: list[tuple[str, TensorType] | None] = [None] * len(deps)
        for key, tensor in step.input_map.items():
            source = wiring.producers.get(tensor)
            if source is None:  # an ensemble input: the graph input at the same position
                position = wiring.inputs.index(tensor)
                source = graph_inputs[position] if position < len(graph_inputs) else tensor
            if source not in deps:
                raise TritonConfigError(wiring.name, f"{where}.input_map[{key!r}]",
                                        f"step {node!r} reads {tensor!r} from {source!r}, but node {node!r} "
                                        f"depends on {deps}")
            inputs[deps.index(source)] = (key, types[source])
        if any(i is None for i in inputs):
            lost = [d for d, i in zip(deps, inputs) if i is None]
            raise TritonConfigError(wiring.name, f"{where}.input_map", f"step {node!r} does not read {lost}, which "
                                                                        f"node {node!r} needs")
        ((out_key, _),) = step.output_map.items()
        config = member_config(node, stage, [i for i in inputs if i is not None], (out_key, types[node]),
                               preferred.get(node, ()))
        _write_model(path, node, config, spec, node, 1)
        written.append(node)
    return written


def add_model_version(repository: Repository | str | Path, model: str, version: int,
                      factory: str | Callable[[], Any], node: str | None = None) -> Path:
    """Add version ``version`` of ``model``: the same config, a ``model.py`` serving ``factory()[node].fn``.

    Triton serves the latest version by default (``version_policy``); load the model again (explicit
    model control) and the traffic moves to the new version.  Returns the version's folder.

    >>> import tempfile
    >>> stages = {"shout": (_FakeStage(fn=lambda xs: [x.upper() for x in xs]), ["text"])}
    >>> repo = to_model_repository(stages, tempfile.mkdtemp(),
    ...                            factory="infergraph_lite.frameworks.triton:_shout_stages",
    ...                            example={"text": "hi"})
    >>> add_model_version(repo, "shout", 2, "infergraph_lite.frameworks.triton:_shout_stages").name
    '2'
    """
    root = Path(repository.path if isinstance(repository, Repository) else repository)
    if not (root / model / "config.pbtxt").exists():
        raise TritonConfigError(model, None, f"there is no model {model!r} in {root}")
    folder = root / model / str(int(version))
    folder.mkdir(exist_ok=True)
    (folder / "model.py").write_text(_MODEL_PY.format(factory=_factory_spec(factory, root), node=node or model))
    return folder


def read_repository(path: str | Path) -> dict[str, Any]:
    """Parse and check every ``config.pbtxt`` of a repository, and every ensemble's data flow.

    Returns ``{model: ModelConfig}``; raises :class:`TritonConfigError` naming the model and field.
    An ensemble step that names a model the repository lacks is reported here too.

    >>> import tempfile
    >>> stages = {"shout": (_FakeStage(fn=lambda xs: [x.upper() for x in xs]), ["text"])}
    >>> repo = to_model_repository(stages, tempfile.mkdtemp(),
    ...                            factory="infergraph_lite.frameworks.triton:_shout_stages",
    ...                            example={"text": "hi"})
    >>> sorted(read_repository(repo.path))
    ['pipeline', 'shout']
    >>> _ = (repo.path / "shout" / "config.pbtxt").write_text('name: "shout" backend: "python" max_batch_size: -2')
    >>> read_repository(repo.path)
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.triton.TritonConfigError: model 'shout', field max_batch_size: must be >= 0, got -2
    """
    path = Path(path)
    if not path.is_dir():
        raise TritonConfigError(None, None, f"model repository {path} does not exist")
    configs = {}
    for folder in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        file = folder / "config.pbtxt"
        if not file.exists():
            raise TritonConfigError(folder.name, None, f"{file} is missing")
        config = parse_model_config(file.read_text(), folder.name)
        check_model_config(config, folder.name)
        configs[folder.name] = config
    for name, config in configs.items():
        if config.platform == "ensemble":
            wiring = ensemble_to_graph(config, name)
            for i, step in enumerate(config.ensemble_scheduling.step):
                member = configs.get(step.model_name)
                where = f"ensemble_scheduling.step[{i}]"
                if member is None:
                    raise TritonConfigError(name, f"{where}.model_name",
                                            f"step runs {step.model_name!r}, which the repository does not hold")
                known_in, known_out = {t.name for t in member.input}, {t.name for t in member.output}
                for key in step.input_map:
                    if key not in known_in:
                        raise TritonConfigError(name, f"{where}.input_map[{key!r}]",
                                                f"model {step.model_name!r} has no input {key!r} "
                                                f"(it has {sorted(known_in)})")
                for key in step.output_map:
                    if key not in known_out:
                        raise TritonConfigError(name, f"{where}.output_map[{key!r}]",
                                                f"model {step.model_name!r} has no output {key!r} "
                                                f"(it has {sorted(known_out)})")
            del wiring
    return configs


# --- inside Triton: the Python backend model that serves one node ------------------------------------

_FACTORY_CACHE: dict[tuple[str, str], Any] = {}


class NodeModel:
    """Base of every generated ``model.py``: runs ``factory()[node]``'s batch function on each dynamic batch.

    Triton calls ``execute`` with the requests its dynamic batcher gathered; each request holds a
    tensor per input with a leading batch dimension.  The values of all requests are decoded into
    one list, the node's ``fn`` runs once on it, and the results are cut back into one response per
    request.  A node that raises answers every request of the batch with the error, naming the node.
    """

    factory: str = ""
    node: str = ""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # only in Triton's stub

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        repository = Path(args["model_repository"]).parent
        key = (self.factory, str(repository))
        if key not in _FACTORY_CACHE:
            _FACTORY_CACHE[key] = load_factory(self.factory, repository)()
        stage, _deps = _FACTORY_CACHE[key][self.node]
        self.fn = _batch_fn(self.node, stage)
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}

        def typed(tensor: dict[str, Any]) -> tuple[str, TensorType]:
            declared = _default_type(tensor["data_type"], [int(d) for d in tensor["dims"]])
            encoding = parameters.get(ENCODING_PARAMETER + tensor["name"], declared.encoding)
            return tensor["name"], TensorType(encoding, declared.data_type, declared.dims)

        self.inputs = [typed(t) for t in config["input"]]
        (self.output,) = [typed(t) for t in config["output"]]

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self._pb
        sizes: list[int] = []
        items: list[Any] = []
        for request in requests:
            columns = [t.decode(pb.get_input_tensor_by_name(request, n).as_numpy()) for n, t in self.inputs]
            rows = columns[0] if len(columns) == 1 else list(zip(*columns))
            sizes.append(len(rows))
            items.extend(rows)
        try:
            results = self.fn(items)
            if len(results) != len(items):
                raise ValueError(f"returned {len(results)} results for {len(items)} items")
        except Exception as exc:  # noqa: BLE001 - the node's error goes back to every caller of this batch
            error = pb.TritonError(f"node {self.node!r} raised {type(exc).__name__}: {exc}")
            return [pb.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        name, kind = self.output
        responses, start = [], 0
        for size in sizes:
            tensor = pb.Tensor(name, kind.encode(results[start:start + size]))
            responses.append(pb.InferenceResponse(output_tensors=[tensor]))
            start += size
        return responses


# --- the server ----------------------------------------------------------------------------------------


def _pytriton_root() -> Path:
    if not (sys.platform == "linux" and os.uname().machine == "x86_64"):
        raise TritonUnavailableError(
            f"the tritonserver binary ships (in the nvidia-pytriton wheel) for Linux x86_64 only; this is "
            f"{sys.platform} {os.uname().machine}. Run Triton's container instead (nvcr.io/nvidia/tritonserver) "
            "and point TritonClient at it.")
    found = importlib.util.find_spec("pytriton")
    if found is None or not found.submodule_search_locations:
        raise TritonUnavailableError("nvidia-pytriton is not installed: pip install -r requirements.txt "
                                     "(it carries the tritonserver binary)")
    root = Path(next(iter(found.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        raise TritonUnavailableError(f"no tritonserver binary in {root / 'bin'}: reinstall nvidia-pytriton")
    return root


def triton_available() -> str | None:
    """``None`` when the tritonserver binary can run here, else the reason why not.

    >>> triton_available() is None or isinstance(triton_available(), str)
    True
    """
    try:
        _pytriton_root()
    except TritonUnavailableError as err:
        return str(err)
    return None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _stop_process_group(process: subprocess.Popen, grace: float) -> None:
    # SIGINT (Triton's clean shutdown), then SIGTERM, then SIGKILL, by the server's own PID; then anything
    # left in its process group (its Python stubs), whose id is that same PID.  A Ctrl-C while waiting
    # (a learner interrupting the kernel) skips to SIGKILL, so the server never outlives the interruption.
    import psutil

    from infergraph_lite.serving.processes import stop_processes

    try:  # the model stubs, remembered now: once the server is gone they are nobody's children
        stubs = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
    except psutil.Error:
        stubs = []
    interrupted: BaseException | None = None
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            break
        try:
            process.send_signal(sig)
            process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    stop_processes(stubs, timeout=5.0)  # wait until every stub is really gone (SIGKILL is not instant)
    if interrupted is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5.0)  # reap it
        raise interrupted


class TritonServer:
    """A real ``tritonserver`` on 127.0.0.1, free ports, as a context manager that always stops it.

    Starts the binary from the ``nvidia-pytriton`` wheel on the repository, waits until it is ready
    (``timeout`` seconds), and keeps its log (``.log``).  Leaving the block -- also by an exception --
    stops it by its own PID: SIGINT, then SIGTERM, then SIGKILL, and nothing of its process group is
    left.  A start that fails (port taken, bad config, missing binary) raises an error naming the cause
    and leaves no process.  ``model_control="explicit"`` lets :meth:`TritonClient.load` reload models.

    >>> TritonServer("no-such-repository").start()
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.triton.TritonConfigError: model repository no-such-repository does not exist

    Typical use (needs the binary, so not run as a doctest)::

        with TritonServer(repo) as server, server.client() as client:
            client.infer({"text": "The pizza was excellent."})          # {'format': 'food (0.91), ...'}
            run_closed_loop(client, n_clients=16, n_requests=500, make_item=...)
            client.statistics()["embed"].batch_sizes                     # {1: 40, 2: 31, ...}
    """

    def __init__(self, repository: Repository | str | Path, *, timeout: float = 60.0,
                 model_control: Literal["none", "explicit"] = "none", ports: Sequence[int] | None = None,
                 exit_timeout: int = 3, extra_args: Sequence[str] = ()):
        self.repository = Path(repository.path if isinstance(repository, Repository) else repository)
        self.timeout, self.model_control, self.exit_timeout = timeout, model_control, exit_timeout
        self.extra_args = list(extra_args)
        self._ports = list(ports) if ports else None
        self.process: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._saved_log = ""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def url(self) -> str:
        """``127.0.0.1:port`` of the HTTP endpoint."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> str:
        """Everything the server has written so far."""
        if self._workdir is None or not (self._workdir / "server.log").exists():
            return self._saved_log  # kept from the last run once the server stopped
        return (self._workdir / "server.log").read_text(errors="replace")

    def environment(self, root: Path) -> dict[str, str]:
        """The environment the binary and its Python stubs need (see the triton-cpu recipe)."""
        env = dict(os.environ)
        site = root.parent.parent
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libs = [sysconfig.get_config_var("LIBDIR") or "", str(site / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*[p for p in libs if p], *filter(None, [env.get("LD_LIBRARY_PATH")])])
        # One BLAS thread per stub: every model instance is its own process, so Triton's instance_group
        # count, not BLAS, decides how many cores a model uses (and 2 cores are not oversubscribed).
        for knob in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(knob, "1")
        # The stubs import factories as this process would (a test folder, the notebook's folder).
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
        return env

    def start(self) -> TritonServer:
        if self.process is not None:
            raise RuntimeError("this TritonServer is already running")
        read_repository(self.repository)  # a bad config fails here, before any process exists
        root = _pytriton_root()
        self._workdir = Path(tempfile.mkdtemp(prefix="infergraph-triton-"))
        backend = self._workdir / "backends" / "python"
        backend.mkdir(parents=True)
        for file in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy(root / "backends" / "python" / file, backend)
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.exists():
            raise TritonUnavailableError(f"nvidia-pytriton has no Python backend stub for Python {version}")
        shutil.copy(stub, backend)
        self.http_port, self.grpc_port, self.metrics_port = self._ports or _free_ports(3)
        command = [
            str(root / "bin" / "tritonserver"), f"--model-repository={self.repository.resolve()}",
            f"--backend-directory={backend.parent}",
            "--http-address=127.0.0.1", f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}", "--allow-gpu-metrics=false",
            f"--exit-timeout-secs={self.exit_timeout}", f"--model-control-mode={self.model_control}",
            "--model-load-thread-count=8", "--disable-auto-complete-config",
            *(["--load-model=*"] if self.model_control == "explicit" else []), *self.extra_args,
        ]
        with open(self._workdir / "server.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.environment(root), start_new_session=True)
        self._finalizer = weakref.finalize(self, _stop_process_group, self.process, float(self.exit_timeout + 2))
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TritonStartError(self._failure_reason(f"exited with status {self.process.returncode}"), self.log)
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TritonStartError(self._failure_reason(f"was not ready after {self.timeout:.0f} s"), self.log)

    def _failure_reason(self, what: str) -> str:
        log = self.log
        if "already in use" in log or "Address in use" in log or "Failed to bind" in log:
            cause = (f"a port is taken (http {self.http_port}, grpc {self.grpc_port}, metrics {self.metrics_port}); "
                     "another server is listening there")
        else:
            failed = re.findall(r"failed to load '([^']+)' version \d+: ([^\"\\]*)", log)
            errors = [f"model {model!r} failed to load: {why.strip()}" for model, why in dict.fromkeys(failed)]
            errors += [line.strip() for line in log.splitlines()
                       if not failed and (re.match(r"\s*E\d{4}", line) or line.startswith("error:"))
                       and "CUDA" not in line and "Cuda" not in line]
            cause = "; ".join(dict.fromkeys(errors[:4])) or "see .log"
        return f"tritonserver {what}: {cause}"

    def stop(self) -> None:
        """Stop the server (SIGINT, SIGTERM, SIGKILL by its PID) and remove its working folder."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_process_group once
            self._finalizer = None
        if self._workdir is not None:
            self._saved_log = self.log
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.process = None

    def processes(self) -> list[Any]:
        """The server's process and its children (a Python stub per model instance), as ``psutil.Process``."""
        import psutil

        if self.process is None:
            return []
        server = psutil.Process(self.process.pid)
        return [server, *server.children(recursive=True)]

    def instances(self) -> dict[str, int]:
        """Model -> how many Python stub processes serve it now (``instance_group`` count, per version loaded)."""
        counts: dict[str, int] = {}
        for process in self.processes()[1:]:
            try:
                command = process.cmdline()
            except Exception:  # noqa: BLE001 - a stub that just exited has no command line any more
                continue
            if len(command) > 1 and command[1].endswith("model.py"):
                model = Path(command[1]).parent.parent.name
                counts[model] = counts.get(model, 0) + 1
        return dict(sorted(counts.items()))

    def client(self) -> TritonClient:
        """A :class:`TritonClient` connected to this server."""
        return TritonClient(self.grpc_url)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --- the client: requests, futures, statistics ----------------------------------------------------------


@dataclass(frozen=True)
class ModelStats:
    """One model's counters from Triton's statistics API (since load, or a difference of two readings).

    ``batch_sizes`` is the histogram Triton's dynamic batcher produced: batch size -> executions;
    ``batch_compute`` the compute seconds (input + infer + output) those executions took, per batch size,
    so ``batch_compute[b] / batch_sizes[b]`` is the mean time of one call with a batch of ``b``.
    Times are totals in seconds; the ``mean_*`` properties divide by the request count.
    """

    name: str
    requests: int = 0  # successful requests
    inferences: int = 0  # items (a request may hold several)
    executions: int = 0  # batches run
    request_time: float = 0.0  # success: arrival to response, summed over requests
    queue_time: float = 0.0
    compute_time: float = 0.0  # input + infer + output
    batch_sizes: dict[int, int] = field(default_factory=dict)
    batch_compute: dict[int, float] = field(default_factory=dict)  # batch size -> compute seconds of its executions

    @property
    def mean_latency(self) -> float:
        return self.request_time / self.requests if self.requests else float("nan")

    @property
    def mean_queue(self) -> float:
        return self.queue_time / self.requests if self.requests else float("nan")

    @property
    def mean_compute(self) -> float:
        return self.compute_time / self.requests if self.requests else float("nan")

    @property
    def mean_batch_size(self) -> float:
        total = sum(self.batch_sizes.values())
        return sum(b * n for b, n in self.batch_sizes.items()) / total if total else float("nan")

    @property
    def call_seconds(self) -> dict[int, float]:
        """Mean compute seconds of one call (one execution), per batch size: the measured s(b).

        >>> ModelStats("m", batch_sizes={1: 4, 8: 2}, batch_compute={1: 0.04, 8: 0.05}).call_seconds
        {1: 0.01, 8: 0.025}
        """
        return {b: self.batch_compute.get(b, 0.0) / n for b, n in self.batch_sizes.items() if n}

    def __sub__(self, earlier: ModelStats) -> ModelStats:
        sizes = {b: n - earlier.batch_sizes.get(b, 0) for b, n in self.batch_sizes.items()}
        compute = {b: t - earlier.batch_compute.get(b, 0.0) for b, t in self.batch_compute.items()}
        return ModelStats(self.name, self.requests - earlier.requests, self.inferences - earlier.inferences,
                          self.executions - earlier.executions, self.request_time - earlier.request_time,
                          self.queue_time - earlier.queue_time, self.compute_time - earlier.compute_time,
                          {b: n for b, n in sorted(sizes.items()) if n},
                          {b: compute.get(b, 0.0) for b, n in sorted(sizes.items()) if n})

    def stage_times(self) -> StageTimes:
        """Per request queue and compute seconds and the mean batch, as
        :class:`~infergraph_lite.serving.loadtest.LoadReport`
        shows a stage."""
        return StageTimes(self.mean_queue, self.mean_compute, self.mean_batch_size)

    @classmethod
    def from_triton(cls, stats: Mapping[str, Any]) -> ModelStats:
        """From one entry of ``get_inference_statistics(as_json=True)['model_stats']``."""
        inference = stats.get("inference_stats", {})

        def seconds(part: str) -> float:
            return int(inference.get(part, {}).get("ns", 0)) / 1e9

        sizes = {int(b["batch_size"]): int(b.get("compute_infer", {}).get("count", 0))
                 for b in stats.get("batch_stats", [])}
        compute = {int(b["batch_size"]): sum(int(b.get(part, {}).get("ns", 0))
                                             for part in ("compute_input", "compute_infer", "compute_output")) / 1e9
                   for b in stats.get("batch_stats", [])}
        return cls(stats["name"], int(inference.get("success", {}).get("count", 0)),
                   int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0)), seconds("success"),
                   seconds("queue"), seconds("compute_input") + seconds("compute_infer") + seconds("compute_output"),
                   {b: n for b, n in sorted(sizes.items()) if n},
                   {b: compute[b] for b, n in sorted(sizes.items()) if n})


def _sum_stats(name: str, parts: Sequence[ModelStats]) -> ModelStats:
    sizes: dict[int, int] = {}
    compute: dict[int, float] = {}
    for p in parts:
        for b, n in p.batch_sizes.items():
            sizes[b] = sizes.get(b, 0) + n
        for b, t in p.batch_compute.items():
            compute[b] = compute.get(b, 0.0) + t
    return ModelStats(name, sum(p.requests for p in parts), sum(p.inferences for p in parts),
                      sum(p.executions for p in parts), sum(p.request_time for p in parts),
                      sum(p.queue_time for p in parts), sum(p.compute_time for p in parts), dict(sorted(sizes.items())),
                      {b: compute.get(b, 0.0) for b in sorted(sizes)})


class TritonClient:
    """Talk to a Triton server: one answer (:meth:`infer`), a future (:meth:`submit`), its statistics.

    ``submit(inputs) -> Future`` is the load generators' interface, so the package's open- and
    closed-loop drivers put load on Triton as they do on the in-process batcher.  Tensor types
    (text, JSON, numbers, arrays) are read from the model's config on the server.
    """

    def __init__(self, grpc_url: str, model: str = "pipeline"):
        import tritonclient.grpc as grpcclient  # gRPC only: no gevent, so an interrupted call cannot hang the hub

        self.grpc_url, self.model = grpc_url, model
        self._grpc = grpcclient
        self._stream = grpcclient.InferenceServerClient(grpc_url)
        self._types: dict[str, tuple[dict[str, TensorType], dict[str, TensorType]]] = {}

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def tensor_types(self, model: str | None = None) -> tuple[dict[str, TensorType], dict[str, TensorType]]:
        """``(inputs, outputs)`` of a model: tensor name -> :class:`TensorType`, read from its config."""
        model = model or self.model
        if model not in self._types:
            config = self._stream.get_model_config(model, as_json=True)["config"]
            parameters = {k: v.get("string_value") for k, v in config.get("parameters", {}).items()}

            def typed(tensor: Mapping[str, Any]) -> TensorType:
                declared = _default_type(tensor["data_type"], [int(d) for d in tensor["dims"]])
                encoding = parameters.get(ENCODING_PARAMETER + tensor["name"], declared.encoding)
                return TensorType(encoding, declared.data_type, declared.dims)

            self._types[model] = ({t["name"]: typed(t) for t in config.get("input", [])},
                                  {t["name"]: typed(t) for t in config.get("output", [])})
        return self._types[model]

    def _request(self, model: str, inputs: Mapping[str, Any]) -> tuple[list[Any], list[Any], dict[str, TensorType]]:
        in_types, out_types = self.tensor_types(model)
        if len(in_types) == 1 and set(inputs) != set(in_types):
            inputs = {next(iter(in_types)): next(iter(inputs.values()))}  # one input: any name will do
        missing = set(in_types) - set(inputs)
        if missing:
            raise ValueError(f"model {model!r} needs inputs {sorted(in_types)}; missing {sorted(missing)}")
        tensors = []
        for name, kind in in_types.items():
            data = kind.encode([inputs[name]])
            tensor = self._grpc.InferInput(name, list(data.shape), kind.wire_type)
            tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        outputs = [self._grpc.InferRequestedOutput(name) for name in out_types]
        return tensors, outputs, out_types

    @staticmethod
    def _decode(result: Any, out_types: Mapping[str, TensorType]) -> dict[str, Any]:
        return {name: kind.decode(result.as_numpy(name))[0] for name, kind in out_types.items()}

    def infer(self, inputs: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """One request: ``{input name: value}`` -> ``{output name: value}``."""
        model = model or self.model
        tensors, outputs, out_types = self._request(model, inputs)
        return self._decode(self._stream.infer(model, tensors, outputs=outputs), out_types)

    def submit(self, inputs: Mapping[str, Any], model: str | None = None) -> Future:
        """Send one request without waiting; the future holds ``{output name: value}`` (or the error)."""
        model = model or self.model
        future: Future = Future()
        future.set_running_or_notify_cancel()
        tensors, outputs, out_types = self._request(model, inputs)

        def done(result: Any, error: Any) -> None:
            if error is not None:
                future.set_exception(RuntimeError(str(error)))
            else:
                try:
                    future.set_result(self._decode(result, out_types))
                except Exception as exc:  # noqa: BLE001 - a decoding problem belongs to the caller
                    future.set_exception(exc)

        self._stream.async_infer(model, tensors, callback=done, outputs=outputs)
        return future

    def statistics(self, model: str = "", version: str = "") -> dict[str, ModelStats]:
        """Per-model counters since load: requests, batch-size histogram, queue and compute time.

        Versions of a model are summed unless ``version`` is given.
        """
        raw = self._stream.get_inference_statistics(model, version, as_json=True).get("model_stats", [])
        grouped: dict[str, list[ModelStats]] = {}
        for entry in raw:
            grouped.setdefault(entry["name"], []).append(ModelStats.from_triton(entry))
        return {name: _sum_stats(name, parts) for name, parts in grouped.items()}

    def load(self, model: str) -> None:
        """(Re)load a model from the repository (needs ``model_control="explicit"``): new versions and configs."""
        self._stream.load_model(model)
        self._types.pop(model, None)

    def unload(self, model: str) -> None:
        self._stream.unload_model(model)
        self._types.pop(model, None)

    def ready_versions(self, model: str) -> list[str]:
        """The versions of ``model`` now serving."""
        index = self._stream.get_model_repository_index(as_json=True).get("models", [])
        return sorted(m.get("version", "") for m in index if m["name"] == model and m.get("state") == "READY")
