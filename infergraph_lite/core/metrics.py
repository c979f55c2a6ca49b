"""Latency summaries every result shares: per-request arrival and finish times, mean, percentiles.

The simulators' results (:mod:`infergraph_lite.simulation`) and the autoscaler's build on these.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LatencySummary", "PerRequestTimes"]


class LatencySummary:
    """Per-request ``arrival`` and ``finish`` times and the latency summaries every result reports.

    A base for the simulators' frozen result dataclasses, which supply the two arrays.
    """

    arrival: np.ndarray
    finish: np.ndarray

    @property
    def latencies(self) -> np.ndarray:
        """Arrival to finish, per request."""
        return self.finish - self.arrival

    @property
    def mean_latency(self) -> float:
        return float(self.latencies.mean())

    def percentile(self, q: float) -> float:
        """The q-th percentile of latency, q in [0, 100] (``percentile(99)`` is p99)."""
        return float(np.percentile(self.latencies, q))


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
    def mean_batch_size(self) -> float:
        """Mean size per *batch* (not per request, which would weight big batches more)."""
        return float(len(self.batch_size) / np.sum(1.0 / self.batch_size))
