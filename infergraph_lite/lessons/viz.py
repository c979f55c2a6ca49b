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
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import networkx as nx
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from infergraph_lite.core.graph import Graph, levels

__all__ = ["draw_levels", "plain_log_ticks", "plot_timeline", "show_source", "to_networkx"]


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


_BOX_HEIGHT = 0.44
"""Height of a node's box in row units (rows are 1 apart, so a gap of 0.56 stays free between boxes)."""


class _Layout(NamedTuple):
    """Where :func:`draw_levels` puts things, in data coordinates: one column per level, one row per node."""

    columns: list[list[str]]
    centre: dict[str, tuple[float, float]]
    box_width: float


def _layout(nodes: Graph, inputs: list[str]) -> _Layout:
    by_level = levels(nodes, inputs)
    g = to_networkx(nodes, inputs)
    columns = [sorted(inputs)]
    row: dict[str, float] = {name: i for i, name in enumerate(columns[0])}
    for names in by_level:
        # Order each column by the mean row of its parents: fewer crossing edges.
        column = sorted(names, key=lambda n: (sum(row[p] for p in g.pred[n]) / max(len(g.pred[n]), 1), n))
        row.update({name: i for i, name in enumerate(column)})
        columns.append(column)
    centre = {name: (float(x), (len(column) - 1) / 2 - i) for x, column in enumerate(columns)
              for i, name in enumerate(column)}
    longest = max(len(name) for name in centre)
    # A column is _COLUMN_INCHES wide; a label of n characters at 8 pt needs about 0.085 n + 0.3 inches.
    box_width = min(0.8, (0.085 * longest + 0.3) / _column_inches(longest))
    return _Layout(columns, centre, box_width)


def _column_inches(longest_label: int) -> float:
    return max(2.1, 0.085 * longest_label + 1.0)


def _gaps(column: list[str], centre: Mapping[str, tuple[float, float]]) -> list[float]:
    """The y of every free lane through a column: between two boxes, and above and below them all."""
    ys = sorted(centre[name][1] for name in column)
    return [ys[0] - 0.5, *((a + b) / 2 for a, b in itertools.pairwise(ys)), ys[-1] + 0.5]


def _edge_route(layout: _Layout, source: str, target: str, y_start: float, y_end: float) -> list[tuple[float, float]]:
    """The polyline of one edge, from the right side of ``source``'s box to the left side of ``target``'s.

    An edge between neighbouring columns is straight: nothing stands between
    two columns.  An edge that skips columns stays straight if that clears
    every box in between; otherwise it crosses each column in the free lane
    nearest its straight line, so it never runs through another node's box.
    """
    half = layout.box_width / 2
    (x0, _), (x1, _) = layout.centre[source], layout.centre[target]
    start, end = (x0 + half, y_start), (x1 - half, y_end)
    between = [int(x) for x in range(int(x0) + 1, int(x1))]
    boxes = [_box(layout, name) for x in between for name in layout.columns[x]]
    if not any(_segment_hits_box(start, end, box) for box in boxes):
        return [start, end]
    route = [start]
    for x in between:
        y_line = y_start + (y_end - y_start) * (x - x0) / (x1 - x0)
        lane = min(_gaps(layout.columns[x], layout.centre), key=lambda y: (abs(y - y_line), y))
        route += [(x - half, lane), (x + half, lane)]
    return [*route, end]


def _box(layout: _Layout, name: str) -> tuple[float, float, float, float]:
    """``(left, bottom, right, top)`` of a node's box."""
    x, y = layout.centre[name]
    return (x - layout.box_width / 2, y - _BOX_HEIGHT / 2, x + layout.box_width / 2, y + _BOX_HEIGHT / 2)


def _segment_hits_box(p: tuple[float, float], q: tuple[float, float], box: tuple[float, float, float, float]) -> bool:
    """Whether the segment ``p``-``q`` passes through the inside of ``box`` (Liang-Barsky clipping).

    >>> _segment_hits_box((0, 0), (2, 2), (0.5, 0.5, 1.5, 1.5)), _segment_hits_box((0, 2), (2, 2), (0, 0, 1, 1))
    (True, False)
    """
    (px, py), (qx, qy) = p, q
    left, bottom, right, top = box
    t0, t1 = 0.0, 1.0
    for delta, low, high, start in ((qx - px, left, right, px), (qy - py, bottom, top, py)):
        if delta == 0:
            if not low < start < high:
                return False
            continue
        a, b = (low - start) / delta, (high - start) / delta
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
    return t1 - t0 > 1e-9


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
    (say, the critical path) whose nodes and edges are drawn in red.  Every
    edge runs from the right side of its source's box to an arrowhead on the
    left side of its target's box; an edge that skips a level is routed
    through the free lanes between the boxes it passes, so it never runs
    through another node (each edge is a line with ``gid`` ``"edge:a->b"``,
    each box a patch with ``gid`` ``"node:name"``, for tests and restyling).

    >>> ax = draw_levels({"pre": (None, ["x"]), "model": (None, ["pre"])}, ["x"])
    >>> sorted(line.get_gid() for line in ax.lines)
    ['edge:pre->model', 'edge:x->pre']
    """
    inputs = list(inputs) or sorted({d for _, deps in nodes.values() for d in deps if d not in nodes})
    by_level = levels(nodes, inputs)
    layout = _layout(nodes, inputs)
    g = to_networkx(nodes, inputs)
    if ax is None:
        tallest = max(map(len, layout.columns))
        width = _column_inches(max(len(name) for name in layout.centre)) * len(layout.columns) + 0.6
        _, ax = plt.subplots(figsize=(width, 1.0 * tallest + 1.6))
    cmap = plt.get_cmap("viridis", max(len(by_level), 2))
    level_of = {name: level for level, names in enumerate(by_level) for name in names}
    on_path = set(highlight)
    path_edges = set(itertools.pairwise(highlight))

    # Where each edge leaves and enters a box: spread over the box's side, ordered top to bottom so that
    # edges into (or out of) one node do not cross each other there.
    def spread(edges: list[tuple[str, str]], other: int) -> dict[tuple[str, str], float]:
        edges = sorted(edges, key=lambda e: (-layout.centre[e[other]][1], layout.centre[e[other]][0]))
        step = 0.6 * _BOX_HEIGHT / max(len(edges), 1)
        return {e: (len(edges) - 1) / 2 * step - i * step for i, e in enumerate(edges)}

    leave: dict[tuple[str, str], float] = {}
    enter: dict[tuple[str, str], float] = {}
    for name in g:
        leave.update(spread(list(g.out_edges(name)), other=1))
        enter.update(spread(list(g.in_edges(name)), other=0))
    for u, v in g.edges:
        red = (u, v) in path_edges
        colour, width_pt = ("tab:red", 2.6) if red else ("0.55", 1.1)
        route = _edge_route(layout, u, v, layout.centre[u][1] + leave[u, v], layout.centre[v][1] + enter[u, v])
        xs, ys = zip(*route)
        ax.plot(xs, ys, color=colour, linewidth=width_pt, zorder=2 if red else 1, gid=f"edge:{u}->{v}",
                solid_joinstyle="round")
        ax.add_patch(FancyArrowPatch(route[-2], route[-1], arrowstyle="-|>", mutation_scale=12, color=colour,
                                     shrinkA=0, shrinkB=0, linewidth=0, zorder=2 if red else 1,
                                     gid=f"arrowhead:{u}->{v}"))
    for name, (x, y) in layout.centre.items():
        fill: Any
        if name in level_of:
            r, g_, b, _ = fill = cmap(level_of[name])
            dark = 0.299 * r + 0.587 * g_ + 0.114 * b < 0.5  # white text only on dark fills
            text_colour = "white" if dark else "black"
        else:
            fill, text_colour = "0.85", "black"
        left, bottom, _, _ = _box(layout, name)
        ax.add_patch(FancyBboxPatch((left, bottom), layout.box_width, _BOX_HEIGHT,
                                    boxstyle="round,pad=0,rounding_size=0.06",
                                    facecolor=fill, edgecolor="tab:red" if name in on_path else "black",
                                    linewidth=2.8 if name in on_path else 0.8, zorder=3, gid=f"node:{name}",
                                    mutation_aspect=1 / 3))
        ax.text(x, y, name, ha="center", va="center", fontsize=8, color=text_colour, zorder=4)
    handles = [Patch(facecolor="0.85", edgecolor="black", label="input")]
    handles += [Patch(facecolor=cmap(i), label=f"level {i}") for i in range(len(by_level))]
    if highlight:
        handles.append(Patch(facecolor="white", edgecolor="tab:red", linewidth=2.5, label="critical path"))
    # One row: a legend that wraps reads as two unrelated lists.
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(handles),
              fontsize=8, frameon=False)
    ax.set_title(title)
    ax.set_xlim(-0.6, len(layout.columns) - 0.4)
    tallest = max(map(len, layout.columns))
    ax.set_ylim(-(tallest - 1) / 2 - 0.75, (tallest - 1) / 2 + 0.75)
    ax.set_axis_off()
    return ax


def plain_log_ticks(ax: Axes, axis: str = "y") -> Axes:
    """Label a log axis with plain numbers (20, 50, 100, 200) instead of matplotlib's ``2×10¹``.

    ``axis`` is ``"x"``, ``"y"`` or ``"both"``.  Major ticks at 1, 2 and 5 times each power of ten are labelled
    ``%g``; minor ticks stay unlabelled, so labels never crowd.

    >>> _, ax = plt.subplots()
    >>> _ = ax.semilogy([1, 2], [20, 900])
    >>> ax = plain_log_ticks(ax)
    >>> ax.figure.canvas.draw()
    >>> [t.get_text() for t in ax.get_yticklabels() if t.get_text()][:4]
    ['10', '20', '50', '100']
    >>> plt.close(ax.figure)
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis not in ("x", "y", "both"):
        raise ValueError(f"axis must be 'x', 'y' or 'both', got {axis!r}")
    for name in ("x", "y") if axis == "both" else (axis,):
        target = ax.xaxis if name == "x" else ax.yaxis
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        target.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        target.set_minor_formatter(NullFormatter())
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
