"""Checkers for the exercises of notebook 05, *Dynamic batching*; 5.3 drives the package's AIMD, 5.4 reads a Triton
ensemble config.

>>> check_batching_capacity(lambda alpha, beta, b: b / (alpha + beta * b))
Correct: b / s(b).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import capacity
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.frameworks.triton import TritonConfigError, ensemble_to_graph

__all__ = ["check_aimd_caps", "check_batching_capacity", "check_triton_ensemble", "check_window_tradeoff"]


@checker
def check_batching_capacity(batching_capacity: Callable[[float, float, int], float]) -> str:
    """Exercise 05.1: requests per ms a server can finish with full batches of b, s(b) = alpha + beta b."""
    for alpha, beta, b in [(2.0, 0.15, 32), (1.0, 1.0, 1), (5.0, 0.01, 128)]:
        got = batching_capacity(alpha, beta, b)
        expected = capacity((alpha, beta), b)
        require(math.isclose(got, expected), f"for alpha={alpha}, beta={beta}, b={b} you said {got:.4g}, expected "
                                             f"{expected:.4g}: b requests every alpha + beta*b ms")
    return "b / s(b)."


def _caps(waiting: list[int], alpha: float, beta: float, target: float, *, plain: bool = False,
          rounding: Callable[[float], int] = math.floor, strict: bool = False, cap_size: bool = True) -> list[int]:
    """The cap in force at each batch; the keyword arguments make the plausible wrong variants."""
    cap, caps = 1, []
    for queued in waiting:
        caps.append(cap)
        size = min(queued, cap) if cap_size else queued
        service = alpha + beta * size
        if service > target or (strict and service == target):
            cap = max(1, rounding(cap * 0.9))
        elif plain or size >= cap:
            cap = min(cap + 1, 4096)
    return caps


def _reference_caps(waiting: list[int], alpha: float, beta: float, target: float) -> list[int]:
    controller, caps = AIMD(latency_target=target), []
    for queued in waiting:
        caps.append(controller.cap)
        size = min(queued, controller.cap)
        controller.observe(alpha + beta * size, size)
    return caps


# (name, trace, alpha, beta, target): heavy load saws around b*; light load leaves batches small; a batch of 8 at
# alpha=1, beta=0.5 takes exactly the 5 ms target; alpha above the target makes every batch too slow.
_AIMD_TRACES = [
    ("heavy load", [100] * 200, 2.0, 0.15, 5.0),
    ("light load", np.random.default_rng(5).integers(1, 4, 200).tolist(), 2.0, 0.15, 5.0),
    ("a batch exactly on the target", [50] * 60, 1.0, 0.5, 5.0),
    ("every batch over the target", [10] * 20, 6.0, 0.1, 5.0),
]
_AIMD_MISTAKES: list[tuple[dict[str, Any], str]] = [
    ({"plain": True}, "a batch smaller than the cap says nothing about whether a bigger one would fit: grow the cap "
                      "only after a full batch (this package's refinement of Clipper's rule)"),
    ({"rounding": round}, "after a slow batch the cap becomes floor(0.9 x cap): round down, not to the nearest"),
    ({"strict": True}, "a batch whose service time equals the target is within it: only a longer one cuts the cap"),
    ({"cap_size": False}, "a batch takes min(waiting, cap) requests, and its service time is that batch's"),
]


@checker
def check_aimd_caps(aimd_caps: Callable[[list[int], float, float, float], list[int]]) -> str:
    """Exercise 05.3 (stretch): the package's AIMD rule by hand: the cap in force at each batch of a trace."""
    for name, waiting, alpha, beta, target in _AIMD_TRACES:
        expected = _reference_caps(waiting, alpha, beta, target)
        got = list(aimd_caps(list(waiting), alpha, beta, target))
        require(len(got) == len(waiting), f"{name}: return one cap per batch ({len(waiting)}), got {len(got)}")
        odd = [c for c in got if isinstance(c, bool) or not isinstance(c, (int, np.integer))]
        require(not odd, f"{name}: caps are whole numbers of requests; got {odd[0]!r}" if odd else "")
        require(min(got) >= 1, f"{name}: the cap fell to {min(got)}; it never goes below 1")
        if got == expected:
            continue
        require(got[:-1] != expected[1:], f"{name}: you returned the cap after each batch; return the cap in force "
                                          "when each batch starts")
        require(got[0] == 1, f"{name}: the first batch runs with the starting cap, 1; you said {got[0]}")
        for variant, why in _AIMD_MISTAKES:
            require(got != _caps(waiting, alpha, beta, target, **variant), f"{name}: {why}")
        first = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
        raise WrongAnswer(f"{name}: at batch {first} the cap should be {expected[first]}, you said {got[first]} "
                          f"(caps before it: {expected[max(0, first - 3):first]})")
    heavy = _reference_caps(*_AIMD_TRACES[0][1:])[100:]
    return f"your controller saws between {min(heavy)} and {max(heavy)} under heavy load, as the package's AIMD does."


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
    slowest = max(windows, key=lambda w: table[w]["high"]["latency"])
    added = table[slowest]["high"]["latency"] / min(h["latency"] for h in high) - 1
    require(added < 0.5, f"at high load the queue fills batches by itself, so no window should add half to the mean "
                         f"latency; your {slowest:g} ms window adds {added:.0%}")
    return (f"the trade-off, measured: windows cost latency at low load; at high load the queue fills batches by "
            f"itself, and only a window longer than a full batch takes (2 + 0.15 x 32 = 6.8 ms) holds batches back: "
            f"your slowest, {slowest:g} ms, adds {added:.0%} to the mean latency.")


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

