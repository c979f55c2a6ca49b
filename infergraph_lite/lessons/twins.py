"""A real server's simulated twin, calibrated and its remaining gap taken apart (benchmarks/bench_graph_server.py;
lesson 09 teaches the method).

The twin of a :class:`~infergraph_lite.serving.graph_server.GraphServer` is its stage dict with each stage's
work as ``service_time``, run by :func:`~infergraph_lite.simulation.graph.simulate_graph`: a CPU-time profile,
or the CPU seconds the server's batches recorded where they ran (``recorded_twin(..., measure="work")``; the
same pure-Python work costs more CPU time on a busier machine, so a run's own work is the steadier base).  Two
things a real server does that such a twin does not hold, each measured here rather than guessed:

- **a hop**: handing a request to a stage and its answer back (a batcher thread woken, for worker processes
  the batch and its answer pickled through a pipe).  :func:`calibrate_hops` measures it from lone requests
  (nothing queues; back to back, or ``spacing`` apart so that each finds the server idle, as at light load):
  per stage the round trip's excess over the work (the *trip*), the *turnaround* (the batcher thread answering
  the batch before it can take the next one), and the hand-off outside them.  Either all of it as
  ``simulate_graph``'s ``hop_delay``, or, since the replica is busy for its round trip and its turnaround, both
  inside every batch (:meth:`HopCalibration.occupying`) and only the rest of the hand-off as a delay
  (:attr:`HopCalibration.handoff`); either way the twin reproduces the lone median.
- **what the load does to each batch** (a worker waiting for a core that the other stages and the parent
  process also need, no idle process to wake): :func:`recorded_twin` rebuilds the twin from the wall times the
  stages' batches took *during* a run (with :func:`recorded_turnaround`, a trace-driven twin), so the
  difference between it and the calibrated twin is what the load changed in that run's round trips.  With
  ``spread=True`` each batch is drawn from the run's records of its size rather than their median.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.stage import Exponential, mean_service_time, service_time_fn
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop
from infergraph_lite.simulation.graph import simulate_graph

__all__ = ["HopCalibration", "at_work", "calibrate_hops", "recorded_turnaround", "recorded_twin", "service_table",
           "validate_graph_server"]


def service_table(sizes: Sequence[float], seconds: Sequence[float]) -> Callable[[float], float]:
    """s(b) from a measured table, interpolated; evened out so that a batch is never dearer per request than
    a batch of one, nor cheaper than a smaller batch.

    >>> s = service_table([1, 2, 4], [1.0, 1.5, 1.4])
    >>> s(1), s(3), s(4)
    (1.0, 1.5, 1.5)
    """
    b, s = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    s = np.maximum.accumulate(np.minimum(s, s[0] * b / b[0]))
    return lambda size: float(np.interp(size, b, s))


@dataclass(frozen=True)
class HopCalibration:
    """What lone requests through a real server showed, against its twin (seconds).

    ``lone_latency`` is their median end to end, ``twin_latency`` the twin's for a lone request (the work
    alone).  Per stage: ``round_trip`` is the median service time as its batcher saw it (for worker
    processes: the pipe, pickling and the work), ``work`` the work of a lone request the hop is measured
    above (the twin's ``service_time(1)``, or the CPU seconds the server recorded) and ``trip`` the round
    trip's excess over it.  ``outside`` is the rest of a
    hop, spread evenly over the stages (the parent's hand-off: a thread woken, a callback, the next submit).
    ``hop_delay`` is per stage ``trip + outside``; with it the twin's lone latency is ``lone_latency``.  A
    noisy calibration can put a part below zero (a lone median under the round trips' sum): ``outside`` and
    each ``hop_delay`` are then held at 0, so the twin never runs a request backwards in time, and
    ``clamped`` says it happened (the lone latency is then not reproduced exactly); so it does when
    :attr:`handoff` is held at 0 (an outside part shorter than the mean turnaround).

    As a pure delay the trip occupies no server, though a worker process is busy for its whole round trip:
    :meth:`occupying` puts it into each batch's service time instead.  It also adds each stage's
    ``turnaround``: after a batch's answer is back its batcher thread still answers the batch's requests (their
    callbacks hand each to its next stage) before it can take the next batch (``BatchRecord.released - end``,
    median).  A request leaves during that turnaround, so with the turnaround inside the service, the delay that
    goes with :meth:`occupying` is :attr:`handoff`, the outside part less the turnaround it overlaps.
    """

    lone_latency: float
    twin_latency: float
    round_trip: dict[str, float]
    outside: float
    hop_delay: dict[str, float]
    clamped: bool = False
    work: dict[str, float] = dataclasses.field(default_factory=dict)
    trip: dict[str, float] = dataclasses.field(default_factory=dict)
    turnaround: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def per_hop(self) -> float:
        """The mean hop delay per stage entered."""
        return statistics.fmean(self.hop_delay.values())

    @property
    def handoff(self) -> float:
        """The delay per stage entered to simulate :meth:`occupying`'s twin with: ``outside`` less the mean
        turnaround (a request leaves its stage while its batcher thread is still answering the batch), held at 0."""
        turnaround = statistics.fmean(self.turnaround.values()) if self.turnaround else 0.0
        return max(self.outside - turnaround, 0.0)

    def occupying(self, twin: Mapping[str, tuple[Any, Sequence[str]]]) -> dict[str, tuple[Any, Sequence[str]]]:
        """``twin`` with each stage's ``trip`` and ``turnaround`` added to every batch's service time: the
        worker is busy for both.

        Simulate it with ``hop_delay=calibration.handoff``: a lone request then takes what it takes with
        ``hop_delay=calibration.hop_delay``, and under load a queue grows behind the round trips and the
        turnarounds too.

        >>> from infergraph_lite.core.stage import Stage
        >>> hops = HopCalibration(0.0, 0.0, {"a": 0.003}, 0.0005, {"a": 0.0015}, work={"a": 0.002},
        ...                       trip={"a": 0.001}, turnaround={"a": 0.0002})
        >>> s = hops.occupying({"a": (Stage(service_time=0.002), ["request"])})["a"][0].service_time
        >>> round(s(4), 9), round(hops.handoff, 9)
        (0.0032, 0.0003)
        """
        result = {}
        for name, (stage, deps) in twin.items():
            base = service_time_fn(stage.service_time, allow_zero=True)
            extra = max(self.trip.get(name, 0.0), 0.0) + max(self.turnaround.get(name, 0.0), 0.0)
            result[name] = (dataclasses.replace(stage, service_time=lambda b, base=base, extra=extra: base(b) + extra),
                            deps)
        return result


def calibrate_hops(server: Any, twin: Mapping[str, tuple[Any, Sequence[str]]], make_item: Callable[[int], Any],
                   n_requests: int = 100, inputs: Sequence[str] = ("request",), *,
                   work_from: str = "twin", spacing: float | None = None) -> HopCalibration:
    """Send ``n_requests`` lone requests and measure each stage's hop delay.

    ``server`` is a warm :class:`~infergraph_lite.serving.graph_server.GraphServer` serving the graph whose
    ``twin`` (the same dict with ``service_time`` s) is given.  Light load only: nothing queues, so what a
    lone request takes above the twin's latency is hand-off, not waiting.  Latencies are the server's own
    (``server.records``: submitted until its last stage finished), so a load generator's lateness is not
    counted as a hop.  ``spacing=None`` sends them back to
    back (one client, closed loop: each as soon as the last one is answered); a number of seconds sends one
    every ``spacing`` seconds (open loop), so that each finds the server idle, as most requests at light load do.
    That is slower: the work takes more CPU time (caches gone cold, a core clocked down) and processes must be
    woken (over notebook 06's runs on a 2-core VM, 20 ms apart cost 0.1-1.4 ms more per request than back to
    back, in the work and in the hops, in proportions that vary).  A
    spacing below the lone requests' median latency would queue them behind each other, and is refused.
    The work a hop is measured above is
    the twin's ``service_time(1)``, or with ``work_from="records"`` the CPU seconds the server recorded for these
    very batches, where they ran (``recorded_twin(..., measure="work")``): then a profile taken at another
    moment, on a machine whose load changed since, cannot make a round trip look shorter than its work.  For a
    chain every request enters every stage, so that twin with ``hop_delay=calibration.hop_delay`` predicts
    the lone median exactly.

    >>> import time
    >>> from infergraph_lite.core.stage import Stage
    >>> from infergraph_lite.serving.graph_server import GraphServer
    >>> def nap(xs):
    ...     time.sleep(0.002 * len(xs))
    ...     return xs
    >>> stages = {"a": (Stage(fn=nap), ["request"]), "b": (Stage(fn=nap), ["a"])}
    >>> twin = {n: (Stage(service_time=0.002), deps) for n, (_, deps) in stages.items()}
    >>> with GraphServer(stages) as server:
    ...     hops = calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=20)
    >>> round(hops.twin_latency, 9), sorted(hops.hop_delay), hops.per_hop >= 0
    (0.004, ['a', 'b'], True)
    """
    n_requests = check_count("n_requests", n_requests)
    if work_from not in ("twin", "records"):
        raise ValueError(f"calibrate_hops: work_from must be 'twin' or 'records', got {work_from!r}")
    if spacing is not None:
        spacing = check_number("spacing", spacing)
    marks = {name: len(rows) for name, rows in server.stage_records().items()}
    first = len(server.records) if hasattr(server, "records") else None
    batchers = getattr(server, "batchers", {})
    batch_marks = {name: len(batcher.batches) for name, batcher in batchers.items()}
    if spacing is None:
        report = run_closed_loop(server, n_clients=1, n_requests=n_requests, make_item=make_item)
    else:
        report = run_open_loop(server, np.arange(n_requests) * spacing, make_item)
    if report.failed or report.refused or len(report.latencies) == 0:
        raise RuntimeError(f"calibrate_hops: {report.failed} lone requests failed and {report.refused} were "
                           "refused; a calibration needs them all answered")
    # As the server saw them (submit -> last stage done): a client's own lateness is no hop of the server's
    lone = float(np.median([r.latency for r in server.records[first:]] if first is not None else report.latencies))
    if spacing is not None and lone >= spacing:
        raise ValueError(f"calibrate_hops: spacing={spacing:g} s is shorter than a lone request's median latency "
                         f"({lone:.3g} s), so the requests queued behind each other; give a longer spacing")
    records = {name: rows[marks[name]:] for name, rows in server.stage_records().items()}
    round_trip = {name: float(np.median([r.service_time for r in records[name]])) for name in twin}
    base = recorded_twin(records, twin, measure="work") if work_from == "records" else twin
    alone = simulate_graph(base, None, arrivals=np.arange(50) * 1e3, warmup=0.0, inputs=inputs)
    twin_lone = float(np.median(alone.latencies))
    work = {name: mean_service_time(stage.service_time, 1) for name, (stage, _) in base.items()}
    trip = {name: round_trip[name] - work[name] for name in twin}
    # What the lone requests took beyond their stages' round trips, per stage (a chain enters each once)
    raw_outside = (lone - twin_lone - sum(trip.values())) / len(twin)
    raw = {name: trip[name] + raw_outside for name in twin}
    clamped = raw_outside < 0 or any(d < 0 for d in raw.values())
    hop_delay = {name: max(d, 0.0) for name, d in raw.items()}
    turnaround = recorded_turnaround({name: batchers[name].batches[batch_marks[name]:] for name in twin
                                      if name in batchers})
    # handoff holds outside - turnaround at 0 too: then the lone latency is not reproduced exactly either
    clamped = clamped or (bool(turnaround) and raw_outside < statistics.fmean(turnaround.values()))
    return HopCalibration(lone, twin_lone, round_trip, max(raw_outside, 0.0), hop_delay, clamped, work, trip,
                          turnaround)


def recorded_turnaround(batches: Mapping[str, Sequence[Any]]) -> dict[str, float]:
    """Each stage's median turnaround: ``released - end`` over its batches (``BatchRecord`` s).

    ``batches`` maps a stage to its batches of one run (``server.batchers[name].batches[mark:]``).  A batch whose
    answers are not all out yet has no ``released`` (NaN) and is left out; a stage with none left gets 0.

    >>> from infergraph_lite.serving.metrics import BatchRecord
    >>> recorded_turnaround({"a": [BatchRecord(0, 1, 0.0, 1.0, released=1.25), BatchRecord(1, 1, 2.0, 3.0)]})
    {'a': 0.25}
    """
    result = {}
    for name, rows in batches.items():
        gaps = [b.released - b.end for b in rows if not np.isnan(b.released)]
        result[name] = float(np.median(gaps)) if gaps else 0.0
    return result


def recorded_twin(records: Mapping[str, Sequence[Any]], base: Mapping[str, tuple[Any, Sequence[str]]], *,
                  measure: str = "service_time", spread: bool = False,
                  seed: int = 0) -> dict[str, tuple[Any, Sequence[str]]]:
    """``base`` with each stage's service time per batch size as its stage recorded it during a run (medians).

    ``records`` is :meth:`GraphServer.stage_records` sliced to one run.  ``measure`` says which record:
    ``"service_time"`` (each batch's wall time, everything the stage waited for included) or ``"work"`` (the
    CPU seconds its function used, where it ran).  A stage that saw one batch size gets that size's time for
    every batch size at or above it (and proportionally less below).

    With ``spread=True`` the batches vary as the run's did: each batch takes its size's median times a ratio
    drawn (seeded) from that run's records of the nearest size seen (record / its size's median).  A queue
    waits longer behind varying service times than behind their median (Pollaczek-Khinchine: the mean wait
    grows with the service time's second moment), and a skewed record's mean lies above its median.

    >>> from infergraph_lite.core.stage import Stage
    >>> from infergraph_lite.serving.metrics import RequestRecord
    >>> rows = [RequestRecord(0.0, 0.003, 1, 0.002), RequestRecord(0.0, 0.005, 2, 0.004),
    ...         RequestRecord(0.0, 0.005, 2, 0.004)]
    >>> base = {"a": (Stage(service_time=0.001, max_batch_size=2), ["request"])}
    >>> twin = recorded_twin({"a": rows}, base)
    >>> twin["a"][0].service_time(1), twin["a"][0].service_time(2)
    (0.003, 0.005)
    >>> recorded_twin({"a": rows}, base, measure="work")["a"][0].service_time(2)
    0.004
    >>> varied = [RequestRecord(0.0, t, 1) for t in (0.001, 0.002, 0.006)]
    >>> s = recorded_twin({"a": varied}, base, spread=True)["a"][0].service_time
    >>> sorted({round(s(1), 6) for _ in range(100)})
    [0.001, 0.002, 0.006]
    """
    if measure not in ("service_time", "work"):
        raise ValueError(f"recorded_twin: measure must be 'service_time' or 'work', got {measure!r}")
    result = {}
    for index, (name, (stage, deps)) in enumerate(base.items()):
        rows = records[name]
        if not rows:
            raise ValueError(f"recorded_twin: stage {name!r} recorded no requests in this run")
        sizes = np.array([r.batch_size for r in rows])
        seconds = np.array([getattr(r, measure) for r in rows], dtype=float)
        if not np.all(np.isfinite(seconds)):
            raise ValueError(f"recorded_twin: stage {name!r} has records without a {measure} (NaN)")
        seen = np.unique(sizes)
        medians = [float(np.median(seconds[sizes == b])) for b in seen]
        ratios = [seconds[sizes == b] / m for b, m in zip(seen, medians)]  # a batch of b is b rows: equal weights
        if len(seen) == 1:  # one size seen: proportional below it, constant above
            seen, medians = np.array([seen[0], seen[0] + 1]), [medians[0], medians[0]]
            if seen[0] > 1:
                seen, medians = np.array([1, *seen]), [medians[0] / seen[0], *medians]
        table = service_table(seen, medians)
        if spread:
            table = _spread(table, np.unique(sizes), ratios, np.random.default_rng([seed, index]))
        result[name] = (dataclasses.replace(stage, service_time=table), deps)
    return result


def at_work(twin: Mapping[str, tuple[Any, Sequence[str]]],
            per_request: Mapping[str, float]) -> dict[str, tuple[Any, Sequence[str]]]:
    """``twin`` with each stage's service times scaled so that a batch of one costs ``per_request[stage]``.

    For a twin built from a profile, replayed at the work per request a run recorded (a burst whose work came
    out above or below the profile's): every batch size keeps the profile's shape.  The scale is set at a batch
    of one; for a stage whose cost is nearly proportional to the batch (pure-Python work per item, as notebook
    06's CPU-bound chain) the work per request of a run of larger batches scales it the same way.

    >>> from infergraph_lite.core.stage import Stage
    >>> twin = {"a": (Stage(service_time=(0.001, 0.001)), ["request"])}  # 1 ms + 1 ms per request
    >>> tuple(round(part, 6) for part in at_work(twin, {"a": 0.003})["a"][0].service_time)  # the same kind of spec
    (0.0015, 0.0015)
    """
    unknown = [name for name in per_request if name not in twin]
    if unknown:
        raise ValueError(f"at_work: per_request names {unknown[0]!r}, which is not a stage (stages: {', '.join(twin)})")
    result = {}
    for name, (stage, deps) in twin.items():
        if name not in per_request:
            raise ValueError(f"at_work: no work per request given for stage {name!r}")
        work = check_number(f"per_request[{name!r}]", per_request[name], positive=False)
        alone = mean_service_time(stage.service_time, 1)  # an Exponential's mean: no draw spent, no seed lost
        if alone == 0 and work > 0:
            raise ValueError(f"at_work: stage {name!r} costs nothing in the twin, so it cannot be scaled to {work}")
        result[name] = (dataclasses.replace(stage, service_time=_scaled(stage.service_time,
                                                                         work / alone if alone > 0 else 1.0)), deps)
    return result


def _scaled(service_time: Any, factor: float) -> Any:
    # The same kind of spec, scaled: a number, (alpha, beta) and an Exponential keep the simulator's fast paths
    # and their exact capacity; a function is wrapped.
    if isinstance(service_time, Exponential):
        return Exponential(service_time.mean * factor)
    if isinstance(service_time, tuple):
        return tuple(factor * part for part in service_time)
    if callable(service_time):
        return lambda b: factor * service_time(b)
    return factor * service_time


def _spread(table: Callable[[float], float], sizes: np.ndarray, ratios: list[np.ndarray],
            rng: np.random.Generator) -> Callable[[float], float]:
    # s(b) times a ratio drawn from the records of the seen size nearest to b (the smaller one on a tie)
    def service_time(size: float) -> float:
        pool = ratios[int(np.argmin(np.abs(sizes - size)))]
        return table(size) * float(pool[rng.integers(len(pool))])
    return service_time


def validate_graph_server(server: Any, twin: Mapping[str, tuple[Any, Sequence[str]]], make_item: Callable[[int], Any],
                          hops: HopCalibration | None, *, rates: Mapping[float, float], n_requests: int = 300,
                          seed: int = 0) -> list[Any]:
    """A :class:`~infergraph_lite.lessons.measuring.ValidationRow` per load: ``server`` (a warm ``GraphServer``)
    under open-loop Poisson load at each ``rates[load]`` req/s, beside its two twins fed the run's own arrivals.

    The **forecast** is ``twin`` (service times from a profile taken before the load) with the hops the lone requests
    measured (``hops``); the **replay** takes each batch's wall time and turnaround as this run recorded them, with
    the same hand-off.  Latencies count from each request's submit to its last stage (the server's own records),
    so the load generator's lateness is not the twins' to reproduce.

    >>> validate_graph_server(None, {}, lambda i: i, None, rates={0.5: 0.0})
    Traceback (most recent call last):
    ...
    ValueError: rates[0.5] must be > 0, got 0.0
    """
    from infergraph_lite.lessons.measuring import ValidationRow

    for load, rate in rates.items():
        check_number(f"rates[{load}]", rate)
    n_requests = check_count("n_requests", n_requests)
    if hops is None:
        raise ValueError("validate_graph_server: hops is None; measure them first with calibrate_hops")

    def summary(latencies: Any) -> tuple[float, float]:
        return float(np.mean(latencies)), float(np.percentile(latencies, 99))

    rows: list[Any] = []
    for k, (load, rate) in enumerate(rates.items()):
        gaps = np.random.default_rng([seed, k]).exponential(1 / rate, n_requests)
        first = len(server.records) + server.failed  # the first request number this run sends
        marks = {name: len(rows_) for name, rows_ in server.stage_records().items()}
        batch_marks = server.batch_marks()
        run_open_loop(server, np.cumsum(gaps) - gaps[0], make_item)
        done = sorted((r for r in server.records if r.number >= first), key=lambda r: r.number)
        sent = np.array([r.submitted for r in done])
        replay = {"arrivals": sent - sent[0], "warmup": 0.0, "allow_unstable": True}
        records = {name: rows_[marks[name]:] for name, rows_ in server.stage_records().items()}
        forecast = simulate_graph(hops.occupying(twin), None, hop_delay=hops.handoff, **replay)
        traced = dataclasses.replace(hops, trip={}, turnaround=recorded_turnaround(server.batches_since(batch_marks)))
        replayed = simulate_graph(traced.occupying(recorded_twin(records, twin, spread=True, seed=k)), None,
                                  hop_delay=traced.handoff, **replay)
        rows.append(ValidationRow(load, summary([r.latency for r in done]),
                                  (forecast.mean_latency, forecast.percentile(99)),
                                  (replayed.mean_latency, replayed.percentile(99))))
    return rows
