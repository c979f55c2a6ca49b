"""Moved to :mod:`~infergraph_lite.frameworks.dask.graph` and :mod:`~infergraph_lite.frameworks.dask.cluster`
(issue 36: one folder per framework); this old path stays importable for notebook 07.

Every name of the old module is here: the listed ones imported, any other on first use (PEP 562).
A monkeypatch must target the real module: setting a name here changes nothing there.
"""

from __future__ import annotations

import importlib
from typing import Any

from infergraph_lite.frameworks.dask.cluster import DaskGraphCluster
from infergraph_lite.frameworks.dask.graph import ENGINE, from_stage, run_dask, stage_item, to_dask_graph

_HOMES = ("infergraph_lite.frameworks.dask.graph", "infergraph_lite.frameworks.dask.cluster",
          "infergraph_lite.frameworks.dask.options")
__all__ = ["ENGINE", "DaskGraphCluster", "from_stage", "run_dask", "stage_item", "to_dask_graph"]


def __getattr__(name: str) -> Any:
    # A name outside __all__ (a constant, a helper): looked up in the new home(s), in order.
    for home in _HOMES:
        module = importlib.import_module(home)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
