"""What theory says about LLM batching, to hold :func:`~infergraph_lite.simulation.llm.simulate_llm` to (notebook 08).

All three assume what makes them exact: every step costs the same ``step_time``, no token budget and no
KV-cache limit.  Output lengths are an int, or a distribution given by its values (and optional weights; by
default each value is equally likely — pass a sample to use its empirical distribution).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number

__all__ = ["continuous_gain", "expected_max_length", "one_slot_mean_latency", "static_offline_makespan"]


def static_offline_makespan(output_tokens: Sequence[int] | np.ndarray, max_num_seqs: int, step_time: float) -> float:
    """Static batching of an offline batch: each batch (consecutive requests) lasts as long as its longest member.

    >>> static_offline_makespan([8, 7, 6, 5, 4, 3, 2, 1], 4, 1.0)
    12.0
    """
    lengths = np.asarray(output_tokens)
    b = check_count("max_num_seqs", max_num_seqs)
    seconds = check_number("step_time", step_time)
    starts = np.arange(0, len(lengths), b)
    return float(np.maximum.reduceat(lengths, starts).sum() * seconds) if len(lengths) else 0.0


def _distribution(lengths: int | Sequence[int] | np.ndarray, weights: Sequence[float] | np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    # Sorted distinct values and their probabilities.
    values = np.atleast_1d(np.asarray(lengths, dtype=float))
    w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != values.shape or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative, one per length, and not all zero")
    distinct, index = np.unique(values, return_inverse=True)
    return distinct, np.bincount(index, weights=w) / w.sum()


def expected_max_length(lengths: int | Sequence[int] | np.ndarray, b: int,
                        weights: Sequence[float] | np.ndarray | None = None) -> float:
    """E[max of ``b`` independent lengths]: a static batch of ``b`` random requests lasts this many steps.

    >>> expected_max_length([1, 2], 2)   # max is 1 only if both are 1
    1.75
    """
    b = check_count("b", b)
    values, p = _distribution(lengths, weights)
    cdf = np.cumsum(p)
    below = np.concatenate([[0.0], cdf[:-1]])
    return float(np.sum(values * (cdf**b - below**b)))


def continuous_gain(lengths: int | Sequence[int] | np.ndarray, b: int,
                    weights: Sequence[float] | np.ndarray | None = None) -> float:
    """E[max of b lengths] / E[length]: the offline throughput of continuous over static batching, b slots.

    Static batching spends E[max] steps per batch of b requests, continuous about E[length] steps per b
    requests once the batch stays full; the ratio is what a long offline run tends to.

    >>> continuous_gain([1, 2], 2)
    1.1666666666666667
    """
    values, p = _distribution(lengths, weights)
    return expected_max_length(values, b, p) / float(np.sum(values * p))


def one_slot_mean_latency(arrival_rate: float, output_tokens: int | Sequence[int] | np.ndarray, step_time: float,
                          weights: Sequence[float] | np.ndarray | None = None) -> float:
    """Mean end-to-end latency with ``max_num_seqs=1`` under Poisson arrivals: an M/G/1 queue.

    A request's service is ``output_tokens * step_time``; Pollaczek-Khinchine gives
    E[S] + rate E[S^2] / (2 (1 - rate E[S])).

    >>> round(one_slot_mean_latency(5.0, 10, 0.01), 4)   # M/D/1 at load 0.5: 0.1 + 5 * 0.01 / 1
    0.15
    """
    rate = check_number("arrival_rate", arrival_rate)
    seconds = check_number("step_time", step_time)
    values, p = _distribution(output_tokens, weights)
    mean, second = float(np.sum(values * p)) * seconds, float(np.sum(values**2 * p)) * seconds**2
    if rate * mean >= 1:
        raise ValueError(f"arrival_rate {rate:.4g} is at or above the slot's capacity {1 / mean:.4g}: no steady state")
    return mean + rate * second / (2 * (1 - rate * mean))
