"""Moved to :mod:`~infergraph_lite.frameworks.dask.graph` and :mod:`~infergraph_lite.frameworks.dask.cluster`
(issue 36: one folder per framework); this path stays for notebook 07.

A monkeypatch must target the real module: setting a name here changes nothing there.
"""

from infergraph_lite.frameworks.dask.cluster import DaskGraphCluster
from infergraph_lite.frameworks.dask.graph import ENGINE, from_stage, run_dask, stage_item, to_dask_graph
from infergraph_lite.frameworks.lazy import forward_names

__all__ = ["ENGINE", "DaskGraphCluster", "from_stage", "run_dask", "stage_item", "to_dask_graph"]

# any other name of the old module, on first use
__getattr__ = forward_names(__name__, ["infergraph_lite.frameworks.dask.graph",
                                       "infergraph_lite.frameworks.dask.cluster",
                                       "infergraph_lite.frameworks.dask.options"])
