"""How an engine is measured so the numbers can be signed: repetitions, intervals, bisection, per-hop cost, CPU.

One procedure for every engine that answers ``submit(item) -> Future`` (a ``GraphServer``, a Triton
client, a Ray Serve graph), used by notebook 07's comparison and ``benchmarks/bench_frameworks.py``:

- :func:`measure_rate`: at one open-loop rate, a warm-up, then ``repetitions`` runs of a fixed length
  (``duration`` seconds of arrivals, at least ``min_requests``), each with its own seeded Poisson
  arrivals; the rate each run *actually sent* is measured, not assumed.  :class:`RateResult` gives a
  Student-t 95 % interval on the mean latency and the range of p99 across repetitions.  The measured runs
  happen with the load generator's heap frozen (:func:`frozen_heap`): the client libraries of Ray and
  Triton hold ~240,000 objects, and one full collection of them stops this process for ~100 ms, which
  would put the *generator's* pause in every engine's p99.
- :func:`find_capacity`: the highest rate meeting a p99 target, by bisection between a rate that meets it
  and one that does not; when the highest rate tried still meets it the answer says "≥", never a number.
- :func:`per_hop_cost`: latency against chain length, fitted; the slope (with its interval) is what one
  more hop adds.

Where an engine's time goes while it is measured (CPU per process, batch sizes) is
:mod:`~infergraph_lite.serving.watch`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.core.metrics import t_quantile
from infergraph_lite.core.stage import Stage
from infergraph_lite.serving.loadtest import LoadReport, run_open_loop

__all__ = ["ROW_HEADER", "Capacity", "FactoryFn", "HopCost", "RateResult", "find_capacity", "frozen_heap",
           "in_worker_processes", "mean_interval", "measure_rate", "noop_batch", "noop_chain_stages", "per_hop_cost",
           "poisson_arrivals", "t_quantile"]


def mean_interval(values: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its Student-t 95 % interval; a single value has an infinite interval.

    >>> m, lo, hi = mean_interval([1.0, 2.0, 3.0])
    >>> m, round(lo, 3), round(hi, 3)
    (2.0, -0.484, 4.484)
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("values must hold at least one number")
    mean = float(x.mean())
    if x.size == 1:
        return mean, -math.inf, math.inf
    half = t_quantile(0.95, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def poisson_arrivals(rate: float, n: int, seed: int, *, exact_rate: bool = False) -> np.ndarray:
    """``n`` seeded Poisson arrival offsets (seconds) at ``rate`` per second, the first at 0.

    A short sample's own rate, (n - 1) / last, strays from ``rate`` (20-40 arrivals: 16-23 %, one standard
    deviation).  ``exact_rate=True`` rescales the gaps by one factor so that it is exactly ``rate``: a Poisson
    process conditioned on its count over the run (the gaps keep their shape), so a load's label is the load
    offered.

    >>> poisson_arrivals(100.0, 3, seed=1).round(4).tolist()
    [0.0, 0.0031, 0.0568]
    >>> a = poisson_arrivals(5.0, 30, seed=1, exact_rate=True)
    >>> float(a[0]), round((len(a) - 1) / float(a[-1]), 12), bool(np.all(np.diff(a) > 0))
    (0.0, 5.0, True)
    """
    rate = check_number("rate", rate)
    n = check_count("n", n)
    if exact_rate and n < 2:
        raise ValueError(f"n must be at least 2 for an exact rate (n - 1 gaps), got {n}")
    gaps = np.random.default_rng(seed).exponential(1 / rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]
    if exact_rate:
        arrivals *= (n - 1) / rate / arrivals[-1]
    return arrivals


class _Stamped:
    # The target's submit, recording when each request was actually sent; per-stage records pass through.
    def __init__(self, target: Any):
        self._submit = getattr(target, "submit", target)
        self._owner = getattr(self._submit, "__self__", target)
        self.sent: list[float] = []

    def submit(self, item: Any) -> Future:
        self.sent.append(time.perf_counter())
        return self._submit(item)

    def stage_records(self) -> Mapping[str, Sequence[Any]]:
        records = getattr(self._owner, "stage_records", None)
        return records() if callable(records) else {}


@dataclass(frozen=True)
class RateResult:
    """Repeated open-loop runs at one scheduled ``rate`` (req/s): their reports and the rates actually sent."""

    rate: float
    reports: tuple[LoadReport, ...]
    sent: tuple[float, ...]  # req/s each run really submitted: (n - 1) / (last submit - first submit)
    scheduled: tuple[float, ...] = ()  # req/s each run's Poisson schedule held: (n - 1) / last arrival

    @property
    def sent_ratio(self) -> float:
        """Sent / scheduled, worst run: below 1 the generator fell behind its own schedule (a busy machine)."""
        pairs = [s / c for s, c in zip(self.sent, self.scheduled) if c > 0]
        return min(pairs) if pairs else math.nan

    @property
    def means(self) -> np.ndarray:
        return np.asarray([r.mean for r in self.reports])

    @property
    def p99s(self) -> np.ndarray:
        return np.asarray([r.percentile(99) for r in self.reports])

    @property
    def mean(self) -> tuple[float, float, float]:
        """Mean latency over the repetitions' means, with its Student-t 95 % interval (seconds)."""
        return mean_interval(self.means)

    @property
    def p99_range(self) -> tuple[float, float]:
        """The lowest and highest p99 of the repetitions (seconds)."""
        return float(self.p99s.min()), float(self.p99s.max())

    @property
    def served(self) -> float:
        """Answered requests per second, mean over the repetitions."""
        return float(np.mean([r.throughput for r in self.reports]))

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.reports)

    @property
    def refused(self) -> int:
        return sum(r.refused for r in self.reports)

    @property
    def max_lag(self) -> float:
        """How far behind its schedule the generator fell at worst, over all repetitions (seconds)."""
        return max(r.max_lag for r in self.reports)

    def meets(self, p99_target: float) -> bool:
        """Every repetition answered every request, and the worst repetition's p99 is within the target."""
        return self.failed == 0 and self.refused == 0 and self.p99_range[1] <= p99_target

    def row(self) -> list[Any]:
        """One table row: nominal, scheduled, sent, served req/s; runs; mean ± its 95 % half-width and the p99
        range (ms); failed + refused; max lag ms (:data:`ROW_HEADER` names them)."""
        mean, _, hi = self.mean
        p_lo, p_hi = self.p99_range
        return [self.rate, float(np.mean(self.scheduled)) if self.scheduled else math.nan, float(np.mean(self.sent)),
                self.served, len(self.reports),
                f"{1e3 * mean:.3g} ± {1e3 * (hi - mean):.2g}", f"{1e3 * p_lo:.3g}-{1e3 * p_hi:.3g}",
                self.failed + self.refused, 1e3 * self.max_lag]


ROW_HEADER = ["rate req/s", "scheduled req/s", "sent req/s", "served req/s", "runs", "mean ms (95% CI)", "p99 range ms",
              "failed+refused", "max lag ms"]


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect once, then move every object this process holds out of the collector's reach for the block.

    Python's collector walks every tracked object in a full collection; with Ray's and Triton's client
    libraries imported that is ~240,000 objects and ~100 ms during which no thread of this process runs
    (notebook 05 measures the same pause in a batcher).  ``gc.freeze`` is how long-running Python servers
    avoid it (objects created before serving are never collected); objects made inside the block are
    collected as usual.  A heap already frozen by the caller stays frozen.

    >>> with frozen_heap():
    ...     gc.get_freeze_count() > 0
    True
    """
    already = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not already:
            gc.unfreeze()


def measure_rate(
    target: Any,
    rate: float,
    make_item: Callable[[int], Any],
    *,
    duration: float = 5.0,
    min_requests: int = 100,
    warmup: float = 1.0,
    repetitions: int = 3,
    seed: int = 0,
    timeout: float = 60.0,
    p99_target: float | None = None,
) -> RateResult:
    """Open-loop load at ``rate`` req/s: a ``warmup``-second run (discarded), then ``repetitions`` measured runs.

    Each measured run sends ``max(ceil(rate * duration), min_requests)`` requests on seeded Poisson
    arrivals (seed ``seed + k`` for run ``k``, so every engine gets the same schedule); the rate it
    really sent is measured from its submit times; each measured run holds the heap frozen
    (:func:`frozen_heap`).  ``target`` is anything
    :func:`~infergraph_lite.serving.loadtest.run_open_loop` drives.  With ``p99_target``, the runs stop
    after the first that misses it (or fails a request): the rate has failed, and a longer overload
    would only build a backlog that the next rate inherits.

    >>> from infergraph_lite.serving.batcher import DynamicBatcher
    >>> with DynamicBatcher(lambda xs: xs, max_batch_size=8) as b:
    ...     result = measure_rate(b, 200, lambda i: i, duration=0.1, min_requests=30, warmup=0.05)
    >>> [len(r.latencies) for r in result.reports], result.failed
    ([30, 30, 30], 0)
    """
    rate = check_number("rate", rate)
    duration = check_number("duration", duration)
    warmup = check_number("warmup", warmup, positive=False)
    min_requests = check_count("min_requests", min_requests)
    repetitions = check_count("repetitions", repetitions)
    if warmup > 0:
        run_open_loop(target, poisson_arrivals(rate, max(2, math.ceil(rate * warmup)), seed + 10_000),
                      make_item, timeout=timeout)
    n = max(math.ceil(rate * duration), min_requests)
    reports, sent, scheduled = [], [], []
    for k in range(repetitions):
        stamped = _Stamped(target)
        arrivals = poisson_arrivals(rate, n, seed + k)
        scheduled.append((n - 1) / arrivals[-1] if n > 1 and arrivals[-1] > 0 else 0.0)
        with frozen_heap():  # the generator's own collections stay out of the engine's latencies
            reports.append(run_open_loop(stamped, arrivals, make_item, timeout=timeout))
        times = stamped.sent
        sent.append((len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0)
        last = reports[-1]
        if p99_target is not None and (last.failed or last.refused or last.percentile(99) > p99_target):
            break
    return RateResult(float(rate), tuple(reports), tuple(sent), tuple(scheduled))


@dataclass(frozen=True)
class Capacity:
    """The highest rate found meeting a p99 target: ``meets`` met it, ``fails`` (above it) did not.

    ``fails is None``: the highest rate tried still met the target, so the capacity is *at least* ``meets``
    (censored); ``meets is None``: even the lowest rate tried missed it.
    """

    p99_target: float
    meets: float | None
    fails: float | None
    results: dict[float, RateResult] = field(default_factory=dict)

    @property
    def censored(self) -> bool:
        return self.fails is None

    def __str__(self) -> str:
        if self.meets is None:
            return f"< {self.fails:g} req/s"
        if self.fails is None:
            return f">= {self.meets:g} req/s"
        return f"{self.meets:g} req/s (fails at {self.fails:g})"


def find_capacity(
    measure: Callable[[float], RateResult],
    low: float,
    high: float,
    p99_target: float,
    *,
    resolution: float = 0.15,
    max_steps: int = 8,
    growth: float | None = None,
    start: float | None = None,
) -> Capacity:
    """Bisect for the highest rate whose :meth:`RateResult.meets` the target, between ``low`` and ``high``.

    ``measure(rate)`` runs one rate (e.g. a :func:`measure_rate` closure).  ``low`` (or ``start``, below) is
    measured first: if it misses, the answer is "below ``low``".  Then ``high``: if it meets, "at least
    ``high``" (the top of the range is never reported as the capacity).  Otherwise the geometric midpoint of
    the bracket is measured until ``fails / meets <= 1 + resolution`` or ``max_steps`` midpoints have run.
    With ``growth`` (> 1), the bracket is found from below instead: ``low``, ``low * growth``, ... up to
    ``high``, stopping at the first miss, so no rate is ever more than ``growth`` times one that met the
    target (an engine far below ``high`` is not flooded with a backlog it needs minutes to drain).
    With ``start`` as well (a rate the caller expects to meet, ``low * growth**k``), the bracket starts there:
    if ``start`` meets, it grows from it as from ``low``; if it misses, it shrinks by ``growth`` (down to
    ``low``) until a rate meets.  With ``start`` on that grid the rates measured are the climb's own, so the
    bracket found is the one the climb from ``low`` finds, without the slow runs far below the edge (at low
    rates ``min_requests`` makes every run long); a ``start`` off the grid measures a grid of its own.

    >>> fake = lambda rate: RateResult(rate, (LoadReport(np.full(10, rate / 1000), 1.0),), (rate,))
    >>> str(find_capacity(fake, 10, 1000, p99_target=0.1))  # p99 = rate/1000 s, so 100 req/s is the edge
    '100 req/s (fails at 115)'
    >>> str(find_capacity(fake, 10, 50, p99_target=0.1))
    '>= 50 req/s'
    >>> capacity = find_capacity(fake, 10, 1000, p99_target=0.1, growth=2)
    >>> str(capacity), sorted(capacity.results)
    ('95 req/s (fails at 104)', [10.0, 20.0, 40.0, 80.0, 95.0, 104.0, 113.0, 160.0])
    >>> for start in (40, 320):  # from below the edge, or above it: the same bracket, fewer rates
    ...     capacity = find_capacity(fake, 10, 1000, p99_target=0.1, growth=2, start=start)
    ...     print(capacity, sorted(capacity.results))
    95 req/s (fails at 104) [40.0, 80.0, 95.0, 104.0, 113.0, 160.0]
    95 req/s (fails at 104) [80.0, 95.0, 104.0, 113.0, 160.0, 320.0]
    """
    low = check_number("low", low)
    high = check_number("high", high)
    if high <= low:
        raise ValueError(f"high must be above low, got low={low!r}, high={high!r}")
    p99_target = check_number("p99_target", p99_target)
    resolution = check_number("resolution", resolution)
    results: dict[float, RateResult] = {}

    def meets(rate: float) -> bool:
        results[rate] = measure(rate)
        return results[rate].meets(p99_target)

    if growth is not None and check_number("growth", growth) <= 1:
        raise ValueError(f"growth must be above 1, got {growth!r}")
    first = low
    if start is not None:
        if growth is None:
            raise ValueError("start needs growth: the bracket grows or shrinks from it by that factor")
        first = check_number("start", start)
        if not low <= first < high:
            raise ValueError(f"start must be at least low and below high, got start={start!r}, low={low!r}, "
                             f"high={high!r}")
    good, bad = first, high
    if not meets(first):
        while True:  # shrink: the first rate that meets, at most growth below one that missed
            if good <= low:
                return Capacity(p99_target, None, low, results)
            bad, good = good, max(good / growth, low)  # type: ignore[operator]
            if meets(good):
                break
    elif growth is not None:
        while good < high:
            step = min(good * growth, high)
            if not meets(step):
                bad = step
                break
            good = step
        else:
            return Capacity(p99_target, high, None, results)
    elif meets(high):
        return Capacity(p99_target, high, None, results)
    for _ in range(check_count("max_steps", max_steps)):
        if bad / good <= 1 + resolution:
            break
        mid = math.sqrt(good * bad)
        mid = float(round(mid)) if mid >= 10 else round(mid, 2)  # whole req/s read better, and change nothing
        if mid in (good, bad):
            break
        if meets(mid):
            good = mid
        else:
            bad = mid
    return Capacity(p99_target, good, bad, results)


@dataclass(frozen=True)
class HopCost:
    """Latency = ``base + per_hop * hops``, fitted over every request (``center="mean"``) or through each chain
    length's median latency (``center="median"``); seconds."""

    per_hop: float
    base: float
    interval: tuple[float, float]  # 95 % interval on per_hop: Student-t (mean) or bootstrap percentiles (median)
    n: int
    center: str = "mean"

    def __str__(self) -> str:
        lo, hi = self.interval
        return (f"{1e3 * self.per_hop:.3f} ms per hop (95% CI {1e3 * lo:.3f}-{1e3 * hi:.3f}"
                f"{', medians' if self.center == 'median' else ''}), base {1e3 * self.base:.3f} ms")


def per_hop_cost(latencies: Mapping[int, Sequence[float] | np.ndarray], *, center: str = "mean",
                 resamples: int = 1000, seed: int = 0) -> HopCost:
    """Fit latency against chain length: ``latencies`` maps a number of hops to the latencies measured on it.

    The slope is what one more hop adds.  ``center="mean"``: least squares over every request, its interval from
    the fit's standard error.  ``center="median"``: least squares through each length's median latency, its
    interval from ``resamples`` bootstrap resamples of each length's latencies (seeded); a few stalls of a
    millisecond, which on a fast machine outweigh a hop of tens of microseconds in the mean, do not move it.

    >>> rng = np.random.default_rng(0)
    >>> cost = per_hop_cost({h: 0.002 + 0.001 * h + rng.normal(0, 1e-4, 200) for h in (1, 3, 6)})
    >>> round(cost.per_hop * 1e3, 2), cost.interval[0] < 0.001 < cost.interval[1]
    (1.0, True)
    >>> stalled = {h: np.r_[0.002 + 0.001 * h + rng.normal(0, 1e-4, 190), [0.05] * (10 if h == 1 else 0)]
    ...            for h in (1, 6)}
    >>> round(per_hop_cost(stalled).per_hop * 1e3, 2), round(per_hop_cost(stalled, center="median").per_hop * 1e3, 2)
    (0.53, 1.0)
    """
    if center not in ("mean", "median"):
        raise ValueError(f"center must be 'mean' or 'median', got {center!r}")
    if len(latencies) < 2:
        raise ValueError(f"latencies must cover at least two chain lengths, got {sorted(latencies)}")
    x = np.concatenate([np.full(len(v), float(h)) for h, v in latencies.items()])
    y = np.concatenate([np.asarray(v, dtype=float) for v in latencies.values()])
    if x.size < 3:
        raise ValueError("latencies must hold at least three measurements in all")
    if center == "median":
        hops = np.array(sorted(latencies), dtype=float)
        samples = [np.asarray(latencies[int(h)], dtype=float) for h in hops]
        if any(len(v) == 0 for v in samples):
            raise ValueError("latencies: every chain length needs at least one measurement")
        slope, base = np.polyfit(hops, [np.median(v) for v in samples], 1)
        rng = np.random.default_rng(seed)
        slopes = [np.polyfit(hops, [np.median(rng.choice(v, len(v))) for v in samples], 1)[0]
                  for _ in range(check_count("resamples", resamples))]
        low, high = np.percentile(slopes, [2.5, 97.5])
        return HopCost(float(slope), float(base), (float(low), float(high)), int(x.size), "median")
    slope, base = np.polyfit(x, y, 1)
    residual = y - (base + slope * x)
    se = math.sqrt(float(residual @ residual) / (x.size - 2) / float(((x - x.mean()) ** 2).sum()))
    half = t_quantile(0.95, x.size - 2) * se
    return HopCost(float(slope), float(base), (float(slope - half), float(slope + half)), int(x.size))


def noop_batch(items: list[Any]) -> list[Any]:
    """A batch function that does nothing: each item comes back as it went in (picklable by name)."""
    return list(items)


def noop_chain_stages(hops: int, inputs: str = "request") -> dict[str, tuple[Stage, list[str]]]:
    """A chain of ``hops`` no-op stages, ``hop1 -> hop2 -> ...``: what an engine adds per hop, and nothing else.

    >>> list(noop_chain_stages(3)), noop_chain_stages(3)["hop3"][1]
    (['hop1', 'hop2', 'hop3'], ['hop2'])
    """
    hops = check_count("hops", hops)
    return {f"hop{k}": (Stage(fn=noop_batch), [inputs if k == 1 else f"hop{k - 1}"]) for k in range(1, hops + 1)}


_BUILT: dict[tuple[str, str], Callable[[list[Any]], Any]] = {}  # per process: each factory's graph, built once


def _build(factory: str) -> Mapping[str, tuple[Any, Sequence[str]]]:
    module, _, name = factory.partition(":")
    if not module or not name:
        raise ValueError(f"factory should be 'module:function', got {factory!r}")
    return getattr(importlib.import_module(module), name)()


@dataclass(frozen=True)
class FactoryFn:
    """Stage ``node``'s fn, rebuilt from ``factory`` (``"module:function"``) in whichever process calls it.

    Pickles as two strings, so a graph whose functions are closures (the text pipeline's) can still run
    in ``GraphServer(workers="processes")``: each worker builds the graph once, as Triton's stubs do.
    """

    factory: str
    node: str

    def __call__(self, batch: list[Any]) -> Any:
        key = (self.factory, self.node)
        if key not in _BUILT:
            _BUILT[key] = _build(self.factory)[self.node][0].fn
        return _BUILT[key](batch)


def in_worker_processes(stages: Mapping[str, tuple[Stage, Sequence[str]]], factory: str
                        ) -> dict[str, tuple[Stage, Sequence[str]]]:
    """``stages`` with every fn replaced by a :class:`FactoryFn` of ``factory``, checked to build the same nodes.

    >>> from infergraph_lite.lessons.examples import cpu_bound_stages
    >>> spec = "infergraph_lite.lessons.examples:cpu_bound_stages"
    >>> stages = in_worker_processes(cpu_bound_stages(), spec)
    >>> stages["parse"][0].fn([1, 2]) == cpu_bound_stages()["parse"][0].fn([1, 2])
    True
    >>> in_worker_processes(noop_chain_stages(1), spec)
    Traceback (most recent call last):
    ...
    ValueError: factory '...:cpu_bound_stages' builds nodes ['parse', 'score'], not ['hop1']
    """
    built = _build(factory)
    if list(built) != list(stages):
        raise ValueError(f"factory {factory!r} builds nodes {list(built)}, not {list(stages)}")
    return {name: (dataclasses.replace(stage, fn=FactoryFn(factory, name)), deps)
            for name, (stage, deps) in stages.items()}
