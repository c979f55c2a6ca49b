"""Pictures and displays for the notebooks: the DAG by level, run timelines, source.

Nothing here runs a graph: it draws what :mod:`graph` computes and what the
executors recorded.  Every plot gets a title, axis labels with units and a
legend where more than one thing is drawn.

Introduced in notebook 02 (:func:`draw_levels`, :func:`show_source`),
notebook 03 (:func:`plot_timeline`) and notebook 08 (:func:`plot_slots`).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from infergraph_lite.core.graph import Graph, levels

__all__ = ["draw_levels", "edge_crossings", "plain_log_ticks", "plot_slots", "plot_timeline", "show_source",
           "to_networkx"]


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


Item = str | tuple[str, str, int]
"""What stands in a column while ordering it: a node, or a waypoint ``(u, v, x)`` of an edge that skips column x."""


class _Layout(NamedTuple):
    """Where :func:`draw_levels` puts things, in data coordinates: one column per level, one row per node.

    ``lanes[u, v]`` is the height at which an edge that skips columns passes each column between its ends, in a
    free lane between two boxes (or above or below them all).
    """

    columns: list[list[str]]
    centre: dict[str, tuple[float, float]]
    box_width: float
    lanes: dict[tuple[str, str], list[float]]


def _layout(nodes: Graph, inputs: list[str]) -> _Layout:
    """Columns by level, each ordered to keep its edges from crossing (Sugiyama et al.'s layered drawing, 1981).

    An edge that skips columns gets a waypoint in each column it passes, ordered with the nodes, so that
    every edge joins neighbouring columns.  Then barycenter sweeps: sort each column by the mean position of
    its items' neighbours in the column before it (left to right), then in the column after it (right to
    left), and keep the order whose edges cross the fewest times.
    """
    g = to_networkx(nodes, inputs)
    names = [sorted(inputs), *levels(nodes, inputs)]
    at = {name: x for x, column in enumerate(names) for name in column}
    columns: list[list[Item]] = [list(column) for column in names]
    left: dict[Item, list[Item]] = {name: [] for name in at}
    right: dict[Item, list[Item]] = {name: [] for name in at}
    for u, v in g.edges:
        waypoints: list[Item] = []
        for x in range(at[u] + 1, at[v]):  # one waypoint in each column between
            waypoints.append((u, v, x))
            columns[x].append((u, v, x))
        for a, b in itertools.pairwise([u, *waypoints, v]):
            right.setdefault(a, []).append(b)
            left.setdefault(b, []).append(a)
    best = [list(column) for column in columns]
    fewest = _order_crossings(best, right)
    for sweep in range(8):
        forward = sweep % 2 == 0
        for x in range(1, len(columns)) if forward else range(len(columns) - 2, -1, -1):
            beside = {item: i for i, item in enumerate(columns[x - 1 if forward else x + 1])}
            links = left if forward else right
            here = {item: i for i, item in enumerate(columns[x])}
            columns[x].sort(key=lambda item: sum(beside[n] for n in links[item]) / len(links[item])
                            if links[item] else here[item])
        if (count := _order_crossings(columns, right)) < fewest:
            best, fewest = [list(column) for column in columns], count
    return _placed(best)


def _order_crossings(columns: list[list[Item]], right: Mapping[Item, list[Item]]) -> int:
    """Crossings between neighbouring columns in this order: pairs of edges whose ends come in opposite orders.

    >>> _order_crossings([["x", "y"], ["a", "b"]], {"x": ["a", "b"], "y": ["a", "b"]})  # K(2,2) crosses once
    1
    """
    total = 0
    for here, after in itertools.pairwise(columns):
        position = {item: i for i, item in enumerate(after)}
        ends = [(i, position[b]) for i, a in enumerate(here) for b in right.get(a, []) if b in position]
        total += sum((a1 - a2) * (b1 - b2) < 0 for (a1, b1), (a2, b2) in itertools.combinations(ends, 2))
    return total


def _placed(columns: list[list[Item]]) -> _Layout:
    """Rows for the nodes (each column centred, 1 apart) and lanes for the waypoints between them."""
    real = [[item for item in column if isinstance(item, str)] for column in columns]
    centre = {name: (float(x), (len(names) - 1) / 2 - i)
              for x, names in enumerate(real) for i, name in enumerate(names)}
    lanes: dict[tuple[str, str], list[float]] = {}
    for column in columns:
        # The waypoints between the same two boxes (or above or below them all) share that lane, spread a
        # little so that their lines stay apart.
        above: str | None = None
        group: list[tuple[str, str, int]] = []
        for item in [*column, None]:
            if isinstance(item, tuple):
                group.append(item)
                continue
            if group:
                if above is not None and item is not None:
                    y = (centre[above][1] + centre[item][1]) / 2
                else:
                    y = centre[item][1] + 0.5 if item is not None else centre[str(above)][1] - 0.5
                step = min(0.1, 0.36 / len(group))
                for i, (u, v, _) in enumerate(group):
                    lanes.setdefault((u, v), []).append(y + ((len(group) - 1) / 2 - i) * step)
            above, group = item, []
    longest = max(len(name) for name in centre)
    # A column is _COLUMN_INCHES wide; a label of n characters at 8 pt needs about 0.085 n + 0.3 inches.
    box_width = min(0.8, (0.085 * longest + 0.3) / _column_inches(longest))
    return _Layout(real, centre, box_width, lanes)


def _column_inches(longest_label: int) -> float:
    return max(2.1, 0.085 * longest_label + 1.0)


def _routes(layout: _Layout, g: nx.DiGraph) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Every edge's polyline: from the right side of its source's box to the left side of its target's.

    An edge between neighbouring columns is straight: nothing stands between two columns.  An edge that skips
    columns crosses each of them in its lane, so it never runs through another node's box.  Where the edges
    leave (or enter) one box they are spread over its side in the order of where they go next (or come
    from), so that they do not cross each other there.
    """
    half = layout.box_width / 2
    inner = {(u, v): [p for x, y in zip(range(int(layout.centre[u][0]) + 1, int(layout.centre[v][0])),
                                         layout.lanes.get((u, v), []))
                      for p in ((x - half, y), (x + half, y))] for u, v in g.edges}

    def next_y(edge: tuple[str, str], towards: int) -> float:
        points = inner[edge]
        return points[0 if towards else -1][1] if points else layout.centre[edge[towards]][1]

    def spread(edges: list[tuple[str, str]], towards: int) -> dict[tuple[str, str], float]:
        edges = sorted(edges, key=lambda e: (-next_y(e, towards), -layout.centre[e[towards]][1]))
        step = 0.6 * _BOX_HEIGHT / max(len(edges), 1)
        return {e: (len(edges) - 1) / 2 * step - i * step for i, e in enumerate(edges)}

    leave: dict[tuple[str, str], float] = {}
    enter: dict[tuple[str, str], float] = {}
    for name in g:
        leave.update(spread(list(g.out_edges(name)), towards=1))
        enter.update(spread(list(g.in_edges(name)), towards=0))
    routes = {}
    for u, v in g.edges:
        (x0, y0), (x1, y1) = layout.centre[u], layout.centre[v]
        routes[u, v] = [(x0 + half, y0 + leave[u, v]), *inner[u, v], (x1 - half, y1 + enter[u, v])]
    return routes


def edge_crossings(nodes: Graph, inputs: Iterable[str] = ()) -> int:
    """How many times two edges cross in :func:`draw_levels`' drawing of ``nodes``.

    Two nodes that both feed the same two nodes force one crossing, whatever the order:

    >>> edge_crossings({"a": (None, ["x", "y"]), "b": (None, ["x", "y"])}, ["x", "y"])
    1
    """
    inputs = list(inputs) or sorted({d for _, deps in nodes.values() for d in deps if d not in nodes})
    segments = [(edge, p, q) for edge, route in _routes(_layout(nodes, inputs), to_networkx(nodes, inputs)).items()
                for p, q in itertools.pairwise(route)]
    return sum(e != f and _segments_cross(p, q, r, s) for (e, p, q), (f, r, s) in itertools.combinations(segments, 2))


def _segments_cross(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float],
                    s: tuple[float, float]) -> bool:
    """Whether segments p-q and r-s cross at a point inside both (segments that touch or overlap do not).

    >>> _segments_cross((0, 0), (2, 2), (0, 2), (2, 0)), _segments_cross((0, 0), (1, 0), (1, 0), (2, 1))
    (True, False)
    """
    def side(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    return side(r, s, p) * side(r, s, q) < -1e-12 and side(p, q, r) * side(p, q, s) < -1e-12


def _box(layout: _Layout, name: str) -> tuple[float, float, float, float]:
    """``(left, bottom, right, top)`` of a node's box."""
    x, y = layout.centre[name]
    return (x - layout.box_width / 2, y - _BOX_HEIGHT / 2, x + layout.box_width / 2, y + _BOX_HEIGHT / 2)


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
    (say, the critical path) whose nodes and edges are drawn in red.  Within
    each column the boxes are ordered so that edges cross as little as the
    sweeps of :func:`_layout` can make them (:func:`edge_crossings` counts
    what is left).  Every edge runs from the right side of its source's box
    to an arrowhead on the left side of its target's box; an edge that skips
    a level is routed through the free lanes between the boxes it passes, so
    it never runs through another node (each edge is a line with ``gid`` ``"edge:a->b"``,
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

    routes = _routes(layout, g)
    for u, v in g.edges:
        red = (u, v) in path_edges
        colour, width_pt = ("tab:red", 2.6) if red else ("0.55", 1.1)
        route = routes[u, v]
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


def plot_slots(
    start: Sequence[float] | np.ndarray,
    end: Sequence[float] | np.ndarray,
    slot: Sequence[int] | np.ndarray,
    *,
    title: str = "Slots over time",
    ax: Axes | None = None,
    unit: str = "steps",
    until: float | None = None,
    slots: int | None = None,
) -> Axes:
    """A Gantt chart of an engine's sequence slots: one row per slot, a bar per request, idle time hatched.

    Request ``i`` runs in slot ``slot[i]`` from ``start[i]`` to ``end[i]`` (in ``unit``); its number is written on
    its bar.  Whatever a slot does not run between 0 and ``until`` (default: the last end) is drawn hatched as
    idle.  ``slots`` rows are drawn (default: the highest slot used + 1).  Two slots, a request waiting for
    the first to free its slot:

    >>> ax = plot_slots(start=[0, 0, 3], end=[3, 5, 5], slot=[0, 1, 0], title="Two slots")
    >>> [t.get_text() for t in ax.get_yticklabels()], ax.get_xlabel(), ax.get_title()
    (['slot 0', 'slot 1'], 'time (steps)', 'Two slots')
    >>> [t.get_text() for t in ax.get_legend().get_texts()]
    ['running a request (its number on the bar)', 'slot idle']
    >>> plt.close(ax.figure)
    """
    start, end = np.asarray(start, dtype=float), np.asarray(end, dtype=float)
    where = np.asarray(slot)
    if not (start.shape == end.shape == where.shape) or start.ndim != 1 or len(start) == 0:
        raise ValueError(f"start, end and slot must be one value per request, got shapes {start.shape}, "
                         f"{end.shape}, {where.shape}")
    if where.dtype.kind not in "iu" or np.any(where < 0) or not np.all(np.isfinite(start + end)) or np.any(end < start):
        raise ValueError("each request needs a slot number >= 0 and finite times with start <= end")
    rows = int(where.max()) + 1 if slots is None else int(slots)
    if rows <= where.max():
        raise ValueError(f"slots={rows} but a request ran in slot {int(where.max())}")
    horizon = float(end.max()) if until is None else float(until)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 * rows + 1.4))
    for s in range(rows):
        mine = np.flatnonzero(where == s)
        mine = mine[np.argsort(start[mine])]
        if np.any(start[mine][1:] < end[mine][:-1]):
            raise ValueError(f"two requests overlap in slot {s}: a slot runs one request at a time")
        free = 0.0
        for i in mine:
            if start[i] > free:
                ax.barh(s, start[i] - free, left=free, color="0.93", edgecolor="0.6", hatch="//", linewidth=0.5)
            ax.barh(s, end[i] - start[i], left=start[i], color="tab:blue", edgecolor="black", linewidth=0.8)
            ax.text((start[i] + end[i]) / 2, s, str(i), ha="center", va="center", color="white", fontsize=9)
            free = max(free, end[i])
        if horizon > free:
            ax.barh(s, horizon - free, left=free, color="0.93", edgecolor="0.6", hatch="//", linewidth=0.5)
    ax.set_yticks(range(rows), [f"slot {s}" for s in range(rows)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("sequence slot")
    ax.set_title(title)
    ax.set_xlim(0, max(horizon, float(end.max())))
    handles = [Patch(facecolor="tab:blue", edgecolor="black", label="running a request (its number on the bar)"),
               Patch(facecolor="0.93", edgecolor="0.6", hatch="//", label="slot idle")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return ax
