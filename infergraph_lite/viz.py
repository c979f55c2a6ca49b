"""Pictures and displays for the notebooks: the DAG by level, run timelines, source.

Nothing here runs a graph: it draws what :mod:`graph` computes and what the
executors recorded.  Every plot gets a title, axis labels with units and a
legend where more than one thing is drawn.

Introduced in notebook 02 (:func:`draw_levels`, :func:`show_source`) and
notebook 03 (:func:`plot_timeline`).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import networkx as nx
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from .graph import Graph, levels

__all__ = ["draw_levels", "plot_timeline", "show_source", "to_networkx"]


def show_source(obj: Any) -> Any:
    """Display the real source of a module function or class as highlighted code.

    The notebooks call this instead of pasting a copy, so the lesson cannot
    drift from the module.

    >>> show_source(show_source).data.splitlines()[1]
    'def show_source(obj: Any) -> Any:'
    """
    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj).rstrip()}\n```")


def to_networkx(nodes: Graph, inputs: Iterable[str] = ()) -> nx.DiGraph:
    """The graph as a networkx ``DiGraph``, edges pointing from a dependency to its user.

    Inputs become nodes with ``kind="input"``; graph nodes get ``kind="node"``.

    >>> g = to_networkx({"double": (None, ["x"])}, inputs=["x"])
    >>> list(g.edges), g.nodes["x"]["kind"]
    ([('x', 'double')], 'input')
    """
    g = nx.DiGraph()
    for name in inputs:
        g.add_node(name, kind="input")
    for name in nodes:
        g.add_node(name, kind="node")
    for name, (_, deps) in nodes.items():
        for dep in deps:
            if dep not in g:
                g.add_node(dep, kind="input")
            g.add_edge(dep, name)
    return g


def draw_levels(
    nodes: Graph,
    inputs: Iterable[str] = (),
    *,
    highlight: Sequence[str] = (),
    title: str = "Inference graph by level",
    ax: Axes | None = None,
) -> Axes:
    """Draw the DAG with one column per level, nodes coloured by level.

    Inputs sit in their own grey column on the left.  ``highlight`` is a path
    (say, the critical path) whose nodes and edges are drawn in red.
    """
    inputs = list(inputs) or sorted({d for _, deps in nodes.values() for d in deps if d not in nodes})
    by_level = levels(nodes, inputs)
    g = to_networkx(nodes, inputs)
    columns = [sorted(inputs)]
    row: dict[str, float] = {name: i for i, name in enumerate(columns[0])}
    for names in by_level:
        # Order each column by the mean row of its parents: fewer crossing edges.
        column = sorted(names, key=lambda n: (sum(row[p] for p in g.pred[n]) / max(len(g.pred[n]), 1), n))
        row.update({name: i for i, name in enumerate(column)})
        columns.append(column)
    pos = {name: (x, (len(column) - 1) / 2 - i) for x, column in enumerate(columns) for i, name in enumerate(column)}
    if ax is None:
        _, ax = plt.subplots(figsize=(2.1 * len(columns) + 1, 1.0 * max(map(len, columns)) + 1.6))
    cmap = plt.get_cmap("viridis", max(len(by_level), 2))
    level_of = {name: level for level, names in enumerate(by_level) for name in names}
    on_path = set(highlight)
    path_edges = set(itertools.pairwise(highlight))
    nx.draw_networkx_edges(
        g, pos, ax=ax, arrows=True, arrowsize=14, node_size=2600, node_shape="s",
        edge_color=["tab:red" if e in path_edges else "0.6" for e in g.edges],
        width=[2.8 if e in path_edges else 1.2 for e in g.edges],
    )
    for name, (x, y) in pos.items():
        if name in level_of:
            r, g_, b, _ = fill = cmap(level_of[name])
            dark = 0.299 * r + 0.587 * g_ + 0.114 * b < 0.5  # white text only on dark fills
            text_colour = "white" if dark else "black"
        else:
            fill, text_colour = "0.85", "black"
        edge = "tab:red" if name in on_path else "black"
        ax.text(x, y, name, ha="center", va="center", fontsize=8, color=text_colour, zorder=3,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": fill, "edgecolor": edge,
                      "linewidth": 2.8 if name in on_path else 0.8})
    handles = [Patch(facecolor="0.85", edgecolor="black", label="input")]
    handles += [Patch(facecolor=cmap(i), label=f"level {i}") for i in range(len(by_level))]
    if highlight:
        handles.append(Patch(facecolor="white", edgecolor="tab:red", linewidth=2.5, label="critical path"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=min(len(handles), 5),
              fontsize=8, frameon=False)
    ax.set_title(title)
    ax.set_xlim(-0.7, len(columns) - 0.3)
    tallest = max(map(len, columns))
    ax.set_ylim(-(tallest - 1) / 2 - 0.6, (tallest - 1) / 2 + 0.6)
    ax.set_axis_off()
    return ax


def plot_timeline(
    trace: Sequence[Any],
    *,
    highlight: Sequence[str] = (),
    title: str = "Parallel run timeline",
    ax: Axes | None = None,
    unit: str = "ms",
) -> Axes:
    """A Gantt chart of a run: one row per node, bars coloured by the thread that ran it.

    ``trace`` holds :class:`~infergraph_lite.TraceEvent` (or any objects with
    ``node``, ``thread``, ``start``, ``end`` in seconds).  Nodes in
    ``highlight`` get a red outline.
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    events = sorted(trace, key=lambda e: (e.start, e.node))
    threads = sorted({e.thread for e in events}, key=lambda t: min(e.start for e in events if e.thread == t))
    colours: Mapping[str, Any] = {t: plt.get_cmap("tab10")(i % 10) for i, t in enumerate(threads)}
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.45 * len(events) + 1.5))
    for row, e in enumerate(events):
        ax.barh(row, (e.end - e.start) * scale, left=e.start * scale, color=colours[e.thread],
                edgecolor="tab:red" if e.node in highlight else "black",
                linewidth=2.5 if e.node in highlight else 0.5)
    ax.set_yticks(range(len(events)), [e.node for e in events])
    ax.invert_yaxis()
    ax.set_xlabel(f"time since the run started ({unit})")
    ax.set_ylabel("node")
    ax.set_title(title)
    handles = [Patch(facecolor=colours[t], label=f"thread {i + 1}") for i, t in enumerate(threads)]
    if highlight:
        handles.append(Patch(facecolor="white", edgecolor="tab:red", linewidth=2.5, label="critical path"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_xlim(left=0)
    ax.grid(axis="x", alpha=0.3)
    return ax
