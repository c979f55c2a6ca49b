"""Latency summaries every result shares: mean and percentiles of latency, mean batch size, busy fraction,
and the Student-t quantile their intervals use.

Each summary is defined once here.  The simulators' results (:mod:`infergraph_lite.simulation`), the
autoscaler's, and the real load tests' (:mod:`infergraph_lite.serving`) all compute theirs with these.
"""

from __future__ import annotations

import numpy as np

from infergraph_lite.core.arguments import check_count

__all__ = ["LatencySummary", "PerRequestTimes", "busy_fraction", "latency_percentile", "mean_per_batch", "t_quantile"]


def latency_percentile(latencies: np.ndarray, q: float) -> float:
    """The q-th percentile of ``latencies``, q in [0, 100] (numpy's linear interpolation).

    >>> latency_percentile(np.array([1.0, 2.0, 3.0, 4.0]), 50)
    2.5
    """
    return float(np.percentile(latencies, q))


def mean_per_batch(batch_size: np.ndarray) -> float:
    """Mean size per *batch*, from each request's batch size: ``n / sum(1 / size)``.

    A batch of b requests appears b times among the requests, so a plain mean over requests would weight
    big batches more; the harmonic mean counts each batch once.

    >>> mean_per_batch(np.array([4, 4, 4, 4, 1]))   # one batch of 4 and one of 1
    2.5
    """
    sizes = np.asarray(batch_size, dtype=float)
    return float(len(sizes) / np.sum(1.0 / sizes))


def busy_fraction(batch_start: np.ndarray, batch_end: np.ndarray, servers: int, window_start: float,
                  window_end: float) -> float:
    """Utilization: the fraction of ``servers`` x the window that batches spent serving.

    Each batch counts only the part of it inside ``[window_start, window_end]`` (a batch of warm-up requests,
    or one running past the window, counts its overlap).  An empty window counts as fully busy.

    >>> busy_fraction(np.array([0.0, 2.0, 5.0]), np.array([1.0, 4.0, 7.0]), 2, 1.0, 6.0)   # (2 + 1) / (2 * 5)
    0.3
    """
    span = window_end - window_start
    if span <= 0:
        return 1.0
    busy = np.sum(np.clip(batch_end, window_start, window_end) - np.clip(batch_start, window_start, window_end))
    return float(busy / (servers * span))



def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student-t quantile: ``t`` with ``P(|T| <= t) = confidence`` for ``df`` degrees of freedom.

    SciPy's ``scipy.stats.t.ppf(0.5 + confidence / 2, df)``.  With few samples the t quantile is well
    above the normal one (3.29 for 99.9 %).

    >>> round(t_quantile(0.999, 19), 2)   # 20 batch means: 19 degrees of freedom
    3.88
    >>> round(t_quantile(0.95, 1_000_000), 2)   # many degrees of freedom: the normal 1.96
    1.96
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    df = check_count("df", df)
    # Imported here, not at the top: scipy.stats takes ~0.4 s to import, four times `import infergraph_lite`
    # (measured), and only the intervals need it.
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


class LatencySummary:
    """Per-request ``arrival`` and ``finish`` times and the latency summaries every result reports.

    A base for the simulators' frozen result dataclasses, which supply the two arrays.
    """

    arrival: np.ndarray
    finish: np.ndarray

    @property
    def latencies(self) -> np.ndarray:
        """Arrival to finish, per answered request (a request shed by a queue limit or timeout has a NaN finish
        and is left out; with none shed, one entry per request in order)."""
        latencies = self.finish - self.arrival
        answered = ~np.isnan(latencies)
        return latencies if answered.all() else latencies[answered]

    @property
    def mean_latency(self) -> float:
        return float(self.latencies.mean())

    def percentile(self, q: float) -> float:
        """The q-th percentile of latency, q in [0, 100] (``percentile(99)`` is p99)."""
        return latency_percentile(self.latencies, q)


class PerRequestTimes(LatencySummary):
    # What BatchingResult and StageStats add: when each request's batch started, and its size.
    start: np.ndarray
    batch_size: np.ndarray

    @property
    def queue_times(self) -> np.ndarray:
        """Time from arrival until the request's batch started."""
        return self.start - self.arrival

    @property
    def service_times(self) -> np.ndarray:
        return self.finish - self.start

    @property
    def mean_wait(self) -> float:
        """Mean time a request waited in the queue (including a batch window)."""
        return float(self.queue_times.mean())

    @property
    def mean_service(self) -> float:
        """Mean service time of the batch a request rode in."""
        return float(self.service_times.mean())

    @property
    def mean_batch_size(self) -> float:
        """Mean size per *batch* (not per request, which would weight big batches more)."""
        return mean_per_batch(self.batch_size)
