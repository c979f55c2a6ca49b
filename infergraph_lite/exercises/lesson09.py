"""Checkers for the exercises of notebook 09, *Measuring a real server honestly*: a bootstrap interval on the
p99 (9.1), latencies corrected for coordinated omission (9.2), and a capacity bisection that never reports the
top of its range (9.3).

>>> import numpy as np
>>> check_corrected_latencies(lambda schedule, service: _reference_closed_loop(schedule, service))
Correct: ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from infergraph_lite.exercises.feedback import checker, require
from infergraph_lite.lessons.measuring import block_bootstrap

__all__ = ["check_bisection", "check_corrected_latencies", "check_p99_interval"]


def _samples() -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(9)
    return [("2,000 exponential latencies", rng.exponential(0.005, 2_000)),
            ("1,000 lognormal latencies", rng.lognormal(-5.0, 0.6, 1_000)),
            ("5,000 latencies with a slow tail", np.r_[rng.normal(0.004, 0.0005, 4_900), rng.uniform(0.02, 0.05, 100)])]


@checker
def check_p99_interval(p99_interval: Callable[..., tuple[float, float]]) -> str:
    """Exercise 9.1: a plain bootstrap 95 % interval (low, high) on the 99th percentile of a run's latencies."""
    widths = []
    for name, x in _samples():
        got = p99_interval(x.copy())
        require(isinstance(got, (tuple, list)) and len(got) == 2, f"{name}: return (low, high), got {got!r}")
        low, high = (float(v) for v in got)
        p99 = float(np.percentile(x, 99))
        require(high > low, f"{name}: the interval has no width ({low:.5g} to {high:.5g}): draw the resamples "
                            "*with* replacement (rng.choice(x, len(x))), or each resample is the run itself")
        data_spread = np.percentile(x, [2.5, 97.5])
        require(not np.allclose([low, high], data_spread, rtol=0.02),
                f"{name}: that is the spread of the latencies themselves (their 2.5th and 97.5th percentiles), not "
                "the uncertainty of their p99: compute the p99 of each resample and take the percentiles of those")
        require(not (low <= x.mean() <= high and not low <= p99 <= high),
                f"{name}: your interval is around the mean ({1e3 * x.mean():.2f} ms), not the p99 ({1e3 * p99:.2f} ms)")
        require(low <= p99 <= high, f"{name}: the run's own p99 ({1e3 * p99:.3f} ms) should lie inside your interval "
                                    f"({1e3 * low:.3f}-{1e3 * high:.3f} ms)")
        ref_low, ref_high = block_bootstrap(x, 99, resamples=4_000, seed=1)
        width = ref_high - ref_low
        require(high - low > 0.75 * width, f"{name}: your interval ({1e3 * low:.3f}-{1e3 * high:.3f} ms) is narrower "
                f"than a 95 % bootstrap's ({1e3 * ref_low:.3f}-{1e3 * ref_high:.3f} ms): a 95 % interval cuts 2.5 % "
                "from each end of the resampled p99s, not 5 %")
        require(high - low < 1.35 * width, f"{name}: your interval ({1e3 * low:.3f}-{1e3 * high:.3f} ms) is wider than "
                f"a 95 % bootstrap's ({1e3 * ref_low:.3f}-{1e3 * ref_high:.3f} ms): cut 2.5 % from each end")
        require(abs(low - ref_low) < 0.3 * width and abs(high - ref_high) < 0.3 * width,
                f"{name}: your interval ({1e3 * low:.3f}-{1e3 * high:.3f} ms) is off a bootstrap's "
                f"({1e3 * ref_low:.3f}-{1e3 * ref_high:.3f} ms)")
        widths.append((high - low) / p99)
    return (f"a plain bootstrap interval on the p99. Its width is {100 * widths[0]:.0f} % of the p99 for 2,000 "
            "independent latencies; a real run's latencies come in bursts, so the lesson's block bootstrap and "
            "repetitions are wider still.")


def _reference_closed_loop(schedule: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sent, done = np.empty(len(schedule)), np.empty(len(schedule))
    previous = -math.inf
    for i, (at, cost) in enumerate(zip(schedule, service)):
        sent[i] = max(at, previous)
        done[i] = previous = sent[i] + cost
    return done - sent, done - schedule


def _traces() -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    schedule = np.arange(200) * 0.010
    service = rng.uniform(0.002, 0.004, 200)
    stalled = service.copy()
    stalled[80] = 0.3  # the server stalls for 0.3 s on request 80
    busy = rng.uniform(0.008, 0.012, 200)  # near saturation: a queue forms without any stall
    return [("a steady server", schedule, service), ("a 0.3 s stall on request 80", schedule, stalled),
            ("a server near saturation", schedule, busy)]


@checker
def check_corrected_latencies(closed_loop: Callable[[np.ndarray, np.ndarray], Any]) -> str:
    """Exercise 9.2: one closed-loop client over one server: latencies from the send and from the schedule."""
    for name, schedule, service in _traces():
        got = closed_loop(schedule.copy(), service.copy())
        require(isinstance(got, (tuple, list)) and len(got) == 2, f"{name}: return (from_send, from_schedule)")
        from_send, from_schedule = (np.asarray(v, dtype=float) for v in got)
        want_send, want_schedule = _reference_closed_loop(schedule, service)
        require(from_send.shape == want_send.shape and from_schedule.shape == want_schedule.shape,
                f"{name}: return one latency per request ({len(schedule)}) in each array")
        if not np.allclose(want_schedule, want_send):  # a request here waited for its client: the mistakes differ
            require(not (np.allclose(from_send, service) and np.allclose(from_schedule, service)),
                    f"{name}: your client sends each request at its scheduled time even while the previous one is "
                    "unanswered: a closed-loop client sends only once its previous answer is back")
            require(not np.allclose(from_send, want_schedule), f"{name}: your latencies from the send are an open "
                    "loop's (each request queued from its scheduled time); a closed-loop client *sends* late instead")
            require(not np.allclose(from_schedule, from_send), f"{name}: your corrected latencies equal the "
                    "uncorrected ones: count the corrected ones from the *scheduled* time, not from the send")
        require(np.allclose(from_send, want_send), f"{name}: the latencies from the send are off (the first wrong at "
                f"request {int(np.argmax(~np.isclose(from_send, want_send)))}): a request is sent at its time or when "
                "the previous answer is back, whichever is later")
        require(np.allclose(from_schedule, want_schedule), f"{name}: the latencies from the schedule are off (the "
                f"first wrong at request {int(np.argmax(~np.isclose(from_schedule, want_schedule)))})")
    _, schedule, service = _traces()[1]
    send, corrected = _reference_closed_loop(schedule, service)
    return (f"with the stall, {int(np.sum(send > 0.1))} request is over 100 ms timed from its send and "
            f"{int(np.sum(corrected > 0.1))} timed from its schedule. With one client and one server the corrected "
            "latencies are exactly those an open loop would measure: the send waits where the queue would have.")


@checker
def check_bisection(highest_rate: Callable[..., tuple[float | None, float | None]]) -> str:
    """Exercise 9.3 (stretch): the bracket (meets, fails) around the highest rate meeting a p99 target."""
    cases = [(37.0, 10, 1000), (820.0, 10, 1000), (1500.0, 10, 1000), (5.0, 10, 1000), (10.0, 10, 1000)]
    calls_used = []
    for edge, low, high in cases:
        measured: list[float] = []

        def meets(rate: float, edge: float = edge, measured: list[float] = measured) -> bool:
            measured.append(float(rate))
            return rate <= edge  # the p99 meets the target up to the edge

        got = highest_rate(meets, low, high, resolution=0.15)
        require(isinstance(got, (tuple, list)) and len(got) == 2, f"return (meets, fails), got {got!r}")
        good, bad = got
        where = f"with the edge at {edge:g} req/s in [{low}, {high}]"
        if edge >= high:
            require(bad is None and good == high, f"{where}: the top of the range met the target, so the capacity is "
                    f"only *at least* {high}: return ({high}, None), never a number above what was measured, and not "
                    f"{high} as if it were the edge (you returned {got!r})")
            continue
        if edge < low:
            require(good is None and bad == low, f"{where}: even the lowest rate missed: return (None, {low})")
            continue
        require(good is not None and bad is not None, f"{where}: the edge is inside the range, so both rates are "
                                                      f"numbers; you returned {got!r}")
        good, bad = float(good), float(bad)  # type: ignore[arg-type]  # both checked above
        require(good in measured and bad in measured, f"{where}: report rates you measured (meets() was called "
                f"with {sorted(set(measured))[:6]}...), not a midpoint you did not try")
        require(good <= edge < bad, f"{where}: ({good:g}, {bad:g}) does not bracket the edge")
        require(bad / good <= 1.15 + 1e-9, f"{where}: bisect until fails / meets <= 1.15; yours is {bad / good:.3f}")
        require(len(measured) <= 20, f"{where}: {len(measured)} measurements; bisection needs about ten: halve the "
                                     "bracket each time, don't scan")
        calls_used.append(len(measured))
    return (f"your bisection needed at most {max(calls_used)} measurements per search, and says \"at least\" when the "
            "top of the range still meets the target.")
