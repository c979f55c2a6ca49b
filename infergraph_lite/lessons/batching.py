"""Helpers for notebook 05 (dynamic batching): seeds for tail comparisons, Clipper's plain AIMD rule, and a
real batcher's run measured against the simulation and audited against the policy.

Kept here so that the lesson's cells stay short and the notebook can show the one function it discusses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.serving.batcher import DynamicBatcher
from infergraph_lite.serving.loadtest import run_open_loop
from infergraph_lite.simulation.queue import BatchingResult, simulate_batching
from infergraph_lite.simulation.theory import batch_means_interval

__all__ = ["ClipperAIMD", "PolicyAudit", "RealRun", "across_seeds", "audit_policy", "in_run_service_time",
           "measure_real_batcher", "plain_log_axis"]


@dataclass
class ClipperAIMD(AIMD):
    """Clipper's rule as the paper states it: grow after *every* batch within the target, full or not.

    :class:`~infergraph_lite.core.policy.AIMD` grows only after a full batch, a refinement of this package;
    this class drops it, to show what the refinement is for.

    >>> plain = ClipperAIMD(latency_target=5.0, cap=2)
    >>> plain.observe(1.0, batch_size=1); plain.cap   # a lone request, fast: Clipper's rule grows anyway
    3
    """

    def observe(self, service_time: float, batch_size: int) -> None:
        """Shrink after a batch over the target; grow after any other batch, whatever its size."""
        if service_time > self.latency_target:
            self.cap = max(1, math.floor(self.cap * (1 - self.decrease)))
        else:
            self.cap = min(self.cap + self.increase, self.max_size)


def across_seeds(rate: float, service_time: Any, configs: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
                 **common: Any) -> dict[str, np.ndarray]:
    """Mean and p99 latency of each configuration on each seed: ``{label: array (seeds, 2)}``.

    Every configuration sees the same arrivals for a given seed (common random numbers), so the
    difference between two configurations on one seed is theirs, not the arrivals'; the spread over
    seeds says how far one seed's ordering can be trusted.

    >>> runs = across_seeds(0.5, (2.0, 0.15), {"greedy": {"max_batch_size": 32}}, seeds=[0, 1], n_requests=2_000)
    >>> runs["greedy"].shape
    (2, 2)
    """
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    out = {}
    for label, config in configs.items():
        runs = [simulate_batching(rate, service_time, seed=seed, **config, **common) for seed in seeds]
        out[label] = np.array([(r.mean_latency, r.percentile(99)) for r in runs])
    return out


def plain_log_axis(axis: Any, subs: Sequence[float] = (1.0, 2.0, 5.0)) -> None:
    """Ticks at ``subs`` x 10^k on a log axis (1, 2, 5 by default), labelled as plain numbers (10, 20, 50), not as
    powers; a narrow range reads better with more, such as ``(1, 2, 3, 5, 7)``.

    >>> import matplotlib.pyplot as plt
    >>> fig, ax = plt.subplots(); ax.set_yscale("log"); _ = ax.set_ylim(3, 40); plain_log_axis(ax.yaxis)
    >>> ticks = [v for v in ax.yaxis.get_major_locator().tick_values(3, 40) if 3 <= v <= 40]
    >>> [ax.yaxis.get_major_formatter()(v, 0) for v in ticks]
    ['5', '10', '20']
    >>> plt.close(fig)
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    axis.set_major_locator(LogLocator(base=10, subs=tuple(subs)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def in_run_service_time(durations_by_size: Mapping[int, Sequence[float]], seed: int = 0) -> Callable[[float], float]:
    """s(b) drawn from the batch times a real run saw: one of the times seen for size b (or the nearest size seen).

    Their spread matters as well as their mean (Pollaczek-Khinchine's E[S^2]), so the times are drawn, not averaged.

    >>> s = in_run_service_time({1: [0.002], 4: [0.004, 0.006]})
    >>> s(1), s(2), s(4) in (0.004, 0.006)
    (0.002, 0.002, True)
    """
    if not durations_by_size or not all(len(v) for v in durations_by_size.values()):
        raise ValueError("durations_by_size needs at least one size with at least one time")
    sizes = np.array(sorted(durations_by_size))
    draw = np.random.default_rng(seed).choice

    def s(b: float) -> float:
        return float(draw(durations_by_size[int(sizes[np.argmin(np.abs(sizes - b))])]))

    return s


@dataclass(frozen=True)
class PolicyAudit:
    """How a real batcher's batches compare with :class:`BatchPolicy`'s rule, batch by batch (seconds)."""

    batches: int
    size_ok: int     # batches that took exactly min(waiting, cap) requests
    rule_ok: int     # batches that were full, or whose oldest request had waited max_wait
    lag: np.ndarray  # per batch: how much later it started than the rule allowed (the worker's wake-up)


def audit_policy(batcher: DynamicBatcher) -> PolicyAudit:
    """Check a finished one-worker, fixed-cap batcher's batches against the policy, on its own real clock.

    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=4, max_wait=0.001) as b:
    ...     _ = [f.result() for f in [b.submit(i) for i in range(10)]]
    >>> a = audit_policy(b); a.batches == a.size_ok == a.rule_ok
    True
    """
    policy: BatchPolicy = batcher.policy
    if batcher.replicas != 1 or policy.controller is not None:
        raise ValueError("audit_policy needs one worker and a fixed cap (the rule is then a pure function of time)")
    batches = sorted(batcher.batches, key=lambda b: b.first)
    records = batcher.records  # one worker: in request order
    submitted = np.empty(len(records))
    for batch in batches:
        for j in range(batch.size):
            submitted[batch.first + j] = batch.start - records[batch.first + j].queue_time
    cap = policy.cap if policy.cap is not None else len(records)
    size_ok = rule_ok = 0
    lag, free_at = [], -math.inf
    for batch in batches:
        waiting = int(np.sum(submitted[batch.first:] <= batch.start))
        size_ok += batch.size == min(waiting, cap)
        oldest = submitted[batch.first]
        full = batch.size == cap
        rule_ok += full or batch.start - oldest >= policy.max_wait - 1e-9
        last = batch.first + cap - 1
        full_at = submitted[last] if last < len(submitted) else math.inf
        lag.append(batch.start - policy.start_time(free_at, oldest, full_at))
        free_at = batch.end
    return PolicyAudit(len(batches), size_ok, rule_ok, np.array(lag))


@dataclass
class RealRun:
    """One open-loop run of a real batcher and the simulations of the same arrivals (seconds)."""

    measured: np.ndarray          # latencies after the warm-up
    half_width: float             # 95 % batch-means half-width of the measured mean
    queue: float                  # mean time queued, as the batcher recorded it
    service: float                # mean batch time per request, as recorded
    handoff: float                # the rest of the mean latency: submit, wake-up, answer
    mean_batch: float             # mean size per batch (after the warm-up)
    simulated: BatchingResult     # the same arrivals, the isolated profile's s(b)
    resimulated: BatchingResult   # the same arrivals, the batch times this run saw
    audit: PolicyAudit


def measure_real_batcher(batch_fn: Callable[[list[Any]], Sequence[Any]], make_item: Callable[[int], Any],
                         profile_s: Callable[[float], float], max_batch_size: int, max_wait: float,
                         arrivals: np.ndarray, warmup: float = 0.2, seed: int = 0) -> RealRun:
    """Serve ``arrivals`` (seconds) open-loop through a real :class:`DynamicBatcher`, then simulate them twice.

    >>> run = measure_real_batcher(lambda xs: xs, lambda i: i, lambda b: 1e-4, 4, 0.001, np.arange(40) * 1e-3)
    >>> run.audit.batches == run.audit.size_ok, run.measured.shape
    (True, (32,))
    """
    with DynamicBatcher(batch_fn, max_batch_size, max_wait) as batcher:
        report = run_open_loop(batcher, arrivals, make_item)
    skip = int(warmup * len(arrivals))
    measured = report.latencies[skip:]
    records = batcher.records
    queue = float(np.mean([r.queue_time for r in records]))
    service = float(np.mean([r.service_time for r in records]))
    seen: dict[int, list[float]] = {}
    for batch in batcher.batches:
        seen.setdefault(batch.size, []).append(batch.end - batch.start)
    simulated = simulate_batching(None, profile_s, max_batch_size, max_wait, arrivals=arrivals, warmup=warmup,
                                  allow_unstable=True)
    resimulated = simulate_batching(None, in_run_service_time(seen, seed), max_batch_size, max_wait,
                                    arrivals=arrivals, warmup=warmup, allow_unstable=True)  # a replay of this trace
    half = batch_means_interval(measured, n_batches=10, confidence=0.95)[1] if len(measured) >= 20 else math.nan
    after = records[skip:]
    per_batch = float(len(after) / np.sum([1 / r.batch_size for r in after]))  # per batch, not per request
    return RealRun(measured, half, queue, service, float(report.latencies.mean()) - queue - service, per_batch,
                   simulated, resimulated, audit_policy(batcher))
