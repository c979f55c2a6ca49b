"""Every serving engine the package has, by name: how to build it, which Stage fields it maps, whether it runs here.

One table instead of one per test: the stage-field test (``tests/test_stage_fields.py``) and the engine tests
(``tests/test_engines.py``: the :class:`~infergraph_lite.frameworks.engine.Engine` protocol, loopback only,
nothing left behind) iterate :data:`REGISTRY`, so a fifth framework is one adapter and one entry here, and the
tests then ask for its rows.  Nothing is imported until asked: an entry names its classes and functions as
``"module:name"`` strings, and :meth:`EngineEntry.available` looks for the framework's modules without
importing them.

>>> sorted(REGISTRY)
['Dask', 'GraphServer', 'Ray Serve', 'Triton', 'llama.cpp']
>>> sorted(REGISTRY["Dask"].fields)
['fn']
>>> REGISTRY["llama.cpp"].serves
'model'
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from infergraph_lite.core.stage import Stage
from infergraph_lite.frameworks.engine import Engine

__all__ = ["BATCHING_FIELDS", "REGISTRY", "EngineEntry", "stage_graph_engines"]

BATCHING_FIELDS = frozenset({"fn", "max_batch_size", "max_wait", "replicas", "max_queue_size"})
"""The Stage fields a batching server maps onto settings of its own (``service_time`` is the simulator's
prediction, a setting of no real engine)."""


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class EngineEntry:
    """One engine: ``name`` (as :class:`~infergraph_lite.core.stage.UnsupportedStageFieldError` names it), the
    ``package`` it lives in, its :class:`~infergraph_lite.frameworks.engine.Engine` class (``engine``,
    ``"module:Class"``), what it ``serves`` (a stage graph, built as ``Class(stages, inputs, **options)``, or one
    ``model``, built as ``Class(model, **options)``), its pure Stage mapping (``stage_options``,
    ``"module:function"`` called as ``function(name, stage, **options)``; none for a model server), the Stage
    ``fields`` it maps onto a setting of its own (any other field at a value other than its default is refused
    by name), the modules it ``requires``, and a ``platform_check`` (``"module:function"`` returning the reason
    it cannot run here, or None)."""

    name: str
    package: str
    engine: str
    serves: Literal["stage graph", "model"]
    stage_options: str | None
    fields: frozenset[str]
    requires: tuple[str, ...] = ()
    platform_check: str | None = None

    def engine_type(self) -> type[Engine]:
        """The engine's class (imported now: for Ray Serve, that imports Ray)."""
        engine_type: type[Engine] = _resolve(self.engine)
        return engine_type

    def build(self, *args: Any, **options: Any) -> Engine:
        """An engine, not started: ``build(stages, inputs, **options)``, or ``build(model, **options)``.

        >>> from infergraph_lite.core.stage import Stage
        >>> engine = REGISTRY["GraphServer"].build({"n": (Stage(fn=list), ["x"])}, ["x"])
        >>> engine.started_pids()
        []
        """
        return self.engine_type()(*args, **options)

    def stage_settings(self, name: str, stage: Stage, **options: Any) -> Any:
        """What this engine makes of one Stage (its own settings), or an ``UnsupportedStageFieldError`` naming
        the field; nothing starts.

        >>> REGISTRY["Ray Serve"].stage_settings("topic", Stage(fn=list, max_batch_size=8)).batching
        {'max_batch_size': 8, 'batch_wait_timeout_s': 0.0}
        """
        if self.stage_options is None:
            raise TypeError(f"{self.name} serves a {self.serves}, not a stage graph: it has no Stage mapping")
        mapping: Callable[..., Any] = _resolve(self.stage_options)
        return mapping(name, stage, **options)

    def available(self) -> str | None:
        """None when this engine can run here, else why not (a module missing, or the platform).

        >>> REGISTRY["GraphServer"].available() is None
        True
        """
        missing = [module for module in self.requires if importlib.util.find_spec(module) is None]
        if missing:
            return f"{self.name} needs {', '.join(missing)} (pip install -r requirements.txt)"
        if self.platform_check is not None:
            reason: str | None = _resolve(self.platform_check)()
            return reason
        return None


REGISTRY: dict[str, EngineEntry] = {entry.name: entry for entry in [
    EngineEntry("GraphServer", "infergraph_lite.serving", "infergraph_lite.frameworks.in_process:GraphServerEngine",
                "stage graph", "infergraph_lite.serving.graph_server:from_stage", BATCHING_FIELDS),
    EngineEntry("Triton", "infergraph_lite.frameworks.triton", "infergraph_lite.frameworks.triton.engine:TritonGraph",
                "stage graph", "infergraph_lite.frameworks.triton.config:config_from_stage", BATCHING_FIELDS,
                requires=("tritonclient",),
                platform_check="infergraph_lite.frameworks.triton.server:triton_available"),
    EngineEntry("Ray Serve", "infergraph_lite.frameworks.ray", "infergraph_lite.frameworks.ray.serve:RayServeGraph",
                "stage graph", "infergraph_lite.frameworks.ray.options:from_stage", BATCHING_FIELDS,
                requires=("ray",)),
    # A task scheduler has no batcher and no request queue: only fn is mapped, every other field refused.
    EngineEntry("Dask", "infergraph_lite.frameworks.dask", "infergraph_lite.frameworks.dask.cluster:DaskGraphCluster",
                "stage graph", "infergraph_lite.frameworks.dask.options:from_stage", frozenset({"fn"}),
                requires=("dask", "distributed")),
    EngineEntry("llama.cpp", "infergraph_lite.frameworks.llamacpp",
                "infergraph_lite.frameworks.llamacpp.engine:LlamaCppEngine", "model", None, frozenset(),
                requires=("xllamacpp", "openai", "gguf")),
]}
"""Every engine, by name."""


def stage_graph_engines() -> dict[str, EngineEntry]:
    """The entries that serve a stage graph (the stage-field table's columns).

    >>> sorted(stage_graph_engines())
    ['Dask', 'GraphServer', 'Ray Serve', 'Triton']
    """
    return {name: entry for name, entry in REGISTRY.items() if entry.serves == "stage graph"}
