"""The one contract every serving engine meets: :class:`Engine` (start, submit, close with a timeout, owned PIDs,
statistics), and :func:`protocol_problems`, which checks a class against it.

Each framework's adapter satisfies it under its own names where they already matched (Ray Serve's
:class:`~infergraph_lite.frameworks.ray.serve.RayServeGraph`, Dask's
:class:`~infergraph_lite.frameworks.dask.cluster.DaskGraphCluster`), or through a thin adapter where they did not
(Triton's server and client as :class:`~infergraph_lite.frameworks.triton.engine.TritonGraph`, llama.cpp's as
:class:`~infergraph_lite.frameworks.llamacpp.engine.LlamaCppEngine`, the in-process
:class:`~infergraph_lite.serving.graph_server.GraphServer` as
:class:`~infergraph_lite.frameworks.in_process.GraphServerEngine`).  Why one contract: the load generators, the
stage-field table and the loopback tests then treat every engine alike
(:mod:`~infergraph_lite.frameworks.registry` lists them), and a fifth framework is one more adapter.
"""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

__all__ = ["ENGINE_METHODS", "Engine", "protocol_problems"]


@runtime_checkable
class Engine(Protocol):
    """A graph (or a model) served by processes this object starts, all listening on 127.0.0.1 only.

    - ``start()`` starts everything and returns the engine itself (so ``engine = Adapter(...).start()`` reads);
      a start that fails stops what it had started and raises an error that names the cause.
    - ``submit(request)`` sends one request and returns a ``concurrent.futures.Future`` of its answer: the
      interface of the package's load generators (``run_open_loop``, ``run_closed_loop``).
    - ``close(timeout)`` stops everything it started, by PID, within about ``timeout`` seconds; safe to call
      twice and after a failed start.  What it returns is the engine's own report (Ray Serve's and Dask's: the
      PIDs that had to be stopped by signal).
    - ``started_pids()`` the PIDs of the living processes it started (and their descendants), never another
      server's; none after ``close``.
    - ``statistics()`` what the engine counted so far, as a dict (batch sizes, per-model counters, timings).
    """

    def start(self) -> Engine: ...

    def submit(self, request: Any) -> Future[Any]: ...

    def close(self, timeout: float = 30.0) -> object: ...

    def started_pids(self) -> list[int]: ...

    def statistics(self) -> dict[str, Any]: ...


ENGINE_METHODS = ("start", "submit", "close", "started_pids", "statistics")
"""The methods of :class:`Engine`, in the order an engine's life calls them."""


def protocol_problems(engine_type: type) -> list[str]:
    """What keeps ``engine_type`` from being an :class:`Engine`: a missing method, or one that cannot be called
    as the protocol calls it (positionally with the protocol's required arguments, and with its optional ones by
    keyword).  An empty list: none.

    ``isinstance(x, Engine)`` checks only that the names exist (``runtime_checkable``); this also checks the
    signatures, without making an instance (so without starting or importing anything heavy).

    >>> class Good:
    ...     def start(self, attempts=3): return self
    ...     def submit(self, inputs): ...
    ...     def close(self, timeout=60.0): return []
    ...     def started_pids(self): return []
    ...     def statistics(self): return {}
    >>> protocol_problems(Good)
    []
    >>> class Bad(Good):
    ...     def close(self): ...                       # no timeout
    ...     def submit(self, inputs, model): ...       # a second argument the caller never gives
    >>> protocol_problems(Bad)
    ['submit(self, inputs, model) cannot be called as submit(request)', \
'close(self) cannot be called as close(timeout=30.0)']
    """
    problems = []
    for name in ENGINE_METHODS:
        have = getattr(engine_type, name, None)
        if not callable(have):
            problems.append(f"{name}: missing")
            continue
        want = inspect.signature(getattr(Engine, name))
        required = [p for p in want.parameters.values() if p.default is p.empty]  # self first
        optional = {p.name: p.default for p in want.parameters.values() if p.default is not p.empty}
        signature = inspect.signature(have)
        try:
            signature.bind(*(object() for _ in required), **optional)
        except TypeError:
            shown = ", ".join([*(p.name for p in required[1:]), *(f"{k}={v!r}" for k, v in optional.items())])
            problems.append(f"{name}{signature} cannot be called as {name}({shown})")
    return problems
