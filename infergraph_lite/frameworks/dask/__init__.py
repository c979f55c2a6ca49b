"""The same graph on Dask (notebook 07): one task graph per request, on a local cluster on loopback.

One job per module, as in every framework folder:

- :mod:`~infergraph_lite.frameworks.dask.options`: a Stage's fields -> what a task calls, or refused by name
  (:func:`from_stage`; Dask has no batcher and no request queue); imports no Dask;
- :mod:`~infergraph_lite.frameworks.dask.graph`: the graph adapter, our ``{name: (fn, [deps])}`` as Dask's task
  graph (:func:`to_dask_graph`) and one run of it (:func:`run_dask`);
- :mod:`~infergraph_lite.frameworks.dask.cluster`: the lifecycle, :class:`DaskGraphCluster` (a
  ``distributed.LocalCluster`` on 127.0.0.1: start, ``submit``, ``close(timeout)``, ``started_pids()``).

The names below are loaded on first use, so ``from infergraph_lite.frameworks.dask import from_stage`` imports no
Dask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infergraph_lite.frameworks.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from infergraph_lite.frameworks.dask.cluster import DaskGraphCluster
    from infergraph_lite.frameworks.dask.graph import run_dask, to_dask_graph
    from infergraph_lite.frameworks.dask.options import ENGINE, from_stage, prepare, stage_item

_EXPORTS = {
    "options": ["ENGINE", "from_stage", "prepare", "stage_item"],
    "graph": ["run_dask", "to_dask_graph"],
    "cluster": ["DaskGraphCluster"],
}

__all__ = [
    "ENGINE",
    "DaskGraphCluster",
    "from_stage",
    "prepare",
    "run_dask",
    "stage_item",
    "to_dask_graph",
]

# PEP 562: a name is imported from its module when first asked for, then kept here.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
