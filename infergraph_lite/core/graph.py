"""The graph itself: node specs, validation, cycles, levels and the critical path.

A graph is the seed's shape, kept everywhere in the collection::

    nodes = {"pre": (str.strip, ["text"]), "model": (len, ["pre"])}

``name -> (func, [dependency names])``.  A dependency is either another node or
an *input*, a value handed to the executor.  This module only reasons about the
shape; it never calls ``func`` (a served graph puts a :class:`~infergraph_lite.core.stage.Stage`
there instead), and it imports nothing from the rest of the package at load time
(:meth:`Plan.run` reaches the executors when it is called).

:func:`prepare` validates a graph once and returns a :class:`Plan` (the order,
levels, dependents and in-degrees) that the executors, the simulator, the graph
server and the checkers all share.

Introduced in notebook 02 (validation, Kahn's algorithm, cycles, levels, the
Plan) and notebook 03 (critical path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Graph = Mapping[str, tuple[Any, Sequence[str]]]

__all__ = [
    "Countdown",
    "CycleError",
    "Graph",
    "GraphError",
    "InvalidNodeError",
    "MissingDependencyError",
    "MissingInputError",
    "NameConflictError",
    "Plan",
    "critical_path",
    "dependencies",
    "find_cycle",
    "levels",
    "prepare",
    "topological_order",
    "validate_graph",
]


class GraphError(ValueError):
    """Base of every problem with a graph's shape.

    A ``ValueError``, so the seed's ``except ValueError`` keeps working.
    """


class CycleError(GraphError):
    """The graph has a cycle; ``.cycle`` lists its nodes in data-flow order.

    Each node in ``.cycle`` is a dependency of the next, and the last is a
    dependency of the first (the same idea as :class:`graphlib.CycleError`).

    >>> err = CycleError(["a", "b"])
    >>> str(err), err.cycle
    ('cycle: a -> b -> a', ['a', 'b'])
    """

    def __init__(self, cycle: Sequence[str]):
        self.cycle = list(cycle)
        super().__init__("cycle: " + " -> ".join([*self.cycle, self.cycle[0]]))


class MissingDependencyError(GraphError):
    """A node depends on names that are neither nodes nor inputs.

    >>> str(MissingDependencyError("combine", ["modelC"]))
    "node 'combine' depends on 'modelC', which is neither a node nor an input"
    """

    def __init__(self, node: str, missing: Sequence[str]):
        self.node = node
        self.missing = list(missing)
        names = ", ".join(repr(m) for m in self.missing)
        which = "which is" if len(self.missing) == 1 else "which are"
        noun = "a node nor an input" if len(self.missing) == 1 else "nodes nor inputs"
        super().__init__(f"node {node!r} depends on {names}, {which} neither {noun}")


class NameConflictError(GraphError):
    """A name is used both for an input and for a node: which value would win?"""

    def __init__(self, name: str):
        self.node = name
        super().__init__(
            f"{name!r} is both an input and a node; rename one of them so every value has one source"
        )


class InvalidNodeError(GraphError):
    """A node entry is malformed (not ``(func, [deps])``, or a non-callable func)."""

    def __init__(self, node: object, problem: str):
        self.node = node
        super().__init__(f"node {node!r}: {problem}")


class MissingInputError(GraphError):
    """The graph reads inputs that were not given to the run.

    >>> str(MissingInputError(["text"]))
    "input 'text' was not given; the graph reads it"
    """

    def __init__(self, missing: Sequence[str]):
        self.missing = list(missing)
        names = ", ".join(repr(m) for m in self.missing)
        noun = "input" if len(self.missing) == 1 else "inputs"
        verb, pronoun = ("was", "it") if len(self.missing) == 1 else ("were", "them")
        super().__init__(f"{noun} {names} {verb} not given; the graph reads {pronoun}")


def _input_names(inputs: Iterable[str] | Mapping[str, Any]) -> frozenset[str]:
    # A mapping of input values or a plain collection of names both work.
    if isinstance(inputs, str):
        raise TypeError(f"inputs must be a collection of names, not the string {inputs!r}")
    return frozenset(inputs)


def _explain_entry(name: object, entry: object, require_callable: bool) -> None:
    # The slow path of prepare's entry check: raise the error that says what is wrong.
    if not isinstance(name, str):
        raise InvalidNodeError(name, f"node names must be strings, got {type(name).__name__}")
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        raise InvalidNodeError(name, f"expected (func, [dependency names]), got {entry!r}")
    func, deps = entry
    if isinstance(deps, str):
        raise InvalidNodeError(
            name, f"dependencies must be a list of names, got the string {deps!r}; write [{deps!r}]"
        )
    if not isinstance(deps, (list, tuple)):
        raise InvalidNodeError(name, f"dependencies must be a list of names, got {deps!r}")
    for dep in deps:
        if not isinstance(dep, str):
            raise InvalidNodeError(name, f"dependency names must be strings, got {dep!r}")
    if require_callable and not callable(func):
        raise InvalidNodeError(name, f"func must be callable, got {type(func).__name__} {func!r}")


class Plan:
    """A graph validated once and prepared to run many times (like :class:`graphlib.TopologicalSorter`).

    Made by :func:`prepare`.  It holds what every executor, checker and
    simulator needs, computed once: ``nodes`` (``name -> (func, deps)``,
    checked), ``inputs`` (the input names), ``order`` (Kahn's order, ties by
    the dict's order), ``levels`` (nodes that could run at the same time,
    sorted within a level), ``dependents`` (``name -> the nodes that use it``,
    once per listing) and ``in_degree`` (node dependencies per node, counted
    per listing, as Kahn's algorithm counts them).

    >>> plan = prepare({"pre": (str.strip, ["text"]), "n": (len, ["pre"]), "up": (str.upper, ["pre"])},
    ...                inputs=["text"])
    >>> plan.order, plan.levels
    (['pre', 'n', 'up'], [['pre'], ['n', 'up']])
    >>> plan.dependents["pre"], plan.in_degree["up"]
    (['n', 'up'], 1)

    Run it with :func:`~infergraph_lite.core.execute.run_plan` or
    :func:`~infergraph_lite.core.execute.run_plan_parallel`.
    """

    __slots__ = ("_generations", "_levels", "dependents", "in_degree", "inputs", "nodes", "order")

    def __init__(
        self,
        nodes: dict[str, tuple[Any, tuple[str, ...]]],
        inputs: frozenset[str],
        generations: list[list[str]],
        dependents: dict[str, list[str]],
        in_degree: dict[str, int],
    ):
        self.nodes = nodes
        self.inputs = inputs
        self.order = [name for generation in generations for name in generation]
        self.dependents = dependents
        self.in_degree = in_degree
        self._generations = generations
        self._levels: list[list[str]] | None = None  # sorted on first use: a one-shot run never needs them

    @property
    def levels(self) -> list[list[str]]:
        """The nodes that could run at the same time, level by level, sorted within a level."""
        if self._levels is None:
            self._levels = [sorted(generation) for generation in self._generations]
        return self._levels

    def __repr__(self) -> str:
        return f"Plan({len(self.nodes)} nodes, {len(self.levels)} levels, inputs={sorted(self.inputs)})"

    def dependencies(self, name: str) -> list[str]:
        """The node dependencies of ``name`` (inputs left out), each once, in the order listed."""
        return [d for d in dict.fromkeys(self.nodes[name][1]) if d in self.nodes]

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        """Raise if ``inputs`` lacks an input the graph reads, or gives a value for a node's name."""
        if not self.inputs <= inputs.keys():
            missing = sorted(self.inputs - inputs.keys())
            raise MissingInputError(missing)
        if not self.nodes.keys().isdisjoint(inputs):
            raise NameConflictError(next(name for name in inputs if name in self.nodes))

    def critical_path(self, durations: Mapping[str, float] | Callable[[str], float]) -> tuple[list[str], float]:
        """The longest path, weighting each node by its duration; see :func:`critical_path`."""
        return _critical_path(self, durations)


class Countdown:
    """One run's dependency countdown over a :class:`Plan`: which nodes become ready as others finish.

    Every executor that starts a node the moment its last dependency finishes (the thread-pool executor,
    :class:`~infergraph_lite.serving.graph_server.GraphServer` per request) counts down here.
    :meth:`first` gives the nodes that read only inputs; :meth:`done` marks a node finished and returns
    the nodes that just became ready (a dependency listed twice is counted, and released, twice, as in
    Kahn's algorithm).  Not thread-safe: one run's scheduler, or a caller holding a lock, drives it.

    >>> plan = prepare({"pre": (str.strip, ["text"]), "a": (len, ["pre"]), "b": (len, ["pre"]),
    ...                 "both": (max, ["a", "b"])}, inputs=["text"])
    >>> countdown = Countdown(plan)
    >>> countdown.first(), countdown.done("pre"), countdown.done("a"), countdown.done("b"), countdown.left
    (['pre'], ['a', 'b'], [], ['both'], 1)
    >>> countdown.done("a")
    Traceback (most recent call last):
    ...
    ValueError: node 'a' is already done in this run
    """

    __slots__ = ("_dependents", "_finished", "_first", "_waiting")

    def __init__(self, plan: Plan):
        self._waiting = dict(plan.in_degree)  # unfinished node dependencies per node, used up as they finish
        self._dependents = plan.dependents
        self._first = plan._generations[0] if plan._generations else []
        self._finished: set[str] = set()

    def first(self) -> list[str]:
        """The nodes that need only inputs, in the plan's order: they can start at once."""
        return list(self._first)

    @property
    def left(self) -> int:
        """How many nodes are not done yet."""
        return len(self._waiting) - len(self._finished)

    def done(self, name: str) -> list[str]:
        """Mark ``name`` finished; return its dependents whose last unfinished dependency it was."""
        if name in self._finished or name not in self._waiting:
            raise ValueError(f"node {name!r} is already done in this run" if name in self._finished
                             else f"node {name!r} is not a node of this plan")
        self._finished.add(name)
        waiting, ready = self._waiting, []
        for child in self._dependents[name]:
            waiting[child] -= 1
            if not waiting[child]:
                ready.append(child)
        return ready


def prepare(
    nodes: Graph, inputs: Iterable[str] | Mapping[str, Any] = (), *, require_callable: bool = True
) -> Plan:
    """Validate a graph completely, once, and return the :class:`Plan` every executor runs.

    Checks, in this order, so the first message is the most basic problem:
    every entry is ``(func, [names])`` (and ``func`` is callable unless
    ``require_callable=False``, as for a graph of stage specs), no name is both
    an input and a node, every dependency is a node or an input, and there is
    no cycle.  Nothing is run.  O(V + E).

    >>> prepare({"a": (len, ["b"]), "b": (len, ["a"])})
    Traceback (most recent call last):
    ...
    infergraph_lite.core.graph.CycleError: cycle: a -> b -> a
    """
    # One pass checks each entry and counts its node dependencies; Kahn's algorithm then finds the order
    # and, by leaving nodes unreached, any cycle (the depth-first search runs only then, to name one).
    if not isinstance(nodes, Mapping):
        raise TypeError(f"nodes must be a mapping name -> (func, [deps]), got {type(nodes).__name__}")
    input_names = _input_names(inputs)
    dependents: dict[str, list[str]] = {name: [] for name in nodes}
    users_of = dependents.get
    in_degree: dict[str, int] = {}
    graph: dict[str, tuple[Any, tuple[str, ...]]] = {}
    first_missing = None
    try:
        for name, entry in nodes.items():
            # The common, well-formed entry is checked inline (this loop is every one-shot run's start-up cost);
            # anything unusual goes to _explain_entry, which says what is wrong.
            if not (type(entry) is tuple and len(entry) == 2 and type(name) is str
                    and type(entry[1]) in (list, tuple) and (not require_callable or callable(entry[0]))):
                _explain_entry(name, entry, require_callable)
            func, deps = entry
            count = 0
            for dep in deps:
                users = users_of(dep)
                if users is not None:
                    users.append(name)  # a dependency listed twice is counted, and released, twice
                    count += 1
                elif first_missing is None and dep not in input_names:
                    first_missing = name  # explained once every entry is known to be well formed
            graph[name] = (func, deps if type(deps) is tuple else tuple(deps))
            in_degree[name] = count
    except TypeError:  # an unhashable dependency name: say which node, and what is wrong with it
        _explain_entry(name, entry, require_callable)
        raise
    if first_missing is not None:
        _explain_entry(first_missing, nodes[first_missing], require_callable)  # a name that is no string?
    if not input_names.isdisjoint(graph):
        raise NameConflictError(next(name for name in graph if name in input_names))
    if first_missing is not None:
        deps = graph[first_missing][1]
        missing = [d for d in dict.fromkeys(deps) if d not in graph and d not in input_names]
        raise MissingDependencyError(first_missing, missing)
    generations = _kahn_generations(dict(in_degree), dependents)
    if sum(map(len, generations)) != len(graph):
        cycle = find_cycle(graph)
        assert cycle is not None, "Kahn's algorithm left nodes unreached, so a cycle must exist"
        raise CycleError(cycle)
    return Plan(graph, input_names, generations, dependents, in_degree)


def validate_graph(
    nodes: Graph,
    inputs: Iterable[str] | Mapping[str, Any] = (),
    *,
    require_callable: bool = True,
) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """Check a graph completely and return it normalised to ``name -> (func, deps)``.

    The checks of :func:`prepare`; use :func:`prepare` to keep the order too.

    >>> validate_graph({"double": (lambda x: 2 * x, ["x"])}, inputs={"x": 1})["double"][1]
    ('x',)
    """
    return prepare(nodes, inputs, require_callable=require_callable).nodes


def dependencies(nodes: Graph, name: str) -> list[str]:
    """The node dependencies of ``name`` (inputs left out), each once, in order.

    >>> dependencies({"a": (len, ["x"]), "b": (len, ["a", "x", "a"])}, "b")
    ['a']
    """
    return [d for d in dict.fromkeys(nodes[name][1]) if d in nodes]


def find_cycle(nodes: Graph) -> list[str] | None:
    """Return the nodes of one cycle in data-flow order, or ``None`` if there is none.

    Each returned node is a dependency of the next one, and the last is a
    dependency of the first.  The cycle is rotated to start at its smallest
    name, so the answer does not depend on dict order.  Dependencies that are
    not nodes (inputs) are ignored.  Iterative depth-first search: O(V + E),
    and no recursion limit on long chains.

    >>> find_cycle({"a": (len, ["c"]), "b": (len, ["a"]), "c": (len, ["b"])})
    ['a', 'b', 'c']
    >>> find_cycle({"a": (len, ["x"]), "b": (len, ["a"])}) is None
    True
    """
    on_path: dict[str, int] = {}  # node -> its index in `path`, while being explored
    done: set[str] = set()
    for root in nodes:
        if root in done:
            continue
        path = [root]
        on_path[root] = 0
        stack = [iter(nodes[root][1])]
        while stack:
            dep = next(stack[-1], None)
            if dep is None:
                finished = path.pop()
                del on_path[finished]
                done.add(finished)
                stack.pop()
            elif dep in on_path:
                # path[i] depends on path[i+1]; reverse to get data-flow order.
                cycle = path[on_path[dep]:][::-1]
                start = cycle.index(min(cycle))
                return cycle[start:] + cycle[:start]
            elif dep in nodes and dep not in done:
                on_path[dep] = len(path)
                path.append(dep)
                stack.append(iter(nodes[dep][1]))
    return None


def topological_order(nodes: Graph, inputs: Iterable[str] | Mapping[str, Any] = ()) -> list[str]:
    """Kahn's algorithm: every node after all its dependencies, in O(V + E).

    Ties are broken by the order of ``nodes``, so the result is deterministic.
    Raises the same errors as :func:`prepare`.

    >>> topological_order({"c": (len, ["a", "b"]), "b": (len, ["a"]), "a": (len, ["x"])}, ["x"])
    ['a', 'b', 'c']
    """
    return prepare(nodes, inputs, require_callable=False).order


def _kahn_generations(waiting: dict[str, int], dependents: Mapping[str, list[str]]) -> list[list[str]]:
    # Kahn's algorithm, one generation at a time.  `waiting` counts each node's
    # unfinished node dependencies; a node joins the next generation when its
    # last one is taken out.  (`waiting` is used up.)
    generation = [name for name, count in waiting.items() if count == 0]
    generations = []
    while generation:
        generations.append(generation)
        following = []
        for name in generation:
            for child in dependents[name]:
                left = waiting[child] - 1
                waiting[child] = left
                if not left:
                    following.append(child)
        generation = following
    return generations


def levels(nodes: Graph, inputs: Iterable[str] | Mapping[str, Any] = ()) -> list[list[str]]:
    """Topological generations: the nodes that could run in parallel, level by level.

    Level 0 holds the nodes that need only inputs; a node's level is one more
    than the highest level among its node dependencies.  Names are sorted
    within a level.  Raises the errors of :func:`prepare`.

    >>> nodes = {
    ...     "pre": (str.strip, ["text"]),
    ...     "modelA": (len, ["pre"]),
    ...     "modelB": (len, ["pre"]),
    ...     "combine": (max, ["modelA", "modelB"]),
    ... }
    >>> levels(nodes, inputs=["text"])
    [['pre'], ['modelA', 'modelB'], ['combine']]
    """
    return prepare(nodes, inputs, require_callable=False).levels


def critical_path(
    nodes: Graph | Plan, durations: Mapping[str, float] | Callable[[str], float]
) -> tuple[list[str], float]:
    """The longest path through the graph, weighting each node by its duration.

    No schedule, however many workers, finishes sooner than ``total``: it is
    the latency floor of parallel execution.  ``durations`` maps every node to
    a non-negative time (or is a function of the node's name).  Dependencies
    that are not nodes are inputs, ready at time 0.  Ties go to the
    alphabetically smaller predecessor, so the answer is deterministic.

    >>> nodes = {"pre": (None, ["text"]), "a": (None, ["pre"]), "b": (None, ["pre"]),
    ...          "combine": (None, ["a", "b"])}
    >>> critical_path(nodes, {"pre": 1.0, "a": 5.0, "b": 2.0, "combine": 1.0})
    (['pre', 'a', 'combine'], 7.0)
    """
    if not isinstance(nodes, Plan):
        inputs = {d for _, deps in nodes.values() for d in deps if d not in nodes}
        nodes = prepare(nodes, inputs, require_callable=False)
    return _critical_path(nodes, durations)


def _critical_path(
    plan: Plan, durations: Mapping[str, float] | Callable[[str], float]
) -> tuple[list[str], float]:
    finish: dict[str, float] = {}
    best_predecessor: dict[str, str | None] = {}
    for name in plan.order:
        if callable(durations):
            duration = durations(name)
        elif name in durations:
            duration = durations[name]
        else:
            raise ValueError(f"durations has no entry for node {name!r}")
        if not duration >= 0:  # also rejects NaN
            raise ValueError(f"duration of node {name!r} must be >= 0, got {duration!r}")
        deps = sorted(plan.dependencies(name))
        before = max(deps, key=lambda d: finish[d], default=None)
        best_predecessor[name] = before
        finish[name] = (finish[before] if before is not None else 0.0) + float(duration)
    if not finish:
        return [], 0.0
    end = max(sorted(finish), key=finish.__getitem__)
    path = [end]
    while (before := best_predecessor[path[-1]]) is not None:
        path.append(before)
    return path[::-1], finish[end]
