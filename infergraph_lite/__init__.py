"""infergraph_lite: the small inference-graph executor built across the notebooks.

The public names below are the ones the notebooks, exercises and tests use.
"""

from .execute import NodeError, TraceEvent, run_graph, run_graph_parallel
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

__all__ = [
    "CycleError",
    "GraphError",
    "InvalidNodeError",
    "MissingDependencyError",
    "NameConflictError",
    "NodeError",
    "TraceEvent",
    "critical_path",
    "find_cycle",
    "levels",
    "run_graph",
    "run_graph_original",
    "run_graph_parallel",
    "topological_order",
    "validate_graph",
]
