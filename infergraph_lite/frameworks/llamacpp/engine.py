"""llama.cpp's server and client as one :class:`~infergraph_lite.frameworks.engine.Engine` (notebook 08's parts).

An LLM server serves one model, not a stage graph, so the request is a prompt (a string, a
:class:`~infergraph_lite.frameworks.llamacpp.client.CompletionRequest` or its fields) and the answer a
:class:`~infergraph_lite.frameworks.llamacpp.client.Completion`.  :class:`LlamaCppEngine` is the thin adapter:
the server and the client keep their own names and behaviour.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from infergraph_lite.frameworks.llamacpp.model import ModelInfo
from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
from infergraph_lite.serving.processes import living, process_tree

__all__ = ["LlamaCppEngine"]


class LlamaCppEngine:
    """``model`` served by :class:`~infergraph_lite.frameworks.llamacpp.server.LlamaCppServer` (``server_options``:
    its keyword arguments) and driven by its client (``client_options``: the client's).

    >>> from infergraph_lite.frameworks.llamacpp.model import write_tiny_llama
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> engine = LlamaCppEngine(model, n_parallel=2, client_options={"n_predict": 4}).start()
    >>> engine.submit("Once upon a time").result(timeout=60).n_tokens, len(engine.started_pids()) >= 1
    (4, True)
    >>> engine.close(timeout=10), engine.started_pids()
    ([], [])
    """

    def __init__(self, model: str | os.PathLike[str] | ModelInfo, *, client_options: Mapping[str, Any] | None = None,
                 **server_options: Any) -> None:
        self.model, self.server_options = model, server_options
        self.client_options = dict(client_options or {})
        self.server: LlamaCppServer | None = None
        self.client: Any = None  # a LlamaCppClient: imported with the openai package, when the engine starts

    def start(self) -> LlamaCppEngine:
        """Start the server (it waits for ``/health``) and make its client."""
        self.server = LlamaCppServer(self.model, start=False, **self.server_options)
        try:
            self.server.start()
            self.client = self.server.client(**self.client_options)
        except BaseException:
            self.close()
            raise
        return self

    def submit(self, request: Any) -> Future[Any]:
        """One completion request (a prompt, a CompletionRequest or a mapping of its fields)."""
        if self.client is None:
            raise RuntimeError("not started: call .start() first")
        return self.client.submit(request)

    def close(self, timeout: float = 10.0) -> list[int]:
        """Close the client, then stop the server by its PID; returns the PIDs still alive after (none, normally)."""
        pids = self.started_pids()
        client, server, self.client, self.server = self.client, self.server, None, None
        if client is not None:
            client.close()
        if server is not None:
            server.close(timeout)
        return living(pids)

    def started_pids(self) -> list[int]:
        """The server's process and its descendants, while alive."""
        pid = None if self.server is None else self.server.pid
        return [] if pid is None else living([pid, *process_tree(pid)])

    def statistics(self) -> dict[str, Any]:
        """The server's ``/metrics`` counters and gauges (``{}`` when it is not running)."""
        if self.server is None or not self.server.running:
            return {}
        return dict(self.server.metrics())
