"""How a Python value travels as a Triton tensor: its type, its encoding, and the types a config declares.

Imported by the Python backend stub (:mod:`.backend`), so it needs nothing but numpy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["DATA_TYPES", "ENCODING_PARAMETER", "Encoding", "TensorType", "declared_type", "json_tensor_types",
           "tensor_type_of"]

Encoding = Literal["text", "json", "scalar", "array"]
ENCODING_PARAMETER = "infergraph.encoding."  # + tensor name; a config parameter telling how values travel

# numpy dtype <-> Triton's config data type; the wire name is the config name without "TYPE_" (BYTES for strings).
DATA_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}
_NUMPY_TYPES = {v: k for k, v in DATA_TYPES.items()}


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
        return cls("scalar", DATA_TYPES[np.dtype(dtype).name])

    @classmethod
    def array(cls, dtype: str | np.dtype | type, dims: Sequence[int]) -> TensorType:
        return cls("array", DATA_TYPES[np.dtype(dtype).name], tuple(int(d) for d in dims))

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
    if isinstance(value, np.ndarray) and value.dtype.name in DATA_TYPES:
        return TensorType.array(value.dtype, value.shape)
    try:
        json.dumps(value, default=_to_json)
    except (TypeError, ValueError) as err:
        raise TypeError(f"a {type(value).__name__} cannot travel as a Triton tensor: {err}") from None
    return TensorType.json()


def declared_type(data_type: str, dims: Sequence[int], encoding: str | None = None) -> TensorType:
    """The tensor type of a tensor a config declares; without an infergraph ``encoding``, strings are text.

    >>> declared_type("TYPE_FP32", [1]), declared_type("TYPE_STRING", [1], "json").encoding
    (TensorType(encoding='scalar', data_type='TYPE_FP32', dims=(1,)), 'json')
    """
    dims = tuple(int(d) for d in dims)
    if data_type == "TYPE_STRING":
        default: TensorType = TensorType.text()
    elif dims == (1,):
        default = TensorType("scalar", data_type)
    else:
        default = TensorType("array", data_type, dims)
    return TensorType(encoding, default.data_type, default.dims) if encoding else default  # type: ignore[arg-type]


def json_tensor_types(config: Mapping[str, Any]) -> tuple[dict[str, TensorType], dict[str, TensorType]]:
    """``(inputs, outputs)`` of a config in Triton's JSON form (the stub's ``model_config``, the client's view).

    >>> json_tensor_types({"input": [{"name": "x", "data_type": "TYPE_STRING", "dims": ["1"]}],
    ...                    "output": [{"name": "y", "data_type": "TYPE_STRING", "dims": ["1"]}],
    ...                    "parameters": {"infergraph.encoding.y": {"string_value": "json"}}})[1]["y"].encoding
    'json'
    """
    parameters = {k: v.get("string_value") for k, v in config.get("parameters", {}).items()}

    def typed(tensor: Mapping[str, Any]) -> TensorType:
        return declared_type(tensor["data_type"], tensor["dims"], parameters.get(ENCODING_PARAMETER + tensor["name"]))

    return ({t["name"]: typed(t) for t in config.get("input", [])},
            {t["name"]: typed(t) for t in config.get("output", [])})
