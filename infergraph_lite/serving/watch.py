"""Where an engine's time goes while it is measured: CPU seconds per process, core shares, batch sizes.

Used with :mod:`~infergraph_lite.serving.benchmark` by notebook 07 and ``benchmarks/bench_frameworks.py`` to
say *why* an engine stops where it does (a Ray Serve graph that runs out of CPU, a batcher that forms
batches of one), by measurement rather than by assertion.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from infergraph_lite.serving.benchmark import RateResult, measure_rate

__all__ = ["CpuMeter", "Watched", "batch_counts", "mean_batches", "watch_rate"]


class CpuMeter:
    """CPU seconds (user + system) each of ``pids`` used inside a ``with`` block, and the whole machine's.

    Processes that end inside the block are left out (their last reading is lost with them).

    >>> import os, time
    >>> with CpuMeter([os.getpid()]) as meter:
    ...     deadline = time.process_time() + 0.03      # 30 ms of CPU: the readings come in 10 ms ticks
    ...     while time.process_time() < deadline:
    ...         pass
    >>> meter.seconds[os.getpid()] > 0, 0 <= meter.share() <= 1
    (True, True)
    """

    def __init__(self, pids: Iterable[int]):
        self.pids = list(pids)
        self.names: dict[int, str] = {}
        self.seconds: dict[int, float] = {}
        self.elapsed = 0.0
        self.machine_busy = 0.0  # fraction of all cores busy over the block, whoever used them
        self._start: dict[int, float] = {}

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        t = process.cpu_times()
        return t.user + t.system

    def __enter__(self) -> CpuMeter:
        self._processes = {}
        for pid in self.pids:
            try:
                p = psutil.Process(pid)
                self._start[pid] = self._cpu(p)
                self.names[pid] = " ".join(p.cmdline()[:1]) or p.name()
                self._processes[pid] = p
            except psutil.Error:
                continue
        self._machine = psutil.cpu_times()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = time.perf_counter() - self._t0
        for pid, p in self._processes.items():
            try:
                self.seconds[pid] = self._cpu(p) - self._start[pid]
            except psutil.Error:
                continue
        after = psutil.cpu_times()
        total = sum(after) - sum(self._machine)
        idle = sum(getattr(after, k, 0.0) - getattr(self._machine, k, 0.0) for k in ("idle", "iowait"))
        self.machine_busy = 1 - idle / total if total > 0 else 0.0

    def share(self, pids: Iterable[int] | None = None) -> float:
        """CPU seconds of ``pids`` (default all measured) / (elapsed seconds x the machine's cores)."""
        chosen = self.seconds if pids is None else {p: self.seconds[p] for p in pids if p in self.seconds}
        cores = psutil.cpu_count() or 1
        return sum(chosen.values()) / (self.elapsed * cores) if self.elapsed > 0 else 0.0

    def by_name(self) -> dict[str, float]:
        """CPU seconds summed over processes of the same name (e.g. every ``ray::ServeReplica:...``)."""
        out: dict[str, float] = {}
        for pid, s in self.seconds.items():
            out[self.names.get(pid, str(pid))] = out.get(self.names.get(pid, str(pid)), 0.0) + s
        return out


def batch_counts(server: Any) -> dict[str, dict[int, int]]:
    """How many batches of each size every stage of a ``GraphServer`` has run so far: {stage: {size: batches}}.

    The same shape as Triton's statistics (``ModelStats.batch_sizes``) and ``RayServeGraph.batch_sizes()``.

    >>> from infergraph_lite.serving.graph_server import GraphServer
    >>> from infergraph_lite.serving.benchmark import noop_chain_stages
    >>> with GraphServer(noop_chain_stages(1)) as server:
    ...     _ = server.submit({"request": 1}).result()
    >>> batch_counts(server)
    {'hop1': {1: 1}}
    """
    out: dict[str, dict[int, int]] = {}
    for name, batcher in server.batchers.items():
        sizes = out.setdefault(name, {})
        for b in batcher.batches:
            sizes[b.size] = sizes.get(b.size, 0) + 1
    return out


def mean_batches(before: Mapping[str, Mapping[int, int]], after: Mapping[str, Mapping[int, int]]) -> dict[str, float]:
    """Each stage's mean batch size over the batches run between two readings of :func:`batch_counts`.

    >>> mean_batches({"a": {1: 4}}, {"a": {1: 5, 3: 1}, "b": {2: 2}})
    {'a': 2.0, 'b': 2.0}
    """
    out = {}
    for name, sizes in after.items():
        delta = {b: n - before.get(name, {}).get(b, 0) for b, n in sizes.items()}
        batches = sum(delta.values())
        if batches:
            out[name] = sum(b * n for b, n in delta.items()) / batches
    return out


@dataclass(frozen=True)
class Watched:
    """One run at a rate with every process of the engine watched: where the CPU went, and the batches formed.

    ``cpu_ms_engine`` / ``cpu_ms_here``: CPU milliseconds per answered request in the engine's own processes
    and in this one (the load generator and the client; for an in-process server, the server too);
    ``share_*``: the same as shares of all the machine's cores; ``machine_busy``: every core's busy share,
    whoever used it (other work on the machine included).
    """

    result: RateResult
    cpu_ms_engine: float
    cpu_ms_here: float
    share_engine: float
    share_here: float
    machine_busy: float
    batches: dict[str, float]
    by_name: dict[str, float]

    @property
    def cpu_ms_per_request(self) -> float:
        """CPU milliseconds per answered request, wherever they were spent: the engine's processes and this one."""
        return self.cpu_ms_engine + self.cpu_ms_here

    def free_cores_ceiling(self) -> float:
        """Requests per second the measured CPU cost per request allows on the cores no other work was using."""
        cores = psutil.cpu_count() or 1
        free = cores * max(1 - self.machine_busy + self.share_engine + self.share_here, 0.0)
        per_request = self.cpu_ms_per_request / 1e3
        return free / per_request if per_request > 0 else math.inf


def watch_rate(
    target: Any,
    rate: float,
    make_item: Callable[[int], Any],
    pids: Iterable[int],
    *,
    counts: Callable[[], Mapping[str, Mapping[int, int]]] | None = None,
    **procedure: Any,
) -> Watched:
    """One :func:`measure_rate` run at ``rate`` (no warm-up) with :class:`CpuMeter` on ``pids`` and this process.

    ``counts()`` reads the engine's batch counts ({stage: {size: batches}}) before and after.

    >>> import os
    >>> from infergraph_lite.serving.graph_server import GraphServer
    >>> from infergraph_lite.serving.benchmark import noop_chain_stages
    >>> with GraphServer(noop_chain_stages(2)) as server:
    ...     w = watch_rate(server, 100, lambda i: {"request": i}, [], counts=lambda: batch_counts(server),
    ...                    duration=0.1, min_requests=10)
    >>> w.cpu_ms_engine, w.cpu_ms_here >= 0, w.cpu_ms_per_request == w.cpu_ms_here, sorted(w.batches)
    (0.0, True, True, ['hop1', 'hop2'])
    """
    here = os.getpid()
    others = [p for p in pids if p != here]
    before = counts() if counts else {}
    with CpuMeter([here, *others]) as meter:
        result = measure_rate(target, rate, make_item, **{**procedure, "repetitions": 1, "warmup": 0.0})
    answered = max(len(result.reports[0].latencies), 1)
    engine_s = sum(meter.seconds.get(p, 0.0) for p in others)
    return Watched(result, 1e3 * engine_s / answered, 1e3 * meter.seconds.get(here, 0.0) / answered,
                   meter.share(others), meter.share([here]), meter.machine_busy,
                   mean_batches(before, counts()) if counts else {}, meter.by_name())
