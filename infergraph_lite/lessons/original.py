"""The seed's executor, kept as it was, so notebook 02 and the benchmarks can measure it.

It rescans every remaining node on every pass, so a chain listed in reverse
order costs O(V^2) calls to ``all(...)``; a cycle and a missing dependency both
end in the same vague error.  :func:`infergraph_lite.run_graph` replaces it.
"""

from __future__ import annotations

from typing import Any


def run_graph_original(nodes: dict, inputs: dict) -> dict[str, Any]:
    """Run ``nodes`` by repeatedly scanning for a node whose dependencies are ready.

    >>> run_graph_original({"double": (lambda x: 2 * x, ["x"])}, {"x": 21})
    {'x': 21, 'double': 42}
    """
    results = dict(inputs)
    remaining = dict(nodes)
    while remaining:
        progressed = False
        for name, (func, deps) in list(remaining.items()):
            if all(d in results for d in deps):
                results[name] = func(*[results[d] for d in deps])
                del remaining[name]
                progressed = True
        if not progressed:
            raise ValueError("Cycle or missing dependency")
    return results
