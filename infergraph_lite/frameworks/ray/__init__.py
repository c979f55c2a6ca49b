"""The stage graph on Ray Serve (notebook 07): one deployment per stage, on a local Ray node on loopback.

One job per module, as in every framework folder:

- :mod:`~infergraph_lite.frameworks.ray.options`: a Stage's fields -> Serve's ``.options(...)`` and
  ``@serve.batch`` arguments (:func:`from_stage`); imports no Ray, so a test or a lesson can read the mapping;
- :mod:`~infergraph_lite.frameworks.ray.node`: the lifecycle of one local Ray head node on 127.0.0.1, every
  process it spawns recorded by PID and watched while it starts (:class:`LocalRayNode`, :func:`run_watched`);
- :mod:`~infergraph_lite.frameworks.ray.serve`: the graph adapter, :class:`RayServeGraph` (deploy, ``submit``,
  ``close(timeout)``, ``started_pids()``, ``batch_sizes()``) and its deployments.

The names below are loaded on first use: ``from infergraph_lite.frameworks.ray import from_stage`` imports no Ray;
any name from ``serve`` imports Ray (about a second) after setting the variables that keep it on loopback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infergraph_lite.frameworks.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from infergraph_lite.frameworks.ray.node import LIGHT_IMPORT_STUBS, LocalRayNode, RayStartError, run_watched
    from infergraph_lite.frameworks.ray.options import (
        ENGINE,
        ServeStage,
        batch_options,
        deployment_options,
        from_stage,
    )
    from infergraph_lite.frameworks.ray.serve import (
        INGRESS_DEPLOYMENT,
        LOOPBACK_ENV,
        STAGE_DEPLOYMENT,
        TESTED_RAY,
        GraphIngress,
        LoopbackError,
        RayServeGraph,
        StageReplica,
        autoscaling_config,
        keep_replica_grpc_on_loopback,
    )

_EXPORTS = {
    "options": ["ENGINE", "ServeStage", "batch_options", "deployment_options", "from_stage"],
    "node": ["LIGHT_IMPORT_STUBS", "LocalRayNode", "RayStartError", "run_watched"],
    "serve": ["INGRESS_DEPLOYMENT", "LOOPBACK_ENV", "STAGE_DEPLOYMENT", "TESTED_RAY", "GraphIngress", "LoopbackError",
              "RayServeGraph", "StageReplica", "autoscaling_config", "keep_replica_grpc_on_loopback"],
}

__all__ = [
    "ENGINE",
    "INGRESS_DEPLOYMENT",
    "LIGHT_IMPORT_STUBS",
    "LOOPBACK_ENV",
    "STAGE_DEPLOYMENT",
    "TESTED_RAY",
    "GraphIngress",
    "LocalRayNode",
    "LoopbackError",
    "RayServeGraph",
    "RayStartError",
    "ServeStage",
    "StageReplica",
    "autoscaling_config",
    "batch_options",
    "deployment_options",
    "from_stage",
    "keep_replica_grpc_on_loopback",
    "run_watched",
]

# PEP 562: a name is imported from its module when first asked for, then kept here.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
