"""simulate.py against queueing theory, against a literal event-by-event reference, and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import capacity
from infergraph_lite.simulation.queue import UnstableLoadError, simulate_batching
from infergraph_lite.simulation.theory import (
    batch_means_interval,
    greedy_batching_mean_latency,
    md1_mean_latency,
    mm1_mean_latency,
    t_quantile,
)


def reference_finish_times(arrivals, s, max_batch_size, max_wait, replicas):
    """The policy read literally: advance from event to event, start batches whenever allowed."""
    n, cap = len(arrivals), max_batch_size or math.inf  # no cap: a batch is never full, the window decides
    finish = [None] * n
    servers = [0.0] * replicas  # time each server is free
    waiting_from = 0  # index of the oldest request not yet in a batch
    t = 0.0
    while waiting_from < n:
        arrived = sum(1 for a in arrivals[waiting_from:] if a <= t)
        started = False
        for k in range(replicas):
            if servers[k] <= t and arrived > 0:
                oldest = arrivals[waiting_from]
                if arrived >= cap or t - oldest >= max_wait - 1e-12:
                    size = min(arrived, cap)
                    end = t + s(size)
                    for j in range(waiting_from, waiting_from + size):
                        finish[j] = end
                    servers[k], waiting_from, arrived, started = end, waiting_from + size, arrived - size, True
        if started:
            continue
        candidates = [x for x in servers if x > t]
        if waiting_from + arrived < n:
            candidates.append(arrivals[waiting_from + arrived])
        if arrived > 0 and arrivals[waiting_from] + max_wait > t:
            candidates.append(arrivals[waiting_from] + max_wait)
        t = min(candidates)
    return np.array(finish)


@settings(max_examples=60)
@given(
    st.lists(st.floats(0.0, 3.0), min_size=2, max_size=40),
    st.sampled_from([1, 2, 3, 5, None]),
    st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    st.integers(1, 3),
    st.tuples(st.sampled_from([0.2, 1.0]), st.sampled_from([0.0, 0.1, 0.7])),
)
def test_matches_a_literal_event_by_event_reference(gaps, max_batch_size, max_wait, replicas, alpha_beta):
    arrivals = np.cumsum(gaps)
    alpha, beta = alpha_beta
    result = simulate_batching(None, alpha_beta, max_batch_size, max_wait, arrivals=arrivals, warmup=0.0,
                               replicas=replicas, allow_unstable=True)
    expected = reference_finish_times(list(arrivals), lambda b: alpha + beta * b, max_batch_size, max_wait, replicas)
    np.testing.assert_allclose(result.finish, expected, rtol=0, atol=1e-9)
    if max_batch_size:
        assert result.batch_size.max() <= max_batch_size


def within_interval(latencies, expected):
    mean, half = batch_means_interval(latencies)
    assert abs(mean - expected) <= half, f"simulated {mean:.4f} ± {half:.4f}, theory {expected:.4f}"


@pytest.mark.parametrize("load", [0.3, 0.6, 0.85])
def test_md1_mean_latency_matches_pollaczek_khinchine(load):
    result = simulate_batching(load / 2.0, 2.0, n_requests=200_000, seed=1)
    within_interval(result.latencies, md1_mean_latency(load / 2.0, 2.0))


@pytest.mark.parametrize("load", [0.5, 0.8])
def test_mm1_mean_latency_with_exponential_service(load):
    rng = np.random.default_rng(7)
    result = simulate_batching(load, lambda b: rng.exponential(1.0), n_requests=200_000, seed=2)
    within_interval(result.latencies, mm1_mean_latency(load, 1.0))


@pytest.mark.parametrize("rate", [0.3, 1.0, 1.6])
def test_greedy_uncapped_batching_matches_the_exact_markov_chain(rate):
    result = simulate_batching(rate, (1.0, 0.5), max_batch_size=None, n_requests=200_000, seed=3)
    within_interval(result.latencies, greedy_batching_mean_latency(rate, 1.0, 0.5))


def test_littles_law_time_average_in_system_equals_rate_times_mean_latency():
    result = simulate_batching(0.8, (0.5, 0.25), max_batch_size=4, max_wait=0.5, n_requests=100_000, seed=4)
    t = np.random.default_rng(0).uniform(result.arrival[0], result.arrival[-1], 20_000)
    in_system = np.searchsorted(result.arrival, t, "right") - np.searchsorted(np.sort(result.finish), t, "right")
    rate = (len(result.arrival) - 1) / (result.arrival[-1] - result.arrival[0])
    assert in_system.mean() == pytest.approx(rate * result.mean_latency, rel=0.05)


@pytest.mark.parametrize(("b", "replicas"), [(1, 1), (8, 1), (8, 3)])
def test_saturated_throughput_is_replicas_times_b_over_s_b(b, replicas):
    best = capacity((1.0, 0.25), b, replicas)
    assert best == pytest.approx(replicas * b / (1.0 + 0.25 * b))
    result = simulate_batching(3 * best, (1.0, 0.25), b, n_requests=60_000, replicas=replicas, allow_unstable=True)
    assert result.throughput == pytest.approx(best, rel=0.01)
    assert result.mean_batch_size == pytest.approx(b, rel=0.01)
    assert result.utilization == pytest.approx(1.0, abs=0.01)


def test_low_load_limits_greedy_serves_alone_and_a_window_waits_it_out():
    greedy = simulate_batching(1e-4, (2.0, 0.5), max_batch_size=8, n_requests=5_000)
    assert greedy.mean_latency == pytest.approx(2.5, rel=1e-3) and greedy.mean_batch_size == pytest.approx(1.0)
    windowed = simulate_batching(1e-4, (2.0, 0.5), max_batch_size=8, max_wait=3.0, n_requests=5_000)
    assert windowed.mean_latency == pytest.approx(3.0 + 2.5, rel=1e-3)


def test_queue_and_service_parts_add_up_and_are_non_negative():
    r = simulate_batching(1.2, (1.0, 0.3), max_batch_size=6, max_wait=0.4, n_requests=20_000)
    np.testing.assert_allclose(r.queue_times + r.service_times, r.latencies)
    assert r.queue_times.min() >= 0 and r.percentile(50) <= r.percentile(99) <= r.latencies.max()


def test_seeded_runs_repeat_exactly_and_differ_across_seeds():
    a = simulate_batching(0.5, 1.0, n_requests=1_000, seed=5)
    b = simulate_batching(0.5, 1.0, n_requests=1_000, seed=5)
    c = simulate_batching(0.5, 1.0, n_requests=1_000, seed=6)
    np.testing.assert_array_equal(a.latencies, b.latencies)
    assert not np.array_equal(a.latencies, c.latencies)


def test_warmup_fraction_is_dropped():
    assert len(simulate_batching(0.5, 1.0, n_requests=1_000, warmup=0.25).latencies) == 750


def test_unstable_load_is_reported_with_the_capacity():
    with pytest.raises(UnstableLoadError, match=r"arrival rate 2 is at or above the capacity 1 .*offered load 2\.000"):
        simulate_batching(2.0, 1.0)
    with pytest.raises(UnstableLoadError, match="capacity 4"):  # uncapped (1, 0.25) tends to 1/beta
        simulate_batching(5.0, (1.0, 0.25), max_batch_size=None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arrival_rate": 0.0}, "arrival_rate must be > 0, got 0.0"),
        ({"arrival_rate": -1.0}, "arrival_rate must be > 0, got -1.0"),
        ({"arrival_rate": math.nan}, "arrival_rate must be a finite number"),
        ({"service_time": 0.0}, "service_time must be > 0, got 0.0"),
        ({"service_time": (-1.0, 0.5)}, r"service_time \(alpha, beta\) must be >= 0"),
        ({"service_time": (1.0, 2.0, 3.0)}, r"must be \(alpha, beta\)"),
        ({"service_time": lambda b: 0.0}, r"service_time\(1\) returned 0.0"),
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, None or an AIMD, got 0"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an integer >= 1, None or an AIMD, got 2.5"),
        ({"max_wait": -0.1}, "max_wait must be >= 0, got -0.1"),
        ({"replicas": 0}, "replicas must be an integer >= 1, got 0"),
        ({"n_requests": 1}, "n_requests must be an integer >= 2, got 1"),
        ({"warmup": 1.0}, r"warmup must be a fraction in \[0, 1\), got 1.0"),
        ({"arrivals": [3.0, 1.0], "arrival_rate": None}, "arrivals must be finite, non-negative and sorted"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    args = {"arrival_rate": 0.5, "service_time": 1.0} | kwargs
    with pytest.raises(ValueError, match=message):
        simulate_batching(**args)


def test_aimd_settles_on_the_largest_batch_within_its_target_and_keeps_probing():
    # s(b) = 2 + 0.15 b meets a 5.0 target up to b = 20.
    controller = AIMD(latency_target=5.0, decrease=0.1)
    r = simulate_batching(20.0, (2.0, 0.15), controller, n_requests=50_000, allow_unstable=True)
    sizes = r.batches_size
    assert sizes.max() == 21  # one probe past the target, then back off
    assert 18 <= np.median(sizes) <= 20
    assert controller.cap == 1, "the caller's controller must not be changed"


def test_aimd_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"AIMD decrease must be a fraction in \(0, 1\), got 1.5"):
        AIMD(5.0, decrease=1.5)
    with pytest.raises(ValueError, match="AIMD latency_target must be > 0"):
        AIMD(0.0)
    with pytest.raises(ValueError, match="AIMD increase must be an integer >= 1, got 0"):
        AIMD(5.0, increase=0)


def test_vectorised_fifo_matches_the_batch_by_batch_loop_on_a_long_run():
    fast = simulate_batching(0.95, 1.0, n_requests=50_000, seed=11)  # constant service: vectorised path
    loop = simulate_batching(0.95, lambda b: 1.0, n_requests=50_000, seed=11)  # a callable: the general loop
    np.testing.assert_allclose(fast.finish, loop.finish, rtol=0, atol=1e-8)
    assert fast.throughput == pytest.approx(loop.throughput) and fast.utilization == pytest.approx(loop.utilization)


@pytest.mark.parametrize(("confidence", "df", "expected"), [
    (0.999, 19, 3.883),   # 20 batch means at 99.9 %
    (0.95, 1, 12.706),    # Cauchy: tan(0.475 pi)
    (0.95, 2, 4.303),
    (0.99, 9, 3.250),
    (0.95, 30, 2.042),
    (0.999, 120, 3.373),
    (0.95, 5000, 1.9604),
])
def test_t_quantile_matches_the_published_table(confidence, df, expected):
    assert t_quantile(confidence, df) == pytest.approx(expected, abs=1.5e-3)


def test_t_quantile_tends_to_the_normal_quantile_and_refuses_nonsense():
    assert t_quantile(0.999, 999) > t_quantile(0.999, 1001) > 3.2905
    with pytest.raises(ValueError, match="confidence"):
        t_quantile(1.0, 5)
    with pytest.raises(ValueError, match="df"):
        t_quantile(0.95, 0)


def test_batch_means_interval_uses_t_with_n_batches_minus_one_degrees_of_freedom():
    rng = np.random.default_rng(3)
    samples = rng.normal(10.0, 1.0, 2000)
    mean, half = batch_means_interval(samples, n_batches=20, confidence=0.999)
    block_means = samples.reshape(20, -1).mean(axis=1)
    assert mean == pytest.approx(samples.mean())
    assert half == pytest.approx(3.8834 * block_means.std(ddof=1) / math.sqrt(20), rel=1e-3)


def test_batch_means_interval_covers_the_true_mean_about_as_often_as_it_says():
    # 400 sets of independent normal samples: a 90 % interval from 10 batch means covers 0 in about 90 % of them
    # (with the normal quantile instead of t it would cover only about 87 %).
    rng = np.random.default_rng(4)
    covered = 0
    for _ in range(400):
        mean, half = batch_means_interval(rng.normal(0.0, 1.0, 200), n_batches=10, confidence=0.9)
        covered += abs(mean) <= half
    assert 0.86 <= covered / 400 <= 0.94
