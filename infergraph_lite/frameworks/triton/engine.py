"""A stage graph on a real Triton server as one :class:`~infergraph_lite.frameworks.engine.Engine`.

Triton's parts stay separate, as a learner meets them in notebook 07 (a model repository, a server, a client);
:class:`TritonGraph` is the thin adapter that strings them together under the names every engine shares:
``start()`` writes the repository into a folder of its own and starts the server, ``submit`` is the client's,
``close(timeout)`` stops the server by PID and removes the folder, ``statistics()`` is Triton's per-model counts.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from infergraph_lite.core.stage import Stage, prepare_stages
from infergraph_lite.frameworks.triton.client import TritonClient
from infergraph_lite.frameworks.triton.repository import to_model_repository
from infergraph_lite.frameworks.triton.server import TritonServer
from infergraph_lite.serving.processes import living

__all__ = ["TritonGraph"]


class TritonGraph:
    """``stages`` served by a ``tritonserver`` on 127.0.0.1: an ensemble of one Python-backend model per stage.

    ``factory`` rebuilds the stage graph inside Triton's model processes (``"module:function"``, see
    :func:`~infergraph_lite.frameworks.triton.repository.to_model_repository`, as are ``example`` and
    ``tensors``, which give the tensor types); ``timeout`` bounds the server's start.

    Typical use (needs the binary, so not run as a doctest)::

        engine = TritonGraph(banana_stages(), inputs=["text"], factory="mymodule:banana_stages",
                             example={"text": "  BANANA  "}).start()
        engine.submit({"text": "apple"}).result()          # every output tensor of the ensemble
        engine.statistics()["combine"].batch_sizes          # Triton's own counts per model
        engine.close(timeout=20)
    """

    def __init__(self, stages: Mapping[str, tuple[Stage, Sequence[str]]], inputs: Iterable[str] = ("request",), *,
                 factory: str | Callable[[], Any], example: Mapping[str, Any] | None = None,
                 tensors: Mapping[str, Any] | None = None, timeout: float = 60.0) -> None:
        prepare_stages(stages, inputs, need="fn")  # graph errors before anything is written or started
        self.stages, self.factory, self.example, self.tensors = stages, factory, example, tensors
        self.timeout = timeout
        self.server: TritonServer | None = None
        self.client: TritonClient | None = None
        self._folder: str | None = None

    def start(self) -> TritonGraph:
        """Write the model repository (checked before it is written) and start the server on it."""
        self._folder = tempfile.mkdtemp(prefix="infergraph-triton-")
        try:
            repository = to_model_repository(self.stages, self._folder, factory=self.factory, example=self.example,
                                             tensors=self.tensors)
            self.server = TritonServer(repository, timeout=self.timeout).start()
            self.client = self.server.client()
        except BaseException:
            self.close()
            raise
        return self

    def submit(self, request: Mapping[str, Any]) -> Future[Any]:
        """One request to the ensemble (its inputs by name): :meth:`TritonClient.submit`."""
        if self.client is None:
            raise RuntimeError("not started: call .start() first")
        return self.client.submit(request)

    def close(self, timeout: float = 30.0) -> list[int]:
        """Close the client, stop the server by PID (its model processes with it), remove the repository.

        Returns the PIDs still alive afterwards (none, normally)."""
        pids = self.started_pids()
        client, server, self.client, self.server = self.client, self.server, None, None
        if client is not None:
            client.close()
        if server is not None:
            server.close(timeout)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        return living(pids)

    def started_pids(self) -> list[int]:
        """The server's process and its children (a Python stub per model instance) that are alive."""
        return [] if self.server is None else living(p.pid for p in self.server.processes())

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics per model (:class:`~infergraph_lite.frameworks.triton.client.ModelStats`)."""
        return {} if self.client is None else dict(self.client.statistics())
