"""infergraph_lite: the small inference-graph executor built across the notebooks.

The public names below are the ones the notebooks, exercises and tests use.
"""

from .batching import BatchError, DynamicBatcher, QueueFullError, profile_service_time
from .execute import NodeError, TraceEvent, measure_node_durations, run_graph, run_graph_parallel
from .graph import (
    CycleError,
    GraphError,
    InvalidNodeError,
    MissingDependencyError,
    NameConflictError,
    critical_path,
    find_cycle,
    levels,
    topological_order,
    validate_graph,
)
from .original import run_graph_original
from .simulate import AIMD, BatchingResult, UnstableLoadError, capacity, simulate_batching

__all__ = [
    "AIMD",
    "BatchError",
    "BatchingResult",
    "CycleError",
    "DynamicBatcher",
    "GraphError",
    "InvalidNodeError",
    "MissingDependencyError",
    "NameConflictError",
    "NodeError",
    "QueueFullError",
    "TraceEvent",
    "UnstableLoadError",
    "capacity",
    "critical_path",
    "find_cycle",
    "levels",
    "measure_node_durations",
    "profile_service_time",
    "run_graph",
    "run_graph_original",
    "run_graph_parallel",
    "simulate_batching",
    "topological_order",
    "validate_graph",
]
