"""Exercise checkers: each runs a learner's answer and says, specifically, what is right or wrong.

A checker never raises into the notebook.  It returns :class:`Feedback`:
``Correct``, ``Not right yet`` with the reason, or ``Not done yet`` while the
exercise still holds its stub; a coloured box in JupyterLab, one line in a
terminal.

Used by the notebooks in exercises/ and solutions/.
"""

from __future__ import annotations

import html
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes
from infergraph_lite.core.execute import run_graph
from infergraph_lite.core.graph import critical_path, levels
from infergraph_lite.simulation.queue import simulate_batching
from infergraph_lite.core.stage import capacity
from infergraph_lite.frameworks.triton import TritonConfigError, ensemble_to_graph, parse_pbtxt

__all__ = [
    "Feedback",
    "Status",
    "check_add_postprocess",
    "check_batch_sizes_greedy",
    "check_batching_capacity",
    "check_best_node_to_speed_up",
    "check_confidence_gate",
    "check_fewest_replicas",
    "check_find_cycle_nodes",
    "check_missing_dependencies",
    "check_modelC",
    "check_parallel_speedup_bound",
    "check_run_asap_parallel",
    "check_run_graph_with_levels",
    "check_run_only_needed",
    "check_triton_ensemble",
    "check_variability_penalty",
    "check_window_tradeoff",
    "parse_pbtxt",
]

Status = Literal["correct", "wrong", "not done"]
"""A checker's verdict: the answer is right, wrong, or still the exercise's stub."""

_LOOK: dict[str, tuple[str, str, str, str]] = {  # status -> (label, symbol, border colour, background)
    "correct": ("Correct", "\u2714", "#2e7d32", "#e8f5e9"),
    "wrong": ("Not right yet", "\u2718", "#c62828", "#ffebee"),
    "not done": ("Not done yet", "\u270e", "#8d6e00", "#fff8e1"),
}


@dataclass(frozen=True)
class Feedback:
    """The verdict on one exercise, as the check cell shows it.

    In JupyterLab it renders as a coloured box (green *Correct*, red *Not
    right yet*, amber *Not done yet*) whose text wraps between words; in a
    terminal, its repr is one plain line.

    >>> Feedback("wrong", "b ran before a.")
    Not right yet: b ran before a.
    >>> Feedback("correct", "well done.").passed
    True
    """

    status: Status
    message: str

    def __post_init__(self) -> None:
        if self.status not in _LOOK:
            raise ValueError(f"status must be one of {sorted(_LOOK)}, got {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status == "correct"

    @property
    def label(self) -> str:
        """``Correct``, ``Not right yet`` or ``Not done yet``."""
        return _LOOK[self.status][0]

    def __repr__(self) -> str:
        return f"{self.label}: {self.message}"

    def _repr_html_(self) -> str:
        label, symbol, border, background = _LOOK[self.status]
        # Wrap only between words (no hyphenation, no breaking inside a word); dark text on a light fill, so the
        # box reads the same under JupyterLab's light and dark themes.
        style = (f"border-left: 6px solid {border}; background: {background}; color: #1a1a1a; padding: 0.5em 0.9em; "
                 "border-radius: 4px; margin: 0.2em 0; max-width: 60em; line-height: 1.45; white-space: normal; "
                 "word-break: normal; overflow-wrap: normal; hyphens: none; font-family: sans-serif")
        return (f'<div class="infergraph-feedback infergraph-{self.status.replace(" ", "-")}" style="{style}">'
                f'<strong style="color: {border}">{symbol} {label}</strong> &mdash; {html.escape(self.message)}</div>')


class _Wrong(Exception):
    """Raised inside a checker to report a wrong answer."""


def _checker(func: Callable[..., str]) -> Callable[..., Feedback]:
    # Turn a check that returns a success message (or raises _Wrong) into one that returns Feedback,
    # whatever the learner's code does.
    def wrapper(*args: Any, **kwargs: Any) -> Feedback:
        try:
            return Feedback("correct", func(*args, **kwargs))
        except NotImplementedError as stub:
            hint = f" Hint: {stub}" if str(stub) else ""
            return Feedback("not done", f"replace the NotImplementedError stub with your answer.{hint}")
        except _Wrong as wrong:
            return Feedback("wrong", str(wrong))
        except Exception as exc:  # noqa: BLE001 - a learner's bug is feedback, not a crash
            return Feedback("wrong", f"your code raised {type(exc).__name__}: {exc}")

    wrapper.__name__, wrapper.__doc__ = func.__name__, func.__doc__
    return wrapper


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise _Wrong(message)


# --- 01 · Inference is a pipeline -------------------------------------------------------------------


@_checker
def check_add_postprocess(add_postprocess: Callable[[dict], dict]) -> str:
    """Exercise 01.1: a ``postprocess`` node after ``combine`` that formats ``'len=6 a_count=3'``."""
    original = banana_nodes()
    before = dict(original)
    nodes = add_postprocess(original)
    _expect(original == before, "add_postprocess changed the graph it was given; return a new dict instead")
    _expect(isinstance(nodes, dict) and "postprocess" in nodes, "the returned graph has no 'postprocess' node")
    deps = list(nodes["postprocess"][1])
    _expect(deps == ["combine"], f"postprocess should depend on ['combine'] only, not {deps}")
    _expect(set(nodes) == set(before) | {"postprocess"}, "keep every original node, and add only postprocess")
    out = run_graph(nodes, BANANA_INPUTS)["postprocess"]
    _expect(out == "len=6 a_count=3", f"for '  BANANA  ' postprocess returned {out!r}, "
                                      "expected 'len=6 a_count=3'")
    other = run_graph(nodes, {"text": "Alfalfa"})["postprocess"]
    _expect(other == "len=7 a_count=3", f"for 'Alfalfa' it returned {other!r}: compute from combine, don't hard-code")
    return "postprocess runs after combine and formats its dict."


@_checker
def check_modelC(add_vowel_model: Callable[[dict], dict]) -> str:
    """Exercise 01.2: a third model counting vowels, beside modelA and modelB, fed into combine."""
    nodes = add_vowel_model(banana_nodes())
    _expect("modelC" in nodes, "there is no 'modelC' node")
    _expect(list(nodes["modelC"][1]) == ["pre"], f"modelC should depend on ['pre'] only (to run beside A and B), "
                                                 f"not {list(nodes['modelC'][1])}")
    _expect(set(nodes["combine"][1]) == {"modelA", "modelB", "modelC"}, "combine should use modelA, modelB and modelC")
    _expect(levels(nodes, BANANA_INPUTS)[1] == ["modelA", "modelB", "modelC"],
            "modelA, modelB and modelC should share a level")
    out = run_graph(nodes, BANANA_INPUTS)["combine"]
    _expect(out == {"len": 6, "a_count": 3, "vowels": 3}, f"combine gave {out}, expected "
                                                         "{'len': 6, 'a_count': 3, 'vowels': 3}")
    out = run_graph(nodes, {"text": " Queue "})["combine"]
    _expect(out.get("vowels") == 4, f"'Queue' has 4 vowels (u, e, u, e) but modelC said {out.get('vowels')}")
    return "three models in one level, combined."


@_checker
def check_confidence_gate(add_gate: Callable[[dict], dict]) -> str:
    """Exercise 01.3: ``needs_review`` is True when topic or sentiment confidence is below 0.6."""

    def fake_model(label: str, confidence: float) -> Callable[[Any], dict]:
        return lambda _: {"label": label, "confidence": confidence}

    def pipeline(topic_conf: float, sentiment_conf: float) -> dict:
        return {"topic": (fake_model("food", topic_conf), ["text"]),
                "sentiment": (fake_model("positive", sentiment_conf), ["text"])}

    nodes = add_gate(pipeline(0.9, 0.9))
    _expect("needs_review" in nodes, "there is no 'needs_review' node")
    _expect(sorted(nodes["needs_review"][1]) == ["sentiment", "topic"],
            f"needs_review should depend on topic and sentiment, not {list(nodes['needs_review'][1])}")
    cases = [((0.9, 0.9), False), ((0.5, 0.9), True), ((0.9, 0.59), True), ((0.6, 0.6), False), ((0.2, 0.3), True)]
    for (t, s), expected in cases:
        got = run_graph(add_gate(pipeline(t, s)), {"text": "x"})["needs_review"]
        _expect(got is expected, f"with topic confidence {t} and sentiment confidence {s}, needs_review was {got!r}, "
                                 f"expected {expected} (review when either is below 0.6)")
    return "low-confidence answers are flagged for review."


# --- 02 · A DAG executor ------------------------------------------------------------------------------

_SHAPES = {
    "diamond": ({"a": (None, ["x"]), "b": (None, ["a"]), "c": (None, ["a"]), "d": (None, ["b", "c"])}, ["x"]),
    "skip edge": ({"a": (None, ["x"]), "b": (None, ["a"]), "c": (None, ["a", "b"]), "e": (None, ["x"])}, ["x"]),
    "chain listed backwards": ({"c": (None, ["b"]), "b": (None, ["a"]), "a": (None, ["x"])}, ["x"]),
}


def _runnable(shape: dict) -> dict:
    return {name: (lambda *args, _n=name: (_n, args), deps) for name, (_, deps) in shape.items()}


@_checker
def check_run_graph_with_levels(run_graph_with_levels: Callable[[dict, dict], tuple[dict, list]]) -> str:
    """Exercise 02.1: run a graph and record which nodes could have run in parallel (its levels)."""
    for label, (shape, inputs) in _SHAPES.items():
        nodes, values = _runnable(shape), dict.fromkeys(inputs, 0)
        results, found = run_graph_with_levels(nodes, values)
        _expect(results == run_graph(nodes, values), f"on the {label} graph the results are wrong")
        expected = levels(nodes, values)
        found = [sorted(level) for level in found]
        _expect(found == expected, f"on the {label} graph you found levels {found}, expected {expected}: a node's "
                                   "level is one more than its *deepest* dependency's")
    return "results and levels both match."


_CYCLIC = {
    "self-loop": {"a": (None, ["a"])},
    "3-cycle with a tail in and out": {"in": (None, []), "a": (None, ["in", "c"]), "b": (None, ["a"]),
                                       "c": (None, ["b"]), "out": (None, ["c"])},
    "two separate cycles": {"p": (None, ["q"]), "q": (None, ["p"]), "r": (None, ["s"]), "s": (None, ["r"])},
}


@_checker
def check_find_cycle_nodes(find_cycle_nodes: Callable[[dict], list[str] | None]) -> str:
    """Exercise 02.2: report the nodes of one cycle, in data-flow order (any starting node)."""
    for label, (shape, _) in _SHAPES.items():
        _expect(find_cycle_nodes(shape) is None, f"the {label} graph has no cycle, but you returned "
                                                 f"{find_cycle_nodes(shape)!r}")
    for label, nodes in _CYCLIC.items():
        cycle = find_cycle_nodes(nodes)
        if not isinstance(cycle, list) or not cycle:
            raise _Wrong(f"the {label} graph has a cycle, but you returned {cycle!r}")
        _expect(len(set(cycle)) == len(cycle), f"on the {label} graph {cycle} repeats a node; list each once")
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            _expect(b in nodes and a in nodes[b][1],
                    f"on the {label} graph {cycle} is not a cycle in data-flow order: {b!r} does not depend on "
                    f"{a!r} (nodes that only lead into or out of a cycle are not part of it)")
    return "cycles found and reported in data-flow order; DAGs pass."


@_checker
def check_missing_dependencies(missing_dependencies: Callable[[dict, Any], dict]) -> str:
    """Exercise 02.3: every missing dependency of every node at once."""
    nodes = {"a": (None, ["x", "typo"]), "b": (None, ["a", "modelC", "typo"]), "c": (None, ["a"])}
    found = missing_dependencies(nodes, ["x"])
    expected = {"a": ["typo"], "b": ["modelC", "typo"]}
    _expect(found == expected, f"found {found}, expected {expected}: report every node with missing names, each "
                               "name once in the order listed; inputs and other nodes are not missing")
    _expect(missing_dependencies(banana_nodes(), BANANA_INPUTS) == {}, "the seed graph with its input misses nothing")
    return "every missing name reported at once."


@_checker
def check_run_only_needed(run_only_needed: Callable[[dict, Mapping[str, Any], list], dict]) -> str:
    """Exercise 02.4 (stretch): compute only what the wanted outputs need."""
    calls: list[str] = []

    def spy(name: str, func: Callable) -> Callable:
        def wrapped(*args: Any) -> Any:
            calls.append(name)
            return func(*args)
        return wrapped

    nodes = {name: (spy(name, func), deps) for name, (func, deps) in banana_nodes().items()}
    got = run_only_needed(nodes, BANANA_INPUTS, ["modelA"])
    _expect(got.get("modelA") == 6, f"modelA should be 6, got {got.get('modelA')!r}")
    _expect(sorted(calls) == ["modelA", "pre"],
            f"to get modelA only pre and modelA need to run, but {sorted(calls)} ran")
    calls.clear()
    got = run_only_needed(nodes, BANANA_INPUTS, ["combine"])
    _expect(got.get("combine") == {"len": 6, "a_count": 3} and len(calls) == 4 and len(set(calls)) == 4,
            f"for combine every node runs exactly once; ran {calls}")
    return "only the needed nodes ran, each once."


# --- 03 · Parallel execution ---------------------------------------------------------------------------


@_checker
def check_parallel_speedup_bound(parallel_speedup_bound: Callable[[dict, dict], float]) -> str:
    """Exercise 03.1: the best speed-up parallelism can give: sum of durations / critical path."""
    for label, (shape, _) in _SHAPES.items():
        durations = {name: float(i + 1) for i, name in enumerate(sorted(shape))}
        expected = sum(durations.values()) / critical_path(shape, durations)[1]
        got = parallel_speedup_bound(shape, durations)
        _expect(math.isclose(got, expected), f"on the {label} graph you said {got}, expected {expected:.4g}: "
                                             "sequential time divided by the critical path's")
    return "speed-up bounds match."


@_checker
def check_run_asap_parallel(run_asap_parallel: Callable[[dict, dict, int], dict]) -> str:
    """Exercise 03.2: an as-soon-as-possible thread executor (each node starts when its own inputs are ready).

    No fixed time limit: whether nodes overlapped, and when each started, is read from when each ran;
    the answer's run is compared with a sequential run of the same graph measured here, in the same process.
    """
    stamps: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def timed(name: str, seconds: float) -> Callable:
        def work(*_: Any) -> str:
            start = time.perf_counter()
            time.sleep(seconds)
            with lock:
                stamps[name] = (start, time.perf_counter())
            return name
        return work

    nodes = {"fast": (timed("fast", 0.01), []), "slow": (timed("slow", 0.12), []), "slow2": (timed("slow2", 0.12), []),
             "after_fast": (timed("after_fast", 0.01), ["fast"]),
             "end": (timed("end", 0.0), ["after_fast", "slow", "slow2"])}
    started = time.perf_counter()
    run_graph(nodes, {})
    sequential = time.perf_counter() - started
    stamps.clear()
    started = time.perf_counter()
    results = run_asap_parallel(nodes, {}, 4)
    elapsed = time.perf_counter() - started
    _expect(results == {name: name for name in nodes}, "the results are wrong: each node returns its own name")
    _expect(set(stamps) == set(nodes), f"these nodes never ran: {sorted(set(nodes) - set(stamps))}")
    (a0, a1), (b0, b1) = stamps["slow"], stamps["slow2"]
    _expect(a0 < b1 and b0 < a1, "slow and slow2 (both ready at the start) ran one after the other: nodes that are "
                                 "ready at the same time should run at the same time, on the pool's threads")
    for name, (_, deps) in nodes.items():
        for dep in deps:
            _expect(stamps[name][0] >= stamps[dep][1], f"{name} started before its input {dep} had finished")
    _expect(stamps["after_fast"][0] < min(a1, b1),
            "after_fast waited for slow and slow2, although it needs only fast: start each node as soon as its own "
            "inputs are ready, not when its whole level is done (that is the level-by-level executor of the lesson)")
    # Overlapped, the graph takes about half its sequential time (0.13 s of 0.26 s); 0.8 leaves room for a busy machine.
    _expect(elapsed < 0.8 * sequential, f"took {elapsed:.2f} s against {sequential:.2f} s run sequentially here: the "
                                        "nodes should run at the same time")
    return "each node starts as soon as its inputs are ready, and independent nodes overlap."


@_checker
def check_best_node_to_speed_up(best_node_to_speed_up: Callable[[dict, dict], str]) -> str:
    """Exercise 03.3 (stretch): which node, made twice as fast, shortens the critical path most?"""
    nodes = {"pre": (None, ["x"]), "a": (None, ["pre"]), "b": (None, ["pre"]), "post": (None, ["a", "b"])}
    cases: list[dict[str, float]] = [
        {"pre": 4, "a": 10, "b": 9.5, "post": 1},  # halving a leaves b's path nearly as long: pre is on both
        {"pre": 1, "a": 10, "b": 2, "post": 1},
        {"pre": 1, "a": 3, "b": 2, "post": 8},
    ]
    for durations in cases:
        after = {name: critical_path(nodes, {**durations, name: durations[name] / 2})[1] for name in nodes}
        best = sorted(name for name, total in after.items() if total == min(after.values()))
        got = best_node_to_speed_up(nodes, durations)
        if got not in best:
            raise _Wrong(f"with durations {durations} you chose {got!r} (critical path {after.get(got)}), but halving "
                         f"{best[0]!r} gives {after[best[0]]}: the longest node is not always the answer, a shorter "
                         "one may sit on every long path")
    return "the best node to optimise, every time."


# --- 04 · Latency and throughput ------------------------------------------------------------------------


@_checker
def check_fewest_replicas(fewest_replicas: Callable[[float, float, float], int]) -> str:
    """Exercise 04.2: the fewest replicas whose simulated p99 meets a target.

    The answer rests on a simulated p99, which moves a little with the seed; any count that is the
    fewest for one of several seeds is accepted, so a correct answer with another seed is not refused.
    """
    def fewest(rate: float, service: float, target: float, seed: int) -> int:
        return next(r for r in range(1, 50) if rate * service / r < 1 and simulate_batching(
            rate, service, replicas=r, n_requests=20_000, seed=seed).percentile(99) <= target)

    for rate, service, target in [(0.25, 10.0, 40.0), (0.5, 10.0, 25.0), (0.05, 10.0, 60.0)]:
        got = fewest_replicas(rate, service, target)
        answers = {fewest(rate, service, target, seed) for seed in range(4)}
        low, high = min(answers), max(answers)
        expected = f"{low}" if low == high else f"{low} to {high}, depending on the seed"
        _expect(isinstance(got, (int, np.integer)) and low <= got <= high,
                f"for {rate} requests/ms, {service} ms service and p99 <= {target} ms you said {got!r} replicas, "
                f"the simulation says {expected} (capacity alone is not enough: the tail needs headroom)")
    return "fleet sized by the tail, not by the average."


@_checker
def check_variability_penalty(variability_penalty: Callable[[float], float]) -> str:
    """Exercise 04.1: how many times longer the mean *wait* is with exponential than fixed service."""
    for load in (0.3, 0.6, 0.9):
        got = variability_penalty(load)
        _expect(math.isclose(got, 2.0, rel_tol=1e-9), f"at load {load} you said {got}; Pollaczek-Khinchine's E[S^2] "
                                                       "is 2s^2 for exponential and s^2 for fixed service, so the wait "
                                                       "ratio is exactly 2 at every load (latency adds s to both)")
    return "exactly 2 at every load: variability, not the mean, makes the wait."


@_checker
def check_fanout_median(fanout_median: Callable[[int, float], float]) -> str:
    """Exercise 04.3 (stretch): the median latency of a page that waits for ``k`` independent 10 ms M/D/1 calls."""
    for k, load in [(1, 0.5), (10, 0.5), (100, 0.5), (100, 0.8)]:
        latencies = simulate_batching(load / 10.0, 10.0, n_requests=200_000, seed=99).latencies
        expected = float(np.quantile(latencies, 0.5 ** (1 / k)))  # P(max of k <= x) = F(x)^k = 1/2
        got = fanout_median(k, load)
        _expect(isinstance(got, (int, float, np.integer, np.floating)) and math.isfinite(got),
                f"return the median latency in ms as a number, got {got!r}")
        single_median = float(np.median(latencies))
        hint = (" - that is one call's median: the page waits for the slowest of its calls"
                if k > 1 and abs(got - single_median) < 0.05 * single_median else
                ": the page is done when all k calls are, so P(page <= x) = P(one call <= x) ** k")
        _expect(abs(got - expected) <= 0.1 * expected,
                f"for k={k} calls at load {load} you said {got:.1f} ms, the simulation gives about "
                f"{expected:.1f} ms{hint}")
    return "the median page waits as long as one call's p99.3 when it fans out to 100: the tail becomes the norm."


# --- 05 · Dynamic batching ----------------------------------------------------------------------------


@_checker
def check_batching_capacity(batching_capacity: Callable[[float, float, int], float]) -> str:
    """Exercise 05.1: requests per ms a server can finish with full batches of b, s(b) = alpha + beta b."""
    for alpha, beta, b in [(2.0, 0.15, 32), (1.0, 1.0, 1), (5.0, 0.01, 128)]:
        got = batching_capacity(alpha, beta, b)
        expected = capacity((alpha, beta), b)
        _expect(math.isclose(got, expected), f"for alpha={alpha}, beta={beta}, b={b} you said {got:.4g}, expected "
                                             f"{expected:.4g}: b requests every alpha + beta*b ms")
    return "b / s(b)."


@_checker
def check_batch_sizes_greedy(batch_sizes_greedy: Callable[[list[float], float, float], list[int]]) -> str:
    """Exercise 05.3 (stretch): greedy batching by hand: the size of each batch."""
    for seed in range(3):
        arrivals = np.random.default_rng(seed).exponential(1.0, 300).cumsum().tolist()
        r = simulate_batching(None, (1.0, 0.5), None, 0.0, arrivals=arrivals, warmup=0.0)
        expected = r.batches_size.tolist()
        got = list(batch_sizes_greedy(arrivals, 1.0, 0.5))
        _expect(sum(got) == len(arrivals), f"your batches hold {sum(got)} requests, but {len(arrivals)} arrived")
        if got != expected:
            first = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
            mine = got[first] if first < len(got) else "no"
            raise _Wrong(f"batch {first} has {mine} requests, the policy gives {expected[first]}: a free server "
                         "takes everything that has arrived by the moment it starts")
    return "your greedy batcher matches the simulator batch for batch."


@_checker
def check_window_tradeoff(window_tradeoff: Callable[[list[float]], dict]) -> str:
    """Exercise 05.2: mean latency and mean batch size at low and high load, for each window."""
    windows = [0.0, 2.0, 8.0]
    table = window_tradeoff(windows)
    _expect(sorted(table) == windows, f"return one entry per window {windows}, got {sorted(table)}")
    low = [table[w]["low"] for w in windows]
    high = [table[w]["high"] for w in windows]
    _expect(all(a["latency"] < b["latency"] for a, b in itertools.pairwise(low)),
            "at low load, a longer window should mean a higher mean latency (requests wait it out)")
    _expect(all(a["batch"] <= b["batch"] for a, b in itertools.pairwise(low)),
            "a longer window should give batches at least as large")
    _expect(max(h["latency"] for h in high) / min(h["latency"] for h in high) < 1.5,
            "at high load the windows should matter little: the queue fills batches by itself")
    return "the trade-off, measured: windows cost latency at low load and barely matter near capacity."


@_checker
def check_triton_ensemble(config: str | Callable[[], str]) -> str:
    """Exercise 05.4: a Triton ensemble config for the seed's two-model graph, its data flow checked.

    Takes the config text, or the function that returns it (called here, so a stub reads "not done").
    """
    config_text = config() if callable(config) else config
    if not config_text.strip():
        raise NotImplementedError("write the config.pbtxt of the ensemble as a string")
    try:  # Triton's own schema, then the steps' data flow as a graph (graph.py: missing tensors, cycles)
        graph = ensemble_to_graph(config_text)
    except TritonConfigError as err:
        raise _Wrong(str(err)) from None
    _expect(len(graph.nodes) >= 3, f"expected steps for pre, two models and combine; found {len(graph.nodes)}")
    parallel = next((level for level in graph.levels if len(level) >= 2), None)
    order = " -> ".join(level[0] for level in graph.levels)
    _expect(parallel is not None, f"the steps run strictly one after another ({order}); the two models should "
                                  "both read the preprocessed tensor, so they can run in parallel")
    return f"a valid ensemble: {len(graph.nodes)} steps in {len(graph.levels)} waves; {parallel} run in parallel."


# --- 06 · Serving the whole graph -------------------------------------------------------------------------
# (imports local to this section, so the sections of other lessons stay independent)

from functools import cache  # noqa: E402

from infergraph_lite.simulation.planning import brute_force_plan  # noqa: E402
from infergraph_lite.simulation.queue import UnstableLoadError  # noqa: E402
from infergraph_lite.simulation.graph import simulate_graph  # noqa: E402
from infergraph_lite.core.stage import Exponential, Stage, mean_service_time  # noqa: E402

__all__ += ["check_batching_plan", "check_fanout_p99", "check_fix_bottleneck"]

_MAX_LOAD_06 = 0.8


def _bottleneck_scenarios() -> list[tuple[dict[str, tuple[Stage, list[str]]], float]]:
    # Graphs where the slowest stage per request is not the least capable one, where fixing the bottleneck
    # exposes another stage above 80 %, and where replicas were given generously.
    example = {
        "pre": (Stage(service_time=0.4), ["request"]),
        "modelA": (Stage(service_time=(2.0, 0.15), max_batch_size=16, max_wait=1.0, replicas=2), ["pre"]),
        "modelB": (Stage(service_time=Exponential(1.5)), ["pre"]),
        "combine": (Stage(service_time=0.1), ["modelA", "modelB"]),
    }
    chain = {
        "decode": (Stage(service_time=0.5), ["request"]),
        "embed": (Stage(service_time=(3.0, 0.1), max_batch_size=32), ["decode"]),
        "classify": (Stage(service_time=0.9), ["embed"]),
    }
    search = {
        "parse": (Stage(service_time=0.2, replicas=2), ["request"]),
        "retrieve": (Stage(service_time=(1.0, 0.05), max_batch_size=8, replicas=3), ["parse"]),
        "rerank": (Stage(service_time=Exponential(4.0), replicas=3), ["retrieve"]),
    }
    return [(example, 1.2), (chain, 2.0), (search, 1.0)]


def _offered(stage: Stage, rate: float, replicas: int | None = None) -> float:
    if replicas is not None:
        stage = Stage(service_time=stage.service_time, max_batch_size=stage.max_batch_size,
                      max_wait=stage.max_wait, replicas=replicas)
    return rate / stage.capacity()


@_checker
def check_fix_bottleneck(fix_bottleneck: Callable[[dict, float], tuple[str, dict[str, int]]]) -> str:
    """Exercise 06.1: name the bottleneck, and the fewest replicas per stage that keep every stage at or below
    80 % offered load."""
    for stages, rate in _bottleneck_scenarios():
        answer = fix_bottleneck(stages, rate)
        _expect(isinstance(answer, tuple) and len(answer) == 2, "return a pair (bottleneck name, {stage: replicas})")
        named, replicas = answer
        loads = {name: _offered(stage, rate) for name, (stage, _) in stages.items()}
        expected = max(loads, key=loads.__getitem__)
        if named != expected:
            slowest = max(stages, key=lambda n: mean_service_time(stages[n][0].service_time, 1))  # type: ignore[arg-type]
            why = (f" {named!r} takes longest per request, but it batches or has replicas: what limits a stage is "
                   "its capacity, replicas x b/s(b)" if named == slowest else "")
            yours = loads.get(named, float("nan"))
            raise _Wrong(f"at {rate} requests per ms you named {named!r} (offered load {yours:.2f}), but {expected!r} "
                         f"runs at {loads[expected]:.2f} of its capacity, the most of any stage.{why}")
        _expect(isinstance(replicas, dict) and set(replicas) == set(stages),
                f"give a replica count for every stage: {sorted(stages)}")
        for name, (stage, _) in stages.items():
            r = replicas[name]
            _expect(isinstance(r, (int, np.integer)) and r >= 1, f"replicas of {name!r} must be an integer >= 1, "
                                                                   f"got {r!r}")
            load = _offered(stage, rate, int(r))
            need = next(k for k in range(1, 1000) if _offered(stage, rate, k) <= _MAX_LOAD_06)
            if load > _MAX_LOAD_06:
                exposed = "" if name == expected else (f" It is not the bottleneck you fixed: fixing {expected!r} "
                                                       "exposes the next stage")
                raise _Wrong(f"with {r} replicas {name!r} still runs at {load:.0%} of its capacity at {rate} requests "
                             f"per ms; it needs {need}.{exposed}")
            if r > need:
                batching = (f" With batches of up to {stage.max_batch_size} one replica serves "
                            f"{_offered(stage, 1.0, 1) ** -1:.2f} requests per ms, not 1 / s(1)"
                            if stage.max_batch_size != 1 else "")
                raise _Wrong(f"{name!r} needs only {need} replica(s) at {rate} requests per ms ({r} is more than the "
                             f"fewest).{batching}")
    return "the bottleneck is the least capable stage, and each stage gets just enough replicas."


def _branch_sample() -> np.ndarray:
    return simulate_batching(0.5, Exponential(1.0), n_requests=50_000, seed=6).latencies


@_checker
def check_fanout_p99(fanout_p99: Callable[[np.ndarray, int], float]) -> str:
    """Exercise 06.2: the p99 of a k-way join, predicted from one branch's latencies (branches independent)."""
    sample = _branch_sample()
    p99 = float(np.percentile(sample, 99))
    for k in (1, 2, 10, 100):
        got = float(fanout_p99(sample.copy(), k))
        expected = float(np.percentile(sample, 100 * 0.99 ** (1 / k)))
        if math.isclose(got, expected, rel_tol=0.02):
            continue
        if k > 1 and math.isclose(got, p99, rel_tol=0.02):
            raise _Wrong(f"for k={k} you predicted one branch's p99 ({p99:.2f} ms): the join waits for the slowest of "
                         f"{k} branches, so it is slow whenever any of them is")
        if got > expected:
            raise _Wrong(f"for k={k} you predicted {got:.2f} ms, too pessimistic: the join beats t when all {k} "
                         f"branches do, probability F(t)^{k}; set that to 0.99 (expected {expected:.2f} ms)")
        raise _Wrong(f"for k={k} you predicted {got:.2f} ms, too low: a join is never faster than one branch; "
                     f"with P(all {k} below t) = F(t)^{k} = 0.99 it is one branch's quantile 0.99^(1/{k}) "
                     f"(expected {expected:.2f} ms)")
    return "a k-way join's p99 is one branch's quantile 0.99^(1/k) (for independent branches)."


BATCHING_CHAIN = {
    "embed": (Stage(service_time=(2.0, 0.2)), ["request"]),
    "classify": (Stage(service_time=(4.0, 0.4)), ["embed"]),
}
BATCH_SIZES_06 = (1, 2, 4, 8, 16, 32)


@cache
def _fewest_replicas_06(rate: float, target: float) -> tuple[int, tuple]:
    plan = brute_force_plan(BATCHING_CHAIN, rate, target, max_replicas=6, batch_sizes=BATCH_SIZES_06,
                            max_waits=(0.0,), max_load=0.99, n_requests=8_000)
    return plan.total_replicas, tuple((n, k[0], k[2]) for n, k in plan.knobs().items())


@_checker
def check_batching_plan(choose_batching: Callable[[float, float], dict[str, tuple[int, int]]]) -> str:
    """Exercise 06.3: per-stage (max_batch_size, replicas) for BATCHING_CHAIN meeting a p99 target with the
    fewest replicas (simulated with simulate_graph, n_requests=8000, seed=0)."""
    for rate, target in ((1.0, 20.0), (2.0, 15.0)):
        config = choose_batching(rate, target)
        _expect(isinstance(config, dict) and set(config) == set(BATCHING_CHAIN),
                f"return {{stage: (max_batch_size, replicas)}} for the stages {sorted(BATCHING_CHAIN)}")
        stages = {}
        for name, (stage, deps) in BATCHING_CHAIN.items():
            b, r = config[name]
            _expect(b in BATCH_SIZES_06, f"max_batch_size of {name!r} must be one of {BATCH_SIZES_06}, got {b!r}")
            stages[name] = (Stage(service_time=stage.service_time, max_batch_size=b, replicas=r), deps)
        try:
            p99 = simulate_graph(stages, rate, n_requests=8_000, seed=0).percentile(99)
        except UnstableLoadError as unstable:
            raise _Wrong(f"at {rate} requests per ms: {unstable}") from None
        used = sum(r for _, r in config.values())
        _expect(p99 <= target, f"at {rate} requests per ms your configuration {config} has p99 {p99:.2f} ms, above the "
                               f"target {target} ms (a full batch of b takes alpha + beta*b: large batches are slow, "
                               "small ones need replicas)")
        fewest, example = _fewest_replicas_06(rate, target)
        if used > fewest:
            hint = ", ".join(f"{n} (batch {b}, {r} replica{'s' if r > 1 else ''})" for n, b, r in example)
            raise _Wrong(f"at {rate} requests per ms your configuration meets the target with {used} replicas, but "
                         f"{fewest} suffice, e.g. {hint}")
    return "the target met with the fewest replicas at both loads."


# --- 07 · Real serving frameworks -----------------------------------------------------------------------
# (imports local to this section, as in 06)

import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from infergraph_lite.lessons.models import tokenize  # noqa: E402
from infergraph_lite.core.stage import Stage  # noqa: E402
from infergraph_lite.frameworks.triton import TritonServer, TritonStartError, run_stages_once, to_model_repository, triton_available

__all__ += ["banana_stages_for_triton", "check_batching_where_it_pays", "check_ensemble_on_triton", "check_third_model"]


def banana_stages_for_triton() -> dict[str, tuple[Stage, list[str]]]:
    """The seed's graph as batch functions for exercise 07.1; modelA and modelB each take 0.1 s per call.

    The wait makes it measurable whether Triton ran the two models at the same time.  A zero-argument
    factory, so Triton's model processes can rebuild it (``infergraph_lite.exercises.checks:banana_stages_for_triton``).
    """
    def slow(count: Callable[[str], int]) -> Callable[[list], list]:
        def model(batch: list) -> list:
            time.sleep(BANANA_MODEL_SECONDS)
            return [count(text) for text in batch]
        return model

    return {
        "pre": (Stage(fn=lambda texts: [t.strip().lower() for t in texts], max_batch_size=64), ["text"]),
        "modelA": (Stage(fn=slow(len), max_batch_size=64), ["pre"]),
        "modelB": (Stage(fn=slow(lambda s: s.count("a")), max_batch_size=64), ["pre"]),
        "combine": (Stage(fn=lambda pairs: [{"len": n, "a_count": a} for n, a in pairs], max_batch_size=64),
                    ["modelA", "modelB"]),
    }


BANANA_MODEL_SECONDS = 0.1


@_checker
def check_ensemble_on_triton(config: str | Callable[[], str]) -> str:
    """Exercise 07.1 (5.4 for real): the learner's ensemble, loaded into a running Triton and queried.

    The members are the seed's four nodes, generated with the tensor names the ensemble uses.  Checks the
    answer for two texts and that modelA and modelB ran at the same time (each takes 0.1 s).
    """
    config_text = config() if callable(config) else config
    if not config_text.strip():
        raise NotImplementedError("write the config.pbtxt of the ensemble as a string")
    try:
        graph = ensemble_to_graph(config_text)
    except TritonConfigError as err:
        raise _Wrong(str(err)) from None
    unavailable = triton_available()
    with tempfile.TemporaryDirectory(prefix="infergraph-check-") as folder:
        try:
            to_model_repository(banana_stages_for_triton(), Path(folder), example=BANANA_INPUTS, ensemble=config_text,
                                factory="infergraph_lite.exercises.checks:banana_stages_for_triton")
        except TritonConfigError as err:
            raise _Wrong(f"{err} (the models are the seed's pre, modelA, modelB and combine)") from None
        if unavailable is not None:
            return f"the ensemble is well formed (waves {graph.levels}); not run, as Triton cannot run here: " + \
                unavailable
        try:
            server = TritonServer(folder, timeout=90).start()
        except TritonStartError as err:
            raise _Wrong(f"Triton refused to load it: {err}") from None
        try:
            with server.client() as client:
                client.model = graph.name
                answers = {}
                for text in (BANANA_INPUTS["text"], "Alfalfa"):
                    (value,) = client.infer({"text": text}).values()
                    answers[text] = json.loads(value) if isinstance(value, str) else value
                before = client.statistics()
                started = time.perf_counter()
                client.infer({"text": "banana split"})
                one_request = time.perf_counter() - started
                stats = {name: s - before[name] for name, s in client.statistics().items()}
        finally:
            server.stop()
    _expect(answers[BANANA_INPUTS["text"]] == {"len": 6, "a_count": 3},
            f"for '  BANANA  ' the ensemble answered {answers[BANANA_INPUTS['text']]!r}, expected "
            "{'len': 6, 'a_count': 3}")
    _expect(answers["Alfalfa"] == {"len": 7, "a_count": 3}, f"for 'Alfalfa' it answered {answers['Alfalfa']!r}")
    branches = stats["modelA"].request_time + stats["modelB"].request_time
    _expect(one_request < 0.8 * branches, f"one request took {one_request:.2f} s, as long as modelA and modelB "
                                          f"added up ({branches:.2f} s): they did not run at the same time")
    return ("Triton loaded your ensemble and answered both texts correctly, and one request took less than modelA "
            "and modelB added up: they ran in parallel.")


def _batching_gain(alpha: float, beta: float, b: int = 16) -> float:
    # How many times the capacity grows from batches of 1 to batches of b, with s(b) = alpha + beta * b.
    return b * (alpha + beta) / (alpha + beta * b)


@_checker
def check_batching_where_it_pays(choose_batching: Callable[[dict], dict]) -> str:
    """Exercise 07.2: dynamic batching on exactly the stages where batches of 16 at least double capacity."""
    cases = [
        {"tokenize": (0.0, 0.02), "embed": (0.05, 0.08), "topic": (12.0, 0.2), "sentiment": (12.0, 0.2),
         "merge": (0.0, 0.01), "format": (0.0, 0.01)},
        {"decode": (0.2, 0.5), "detector": (8.0, 1.5), "ranker": (3.0, 0.1), "post": (0.01, 0.02)},
        {"a": (1.0, 1.0), "b": (2.0, 0.5), "c": (0.5, 2.0), "x": (1.1, 1.0), "y": (1.2, 1.0)},
    ]
    for profiles in cases:
        options = choose_batching(dict(profiles))
        _expect(isinstance(options, dict), f"return a dict {{stage: knobs}}, got {type(options).__name__}")
        for name, (alpha, beta) in profiles.items():
            gain = _batching_gain(alpha, beta)
            knobs = options.get(name, {})
            size = knobs.get("max_batch_size", 1)
            if gain >= 2:
                _expect(isinstance(size, int) and size >= 8,
                        f"{name} (α={alpha} ms, β={beta} ms): batches of 16 raise its capacity {gain:.1f}x, so turn "
                        f"batching on (max_batch_size 16), not {size}")
                _expect(knobs.get("max_wait", 0.0) <= 0.002, f"{name}: keep max_wait at 2 ms or less (in seconds); "
                                                              f"got {knobs.get('max_wait')}")
            else:
                _expect(size == 1, f"{name} (α={alpha} ms, β={beta} ms): batches of 16 raise its capacity only "
                                   f"{gain:.2f}x; batching there buys waiting, not throughput, so leave it at 1")
    return "batching is on exactly where one call's fixed cost is worth sharing."


@_checker
def check_third_model(factory: Callable[[], dict]) -> str:
    """Exercise 07.3: a third model, ``length``, beside topic and sentiment, merged and formatted, served by Triton."""
    stages = factory()
    _expect(isinstance(stages, dict) and "length" in stages, "the stage graph has no 'length' node")
    deps = list(stages["length"][1])
    _expect(deps == ["tokenize"], f"length should read ['tokenize'] (it counts words), not {deps}")
    _expect(set(stages["merge"][1]) == {"topic", "sentiment", "length"},
            f"merge should read topic, sentiment and length, not {list(stages['merge'][1])}")
    _expect(set(stages) == {"tokenize", "embed", "topic", "sentiment", "merge", "format", "length"},
            "keep the six nodes of the text pipeline and add only length")
    for text in ("The pizza was excellent for lunch.", "Awful hotel, never again!"):
        answer = run_stages_once(stages, {"text": text})["format"]
        words = len(tokenize(text))
        _expect(isinstance(answer, str) and answer.endswith(f", {words} words"),
                f"for {text!r} format said {answer!r}; it should end with ', {words} words'")
    with tempfile.TemporaryDirectory(prefix="infergraph-check-") as folder:
        repo = to_model_repository(stages, Path(folder), factory=factory, example={"text": "a b"})
        graph = ensemble_to_graph(repo.config(repo.ensemble))
    parallel = next(level for level in graph.levels if "length" in level)
    _expect(len(parallel) >= 2, "length runs alone in its wave; it should run beside another model")
    beside = [n for n in parallel if n != "length"]
    return f"a third model in the ensemble: waves {graph.levels}; length runs beside {beside}."
