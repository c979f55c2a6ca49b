"""Checkers for the exercises of notebook 05, *Dynamic batching*; 5.4 reads a Triton ensemble config.

>>> check_batching_capacity(lambda alpha, beta, b: b / (alpha + beta * b))
Correct: b / s(b).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from infergraph_lite.core.stage import capacity
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.frameworks.triton import TritonConfigError, ensemble_to_graph
from infergraph_lite.simulation.queue import simulate_batching

__all__ = ["check_batch_sizes_greedy", "check_batching_capacity", "check_triton_ensemble", "check_window_tradeoff"]


@checker
def check_batching_capacity(batching_capacity: Callable[[float, float, int], float]) -> str:
    """Exercise 05.1: requests per ms a server can finish with full batches of b, s(b) = alpha + beta b."""
    for alpha, beta, b in [(2.0, 0.15, 32), (1.0, 1.0, 1), (5.0, 0.01, 128)]:
        got = batching_capacity(alpha, beta, b)
        expected = capacity((alpha, beta), b)
        require(math.isclose(got, expected), f"for alpha={alpha}, beta={beta}, b={b} you said {got:.4g}, expected "
                                             f"{expected:.4g}: b requests every alpha + beta*b ms")
    return "b / s(b)."


@checker
def check_batch_sizes_greedy(batch_sizes_greedy: Callable[[list[float], float, float], list[int]]) -> str:
    """Exercise 05.3 (stretch): greedy batching by hand: the size of each batch."""
    for seed in range(3):
        arrivals = np.random.default_rng(seed).exponential(1.0, 300).cumsum().tolist()
        r = simulate_batching(None, (1.0, 0.5), None, 0.0, arrivals=arrivals, warmup=0.0)
        expected = r.batches_size.tolist()
        got = list(batch_sizes_greedy(arrivals, 1.0, 0.5))
        require(sum(got) == len(arrivals), f"your batches hold {sum(got)} requests, but {len(arrivals)} arrived")
        if got != expected:
            first = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
            mine = got[first] if first < len(got) else "no"
            raise WrongAnswer(f"batch {first} has {mine} requests, the policy gives {expected[first]}: a free server "
                              "takes everything that has arrived by the moment it starts")
    return "your greedy batcher matches the simulator batch for batch."


@checker
def check_window_tradeoff(window_tradeoff: Callable[[list[float]], dict]) -> str:
    """Exercise 05.2: mean latency and mean batch size at low and high load, for each window."""
    windows = [0.0, 2.0, 8.0]
    table = window_tradeoff(windows)
    require(sorted(table) == windows, f"return one entry per window {windows}, got {sorted(table)}")
    low = [table[w]["low"] for w in windows]
    high = [table[w]["high"] for w in windows]
    require(all(a["latency"] < b["latency"] for a, b in itertools.pairwise(low)),
            "at low load, a longer window should mean a higher mean latency (requests wait it out)")
    require(all(a["batch"] <= b["batch"] for a, b in itertools.pairwise(low)),
            "a longer window should give batches at least as large")
    require(max(h["latency"] for h in high) / min(h["latency"] for h in high) < 1.5,
            "at high load the windows should matter little: the queue fills batches by itself")
    return "the trade-off, measured: windows cost latency at low load and barely matter near capacity."


@checker
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
        raise WrongAnswer(str(err)) from None
    require(len(graph.nodes) >= 3, f"expected steps for pre, two models and combine; found {len(graph.nodes)}")
    parallel = next((level for level in graph.levels if len(level) >= 2), None)
    order = " -> ".join(level[0] for level in graph.levels)
    require(parallel is not None, f"the steps run strictly one after another ({order}); the two models should "
                                  "both read the preprocessed tensor, so they can run in parallel")
    return f"a valid ensemble: {len(graph.nodes)} steps in {len(graph.levels)} waves; {parallel} run in parallel."

