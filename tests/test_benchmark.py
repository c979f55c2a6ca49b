"""The measurement procedure of notebook 07 and bench_frameworks: repetitions, intervals, bisection, hop fit.

No timing assertion: the server under test is a DynamicBatcher on a sleep, and what is checked is the
procedure (how many requests, how many runs, what is reported, which rates bisection visits), not speed.
"""

from __future__ import annotations

import gc
import math
import os
import time

import numpy as np
import pytest

from infergraph_lite.serving.batcher import DynamicBatcher
from infergraph_lite.serving.benchmark import (
    RateResult,
    find_capacity,
    frozen_heap,
    mean_interval,
    measure_rate,
    noop_chain_stages,
    per_hop_cost,
    poisson_arrivals,
    t_quantile,
)
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import LoadReport
from infergraph_lite.serving.watch import CpuMeter, batch_counts, watch_rate


def fake_result(rate: float, p99: float, failed: int = 0, refused: int = 0) -> RateResult:
    reports = tuple(LoadReport(np.full(20, p99), 1.0, failed=failed, refused=refused) for _ in range(3))
    return RateResult(rate, reports, (rate,) * 3)


def test_t_interval_is_students_and_widens_with_fewer_runs():
    assert t_quantile(0.95, 2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(0.95, 10) > t_quantile(0.95, 11) > 1.96  # fewer runs, a wider interval
    mean, lo, hi = mean_interval([10.0, 12.0, 14.0])
    assert mean == 12.0 and hi - mean == pytest.approx(mean - lo)
    assert hi - mean == pytest.approx(4.303 * 2.0 / math.sqrt(3), rel=1e-3)
    assert mean_interval([5.0]) == (5.0, -math.inf, math.inf)
    with pytest.raises(ValueError, match="values"):
        mean_interval([])
    with pytest.raises(ValueError, match="df"):
        t_quantile(0.95, 0)


def test_bisection_brackets_the_edge_and_never_reports_the_top_of_the_range():
    visited: list[float] = []

    def measure(rate: float) -> RateResult:
        visited.append(rate)
        return fake_result(rate, p99=rate / 1000)  # meets a 100 ms target up to 100 req/s

    cap = find_capacity(measure, 10, 1000, p99_target=0.1, resolution=0.1)
    assert visited[:2] == [10, 1000]
    assert cap.meets is not None and cap.fails is not None
    assert cap.meets <= 100 < cap.fails and cap.fails / cap.meets <= 1.1
    assert not cap.censored and set(cap.results) == set(visited)
    # the top of the range meets the target: the answer is a lower bound, said as one
    top = find_capacity(measure, 10, 60, p99_target=0.1)
    assert top.censored and top.meets == 60 and str(top) == ">= 60 req/s"
    low = find_capacity(measure, 200, 400, p99_target=0.1)
    assert low.meets is None and str(low) == "< 200 req/s"


def test_growing_bracket_never_runs_far_above_a_rate_that_met_the_target():
    visited: list[float] = []

    def measure(rate: float) -> RateResult:
        visited.append(rate)
        return fake_result(rate, p99=rate / 1000)

    cap = find_capacity(measure, 10, 10_000, p99_target=0.1, growth=2)
    assert 10_000 not in visited and visited[:5] == [10, 20, 40, 80, 160]
    passed = [r for r in visited if r <= 100]
    assert all(r <= 2 * max(p for p in passed if p < r) for r in visited if r > 10)
    assert cap.meets is not None and cap.meets <= 100 < (cap.fails or 0)
    assert str(find_capacity(measure, 10, 70, p99_target=0.1, growth=2)) == ">= 70 req/s"  # capped at high
    with pytest.raises(ValueError, match="growth"):
        find_capacity(measure, 10, 70, p99_target=0.1, growth=1)


def test_a_bracket_started_near_the_edge_finds_what_the_climb_from_low_finds():
    def edge_at(limit: float):
        visited: list[float] = []

        def measure(rate: float) -> RateResult:
            visited.append(rate)
            return fake_result(rate, p99=0.05 if rate <= limit else 0.2)
        return measure, visited

    for limit in (5, 10, 35, 100, 700, 5_000):  # below low, at low, below start, above it, near high, above high
        climb, _ = edge_at(limit)
        expected = find_capacity(climb, 10, 1280, p99_target=0.1, growth=2, resolution=0.3)
        for start in (10, 80, 640):
            measure, visited = edge_at(limit)
            got = find_capacity(measure, 10, 1280, p99_target=0.1, growth=2, resolution=0.3, start=start)
            assert (got.meets, got.fails) == (expected.meets, expected.fails), (limit, start)
            assert visited[0] == start and len(visited) == len(set(visited))
            # it shrinks by growth from start until a rate meets (or low misses), then climbs or bisects
            shrink = [start]
            while shrink[-1] > limit and shrink[-1] > 10:
                shrink.append(shrink[-1] / 2)
            assert visited[:len(shrink)] == shrink, (limit, start, visited)
    with pytest.raises(ValueError, match="start needs growth"):
        find_capacity(climb, 10, 1280, p99_target=0.1, start=80)
    with pytest.raises(ValueError, match="start must be at least low and below high"):
        find_capacity(climb, 10, 1280, p99_target=0.1, growth=2, start=1280)


def test_a_missed_repetition_ends_the_rate():
    def slow(items):
        time.sleep(0.01)
        return items

    with DynamicBatcher(slow, max_batch_size=1) as batcher:
        result = measure_rate(batcher, 500, lambda i: i, duration=0.05, min_requests=20, warmup=0,
                              p99_target=0.001)
    assert len(result.reports) == 1 and not result.meets(0.001)


def test_failed_or_refused_requests_miss_the_target_whatever_the_latency():
    assert fake_result(10, 0.001).meets(0.1)
    assert not fake_result(10, 0.001, failed=1).meets(0.1)
    assert not fake_result(10, 0.001, refused=1).meets(0.1)


def test_bad_arguments_are_named_before_anything_runs():
    with pytest.raises(ValueError, match="high must be above low"):
        find_capacity(lambda r: fake_result(r, 0.0), 100, 10, 0.1)
    with pytest.raises(ValueError, match="p99_target"):
        find_capacity(lambda r: fake_result(r, 0.0), 1, 10, 0)
    with pytest.raises(ValueError, match="repetitions"):
        measure_rate(lambda x: None, 10, lambda i: i, repetitions=0)
    with pytest.raises(ValueError, match="rate"):
        measure_rate(lambda x: None, -1, lambda i: i)


def test_measure_rate_warms_up_then_runs_fixed_repetitions_on_a_sleeping_batcher():
    def sleepy(items):
        time.sleep(0.002)
        return items

    with DynamicBatcher(sleepy, max_batch_size=8, max_wait=0.0) as batcher:
        result = measure_rate(batcher, 100, lambda i: i, duration=0.2, min_requests=25, warmup=0.1, repetitions=3)
        answered = len(batcher.records)
    assert [len(r.latencies) for r in result.reports] == [25, 25, 25]  # max(ceil(100 * 0.2), 25)
    assert answered == 3 * 25 + 10  # the warm-up ran, and is not in the results
    assert len(result.sent) == 3 and all(s > 0 for s in result.sent)
    mean, lo, hi = result.mean
    assert lo <= mean <= hi and result.p99_range[0] <= result.p99_range[1]
    assert result.failed == result.refused == 0 and result.max_lag >= 0
    assert len(result.row()) == 9 and len(result.scheduled) == 3 and result.sent_ratio > 0
    # the schedule is seeded: the same seed gives every engine the same arrivals
    assert np.array_equal(poisson_arrivals(100, 25, 0), poisson_arrivals(100, 25, 0))


def test_an_exact_rate_schedule_offers_its_label_and_keeps_the_gaps_shape():
    plain, exact = poisson_arrivals(20.0, 30, 4), poisson_arrivals(20.0, 30, 4, exact_rate=True)
    assert (len(exact) - 1) / exact[-1] == pytest.approx(20.0, rel=1e-12)
    assert np.allclose(np.diff(exact) / np.diff(plain), exact[-1] / plain[-1])  # one factor for every gap
    with pytest.raises(ValueError, match="n must be at least 2"):
        poisson_arrivals(20.0, 1, 4, exact_rate=True)


def test_refusals_are_counted_and_miss_the_target():
    def slow(items):
        time.sleep(0.02)
        return items

    with DynamicBatcher(slow, max_batch_size=1, max_queue_size=1) as batcher:
        result = measure_rate(batcher, 2000, lambda i: i, duration=0.01, min_requests=20, warmup=0, repetitions=1)
    assert result.refused > 0 and not result.meets(10.0)


def test_per_hop_fit_recovers_a_known_slope_and_refuses_one_length():
    rng = np.random.default_rng(3)
    cost = per_hop_cost({h: 0.004 + 0.0005 * h + rng.normal(0, 2e-4, 100) for h in (1, 3, 6)})
    assert cost.interval[0] < 0.0005 < cost.interval[1] and cost.n == 300
    assert cost.base == pytest.approx(0.004, abs=3e-4)
    with pytest.raises(ValueError, match="two chain lengths"):
        per_hop_cost({2: [0.1, 0.2]})


def test_the_median_hop_fit_ignores_a_few_stalls_that_swing_the_mean_fit():
    # A hop of 50 us, and sixteen 2 ms stalls among the longer chain's 200 requests: the mean fit puts the hop
    # over 40 % too high, the median fit does not move, and its bootstrap interval holds the true hop.
    rng = np.random.default_rng(4)
    clean = {h: 0.0002 + 0.00005 * h + rng.normal(0, 1e-5, 200) for h in (1, 6)}
    stalled = {1: clean[1], 6: np.r_[clean[6][:184], [0.002] * 16]}
    mean, median = per_hop_cost(stalled), per_hop_cost(stalled, center="median")
    assert mean.per_hop > 1.4 * 0.00005
    assert median.per_hop == pytest.approx(0.00005, rel=0.05) and median.center == "median"
    assert median.interval[0] < 0.00005 < median.interval[1] and median.n == 400
    assert per_hop_cost(stalled, center="median") == median            # seeded: the same interval again
    with pytest.raises(ValueError, match="center must be 'mean' or 'median', got 'mode'"):
        per_hop_cost(clean, center="mode")


def test_noop_chain_serves_its_input_unchanged():
    stages = noop_chain_stages(4)
    with GraphServer(stages) as server:
        answer = server.submit({"request": 7}).result(timeout=10)
    assert answer == {"hop1": 7, "hop2": 7, "hop3": 7, "hop4": 7}
    with pytest.raises(ValueError, match="hops"):
        noop_chain_stages(0)


def test_cpu_meter_counts_this_process():
    with CpuMeter([os.getpid(), 2**22 + 12345]) as meter:  # a PID that does not exist is skipped
        deadline = time.process_time() + 0.03   # 30 ms of CPU on any machine: psutil's readings come in 10 ms ticks
        while time.process_time() < deadline:
            pass
    assert meter.seconds[os.getpid()] > 0 and list(meter.seconds) == [os.getpid()]
    assert 0 < meter.share() <= 1 and 0 <= meter.machine_busy <= 1


def test_watch_rate_reads_batches_and_cpu_of_the_processes_it_is_given():
    with GraphServer(noop_chain_stages(2)) as server:
        watched = watch_rate(server, 200, lambda i: {"request": i}, [os.getpid()],
                             counts=lambda: batch_counts(server), duration=0.1, min_requests=40)
        total = sum(sum(n * b for b, n in sizes.items()) for sizes in batch_counts(server).values())
    assert len(watched.result.reports) == 1 and len(watched.result.reports[0].latencies) == 40
    assert total == 2 * 40 and set(watched.batches) == {"hop1", "hop2"}
    assert all(1 <= b <= 40 for b in watched.batches.values())
    assert watched.cpu_ms_engine == 0.0 and watched.share_engine == 0.0  # this process is "here", not the engine
    assert watched.free_cores_ceiling() > 0


def test_the_heap_is_frozen_only_inside_the_measured_block_unless_the_caller_froze_it():
    assert gc.get_freeze_count() == 0
    with frozen_heap():
        assert gc.get_freeze_count() > 0  # what existed before the block is out of the collector's reach
    assert gc.get_freeze_count() == 0, "the block leaves the collector as it found it"
    gc.freeze()
    try:
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0, "a caller's own freeze is not undone"
    finally:
        gc.unfreeze()
