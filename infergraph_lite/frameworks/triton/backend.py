"""What Triton's Python backend stub runs: :class:`NodeModel`, which serves one node's batch function.

Every generated ``model.py`` imports this module and nothing else of the package's Triton adapter, so a
model process loads the tensor encoding and the factory loader, never the server, the client or
``tritonclient``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infergraph_lite.core.stage import batch_item
from infergraph_lite.frameworks.triton.errors import TritonConfigError
from infergraph_lite.frameworks.triton.tensors import json_tensor_types

__all__ = ["NodeModel", "load_factory"]


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


_FACTORY_CACHE: dict[tuple[str, str], Any] = {}


class NodeModel:
    """Base of every generated ``model.py``: runs ``factory()[node]``'s batch function on each dynamic batch.

    Triton calls ``execute`` with the requests its dynamic batcher gathered; each request holds a
    tensor per input with a leading batch dimension.  The values of all requests are decoded into
    one list, the node's ``fn`` runs once on it, and the results are cut back into one response per
    request.  A node that raises -- an ``Exception`` or any other ``BaseException`` (``SystemExit``), which would
    otherwise end the stub process -- answers every request of the batch with the error, naming the node.
    """

    factory: str = ""
    node: str = ""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # only in Triton's stub

        self._pb = pb_utils
        repository = Path(args["model_repository"]).parent
        key = (self.factory, str(repository))
        if key not in _FACTORY_CACHE:
            _FACTORY_CACHE[key] = load_factory(self.factory, repository)()
        stage, _deps = _FACTORY_CACHE[key][self.node]
        if not callable(getattr(stage, "fn", None)):  # the repository writer checked it; this factory may differ
            raise TritonConfigError(self.node, "fn", f"factory {self.factory!r} gives node {self.node!r} no batch "
                                                     "function (Stage(fn=...))")
        self.fn = stage.fn
        inputs, outputs = json_tensor_types(json.loads(args["model_config"]))
        self.inputs = list(inputs.items())
        (self.output,) = outputs.items()

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self._pb
        sizes: list[int] = []
        items: list[Any] = []
        for request in requests:
            columns = [t.decode(pb.get_input_tensor_by_name(request, n).as_numpy()) for n, t in self.inputs]
            rows = [batch_item(values) for values in zip(*columns)]  # one item per row, as every engine builds it
            sizes.append(len(rows))
            items.extend(rows)
        try:
            results = self.fn(items)
            if len(results) != len(items):
                raise ValueError(f"returned {len(results)} results for {len(items)} items")
        except BaseException as exc:  # noqa: BLE001 - the node's error (a SystemExit too) goes back to every caller
            error = pb.TritonError(f"node {self.node!r} raised {type(exc).__name__}: {exc}")
            return [pb.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        name, kind = self.output
        responses, start = [], 0
        for size in sizes:
            tensor = pb.Tensor(name, kind.encode(results[start:start + size]))
            responses.append(pb.InferenceResponse(output_tensors=[tensor]))
            start += size
        return responses
