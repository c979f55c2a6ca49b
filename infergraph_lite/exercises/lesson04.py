"""Checkers for the exercises of notebook 04, *Latency and throughput*, against the queue simulator and theory.

>>> check_variability_penalty(lambda load: 2.0)
Correct: exactly 2 at every load: variability, not the mean, makes the wait.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from infergraph_lite.exercises.feedback import checker, require, require_count, require_number
from infergraph_lite.simulation.queue import simulate_batching

__all__ = ["check_fanout_median", "check_fewest_replicas", "check_variability_penalty"]


@checker
def check_fewest_replicas(fewest_replicas: Callable[[float, float, float], int]) -> str:
    """Exercise 04.2: the fewest replicas whose simulated p99 meets a target.

    The answer rests on a simulated p99, which moves a little with the seed; any count that is the
    fewest for one of several seeds is accepted, so a correct answer with another seed is not refused.
    """
    def fewest(rate: float, service: float, target: float, seed: int) -> int:
        return next(r for r in range(1, 50) if rate * service / r < 1 and simulate_batching(
            rate, service, replicas=r, n_requests=20_000, seed=seed).percentile(99) <= target)

    for rate, service, target in [(0.25, 10.0, 40.0), (0.5, 10.0, 25.0), (0.05, 10.0, 60.0)]:
        got = require_count(f"the replica count for {rate} requests/ms", fewest_replicas(rate, service, target))
        answers = {fewest(rate, service, target, seed) for seed in range(4)}
        low, high = min(answers), max(answers)
        expected = f"{low}" if low == high else f"{low} to {high}, depending on the seed"
        require(low <= got <= high,
                f"for {rate} requests/ms, {service} ms service and p99 <= {target} ms you said {got!r} replicas, "
                f"the simulation says {expected} (capacity alone is not enough: the tail needs headroom)")
    return "fleet sized by the tail, not by the average."


@checker
def check_variability_penalty(variability_penalty: Callable[[float], float]) -> str:
    """Exercise 04.1: how many times longer the mean *wait* is with exponential than fixed service."""
    for load in (0.3, 0.6, 0.9):
        got = variability_penalty(load)
        require(math.isclose(got, 2.0, rel_tol=1e-9), f"at load {load} you said {got}; Pollaczek-Khinchine's E[S^2] "
                                                       "is 2s^2 for exponential and s^2 for fixed service, so the wait "
                                                       "ratio is exactly 2 at every load (latency adds s to both)")
    return "exactly 2 at every load: variability, not the mean, makes the wait."


@checker
def check_fanout_median(fanout_median: Callable[[int, float], float]) -> str:
    """Exercise 04.3 (stretch): the median latency of a page that waits for ``k`` independent 10 ms M/D/1 calls."""
    for k, load in [(1, 0.5), (10, 0.5), (100, 0.5), (100, 0.8)]:
        latencies = simulate_batching(load / 10.0, 10.0, n_requests=200_000, seed=99).latencies
        expected = float(np.quantile(latencies, 0.5 ** (1 / k)))  # P(max of k <= x) = F(x)^k = 1/2
        got = require_number(f"the median latency in ms for k={k}", fanout_median(k, load))
        single_median = float(np.median(latencies))
        hint = (" - that is one call's median: the page waits for the slowest of its calls"
                if k > 1 and abs(got - single_median) < 0.05 * single_median else
                ": the page is done when all k calls are, so P(page <= x) = P(one call <= x) ** k")
        require(abs(got - expected) <= 0.1 * expected,
                f"for k={k} calls at load {load} you said {got:.1f} ms, the simulation gives about "
                f"{expected:.1f} ms{hint}")
    return "the median page waits as long as one call's p99.3 when it fans out to 100: the tail becomes the norm."

