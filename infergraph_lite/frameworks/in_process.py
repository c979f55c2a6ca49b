"""The package's own engine, :class:`~infergraph_lite.serving.graph_server.GraphServer`, as an
:class:`~infergraph_lite.frameworks.engine.Engine`: the reference the frameworks are compared with (notebook 07).

A thin adapter: GraphServer starts in its constructor and keeps its worker PIDs per stage, so
:class:`GraphServerEngine` constructs it in ``start()`` and lists the PIDs flat; nothing else is renamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from infergraph_lite.core.stage import Stage, prepare_stages
from infergraph_lite.serving.graph_server import GraphServer

__all__ = ["GraphServerEngine"]


class GraphServerEngine:
    """A stage graph on :class:`~infergraph_lite.serving.graph_server.GraphServer` (threads, or worker processes
    with ``workers="processes"``), behind the :class:`~infergraph_lite.frameworks.engine.Engine` protocol.

    >>> stages = {"n": (Stage(fn=lambda xs: [len(x) for x in xs], max_batch_size=4), ["text"])}
    >>> engine = GraphServerEngine(stages, inputs=("text",)).start()
    >>> engine.submit({"text": "banana"}).result(timeout=10)
    {'n': 6}
    >>> engine.statistics()["stage_times"]["n"].requests
    1
    >>> engine.close(timeout=10), engine.started_pids()
    (None, [])
    """

    def __init__(self, stages: Mapping[str, tuple[Stage, Sequence[str]]], inputs: Iterable[str] = ("request",),
                 **options: Any) -> None:
        self.stages, self.inputs, self.options = stages, tuple(inputs), options
        prepare_stages(stages, self.inputs, need="fn")  # graph errors before anything starts, as every engine
        self.server: GraphServer | None = None

    def start(self) -> GraphServerEngine:
        """Start the batchers' threads (and worker processes): GraphServer starts as it is constructed."""
        self.server = GraphServer(self.stages, self.inputs, **self.options)
        return self

    def submit(self, request: Mapping[str, Any]) -> Future[Any]:
        """One request (the graph's inputs by name); the future gives every stage's value."""
        if self.server is None:
            raise RuntimeError("not started: call .start() first")
        return self.server.submit(request)

    def close(self, timeout: float = 30.0) -> None:
        """GraphServer's own ``close(timeout)``: drain, join the threads, stop the worker processes by PID."""
        server, self.server = self.server, None
        if server is not None:
            server.close(timeout)

    def started_pids(self) -> list[int]:
        """The living worker processes of every stage (none with threads)."""
        if self.server is None:
            return []
        return sorted(pid for pids in self.server.worker_pids.values() for pid in pids)

    def statistics(self) -> dict[str, Any]:
        """Per stage queue and compute times and batch sizes (``stage_times``), and the failed requests."""
        if self.server is None:
            return {}
        return {"stage_times": self.server.stage_times(), "failed": self.server.failed}
