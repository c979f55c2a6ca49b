"""infergraph_lite: the small inference-graph executor built across the notebooks.

The package is in layers that follow the course; each imports only those above it in this list:

- :mod:`~infergraph_lite.core`: the graph, its validation and ``Plan``, the executors, ``Stage``,
  ``BatchPolicy``, argument checks (notebooks 01-03, 05);
- :mod:`~infergraph_lite.simulation`: the batching queue, the graph simulator, theory, planning and
  autoscaling (04-06); :mod:`~infergraph_lite.serving`: the real batcher, ``GraphServer``, load
  generators, records and process trees (05-07) — the two import only ``core``;
- :mod:`~infergraph_lite.frameworks`: Triton, Ray Serve, Dask (07), on ``core`` and ``serving``;
- :mod:`~infergraph_lite.lessons` and :mod:`~infergraph_lite.exercises`: examples, models, drawings,
  ``expect`` and the checkers, on top.

The public names below are the ones the notebooks, exercises and tests use; the frameworks are imported
from their own modules, so that ``import infergraph_lite`` loads none of Triton, Ray or Dask.
"""

from infergraph_lite.core.execute import (
    NodeError,
    TraceEvent,
    measure_node_durations,
    run_graph,
    run_graph_parallel,
    run_plan,
    run_plan_parallel,
)
from infergraph_lite.core.graph import (
    CycleError,
    GraphError,
    InvalidNodeError,
    MissingDependencyError,
    MissingInputError,
    NameConflictError,
    Plan,
    critical_path,
    find_cycle,
    levels,
    prepare,
    topological_order,
    validate_graph,
)
from infergraph_lite.core.llm_metrics import LLMMetrics
from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.core.stage import Exponential, Stage, capacity
from infergraph_lite.lessons.claims import ClaimError, expect
from infergraph_lite.serving.batcher import BatchError, DynamicBatcher, QueueFullError
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import (
    LoadReport,
    ServiceProfile,
    profile_service_time,
    run_closed_loop,
    run_open_loop,
)
from infergraph_lite.serving.metrics import BatchRecord, RequestRecord
from infergraph_lite.simulation.graph import GraphResult, simulate_graph
from infergraph_lite.simulation.llm import LLMResult, simulate_llm
from infergraph_lite.simulation.queue import BatchingResult, UnstableLoadError, simulate_batching

__all__ = [
    "AIMD",
    "BatchError",
    "BatchPolicy",
    "BatchRecord",
    "BatchingResult",
    "ClaimError",
    "CycleError",
    "DynamicBatcher",
    "Exponential",
    "GraphError",
    "GraphResult",
    "GraphServer",
    "InvalidNodeError",
    "LLMMetrics",
    "LLMResult",
    "LoadReport",
    "MissingDependencyError",
    "MissingInputError",
    "NameConflictError",
    "NodeError",
    "Plan",
    "QueueFullError",
    "RequestRecord",
    "ServiceProfile",
    "Stage",
    "TraceEvent",
    "UnstableLoadError",
    "capacity",
    "critical_path",
    "expect",
    "find_cycle",
    "levels",
    "measure_node_durations",
    "prepare",
    "profile_service_time",
    "run_closed_loop",
    "run_graph",
    "run_graph_parallel",
    "run_open_loop",
    "run_plan",
    "run_plan_parallel",
    "simulate_batching",
    "simulate_graph",
    "simulate_llm",
    "topological_order",
    "validate_graph",
]
