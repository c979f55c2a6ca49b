"""Notebook 09's helpers (lessons/measuring.py) and its exercise checkers (exercises/lesson09.py)."""

from __future__ import annotations

import math

import numpy as np
import psutil
import pytest

from infergraph_lite.exercises import lesson09
from infergraph_lite.lessons.measuring import (
    PacedRun,
    Stall,
    ToyModel,
    ValidationRow,
    block_bootstrap,
    cpu_hogs,
    forecast_service,
    naive_interval,
    run_paced,
    serve_load,
    validation_table,
)
from infergraph_lite.serving.batcher import DynamicBatcher


def test_toy_model_is_cold_once_and_costs_more_per_item():
    model = ToyModel(10, 2_000, table_size=10)
    assert model.cold
    model([1])
    assert not model.cold
    assert model([1, 2, 3]) == ToyModel(10, 2_000, table_size=10)([1, 2, 3])


def test_stall_happens_once_after_its_time():
    stall = Stall(list, at=0.0, seconds=0.02)
    assert stall([1]) == [1] and stall.happened is None  # not armed: no stall
    stall.arm()
    stall([1])
    first = stall.happened
    stall([2])
    assert first is not None and stall.happened == first


def test_closed_loop_hides_a_stall_that_open_loop_shows():
    schedule = np.arange(60) * 0.005
    runs = {}
    for clients in (None, 1):
        stall = Stall(list, at=0.1, seconds=0.1)
        with DynamicBatcher(stall, max_batch_size=4) as server:
            stall.arm()
            runs[clients] = run_paced(server, schedule, lambda i: i, clients=clients)
    assert np.sum(runs[None].from_send > 0.05) >= 5
    assert np.sum(runs[1].from_send > 0.05) <= 1
    assert np.sum(runs[1].from_schedule > 0.05) >= 5
    assert np.all(runs[1].sent >= runs[1].intended - 1e-9)


def test_paced_run_rates_and_windows():
    run = PacedRun(np.array([0.0, 1.0, 2.0]), np.array([0.0, 1.5, 2.0]), np.array([0.1, 1.6, 2.1]), "x")
    assert run.rate() == pytest.approx(1.0)
    assert run.rate(run.intended) == pytest.approx(1.0)
    assert run.sent_per_window(1.0)[1].tolist() == [1, 1, 1]


def test_run_paced_refuses_unsorted_arrivals():
    with pytest.raises(ValueError, match="sorted"):
        run_paced(lambda x: None, [1.0, 0.5], lambda i: i)


def test_naive_interval_is_too_narrow_on_correlated_samples():
    rng = np.random.default_rng(0)
    x = np.repeat(rng.normal(size=100), 20)  # bursts of 20 equal values
    assert naive_interval(x)[1] < naive_interval(x[::20])[1] / 2


def test_block_bootstrap_is_seeded_and_wider_for_bursts():
    x = np.repeat(np.random.default_rng(1).exponential(size=300), 10)
    assert block_bootstrap(x, 99, seed=3) == block_bootstrap(x, 99, seed=3)
    plain = block_bootstrap(x, 99)
    blocks = block_bootstrap(x, 99, block=60)
    assert blocks[1] - blocks[0] > plain[1] - plain[0]
    with pytest.raises(ValueError, match="two blocks"):
        block_bootstrap(x[:10], 99, block=6)


def test_cpu_hogs_are_stopped_by_pid():
    with cpu_hogs(2, seconds=10) as pids:
        assert all(psutil.pid_exists(pid) for pid in pids)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_forecast_and_validation_table():
    s = forecast_service([1, 2], [0.001, 0.002], 0.0005)
    assert s(1) == pytest.approx(0.0015)
    row = ValidationRow(0.3, (0.01, 0.02), (0.011, 0.018), (0.01, 0.02))
    assert row.error("forecast") == pytest.approx((0.1, -0.1))
    assert "+10.0 %" in validation_table([row])


def test_serve_load_replays_the_run_and_counts_cpu():
    with DynamicBatcher(ToyModel(200, 200, table_size=10), max_batch_size=4) as server:
        numbers = serve_load(server, 300.0, 60, lambda i: i, load=0.2, forecast=lambda b: 0.001)
    assert len(numbers.from_send) == 60 and len(numbers.client) == 60
    assert numbers.cpu_ms > 0 and numbers.work_ms > 0
    assert 0.5 < numbers.sent_ratio < 1.5
    assert all(math.isfinite(v) for v in (*numbers.row.forecast, *numbers.row.replay))


# --- the checkers: the worked answers pass, plausible wrong answers are rejected with a reason ----------------

def _bootstrap(x, q=99, lo=2.5, hi=97.5, replace=True, seed=0):
    rng = np.random.default_rng(seed)
    values = [np.percentile(rng.choice(x, len(x), replace=replace), q) for _ in range(1000)]
    return tuple(np.percentile(values, [lo, hi]))


def test_check_p99_interval():
    assert lesson09.check_p99_interval(_bootstrap).passed
    wrong = {
        "without replacement": lambda x: _bootstrap(x, replace=False),
        "spread of the data": lambda x: tuple(np.percentile(x, [2.5, 97.5])),
        "around the mean": lambda x: _bootstrap(x, q=50),
        "90 % interval": lambda x: _bootstrap(x, lo=5, hi=95),
    }
    for name, answer in wrong.items():
        feedback = lesson09.check_p99_interval(answer)
        assert feedback.status == "wrong", name


def _closed(schedule, service):
    sent, done, previous = [], [], -np.inf
    for at, cost in zip(schedule, service):
        sent.append(max(at, previous))
        previous = sent[-1] + cost
        done.append(previous)
    return np.array(done) - np.array(sent), np.array(done) - schedule


def test_check_corrected_latencies():
    assert lesson09.check_corrected_latencies(_closed).passed
    def at_schedule(schedule, service):
        return service.copy(), service.copy()

    def uncorrected(schedule, service):
        send, _ = _closed(schedule, service)
        return send, send

    def open_loop(schedule, service):
        _, corrected = _closed(schedule, service)
        return corrected, corrected

    for answer in (at_schedule, uncorrected, open_loop):
        feedback = lesson09.check_corrected_latencies(answer)
        assert feedback.status == "wrong", answer.__name__


def _bisect(meets, low, high, resolution=0.15):
    if not meets(low):
        return None, low
    if meets(high):
        return high, None
    good, bad = low, high
    while bad / good > 1 + resolution:
        mid = math.sqrt(good * bad)
        good, bad = (mid, bad) if meets(mid) else (good, mid)
    return good, bad


def test_check_bisection():
    assert lesson09.check_bisection(_bisect).passed

    def top_as_capacity(meets, low, high, resolution=0.15):
        good, bad = _bisect(meets, low, high, resolution)
        return (good, high) if bad is None else (good, bad)

    def unmeasured_midpoint(meets, low, high, resolution=0.15):
        good, bad = _bisect(meets, low, high, resolution)
        return ((good + bad) / 2, bad) if good and bad else (good, bad)

    def scan(meets, low, high, resolution=0.15):
        if not meets(low):
            return None, low
        rate = low
        while rate * 1.01 <= high and meets(rate * 1.01):
            rate *= 1.01
        return (rate, None) if rate * 1.01 > high else (rate, rate * 1.01)

    for answer in (top_as_capacity, unmeasured_midpoint, scan):
        assert lesson09.check_bisection(answer).status == "wrong", answer.__name__


@pytest.mark.parametrize("name", lesson09.__all__)
def test_every_lesson09_checker_reports_a_stub_as_not_done(name):
    def stub(*_args, **_kwargs):
        raise NotImplementedError("resample with replacement")

    feedback = getattr(lesson09, name)(stub)
    assert feedback.status == "not done" and "resample with replacement" in feedback.message
