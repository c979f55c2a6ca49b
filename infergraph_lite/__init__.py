"""infergraph_lite: the small inference-graph executor built across the notebooks.

The public names below are the ones the notebooks, exercises and tests use.
The seed's original loop is kept apart, in :mod:`infergraph_lite.original`.
"""

from .batching import BatchError, BatchRecord, DynamicBatcher, GraphServer, QueueFullError, RequestRecord
from .claims import ClaimError, expect
from .execute import (
    NodeError,
    TraceEvent,
    measure_node_durations,
    run_graph,
    run_graph_parallel,
    run_plan,
    run_plan_parallel,
)
from .graph import (
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
from .loadtest import LoadReport, ServiceProfile, profile_service_time, run_closed_loop, run_open_loop
from .policy import AIMD, BatchPolicy
from .simulate import BatchingResult, GraphResult, UnstableLoadError, simulate_batching, simulate_graph
from .stage import Exponential, Stage, capacity

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
    "topological_order",
    "validate_graph",
]
