"""Overload shed, not queued, in the simulator: a queue limit (Triton's max_queue_size) and a per-request
queue_timeout (default_timeout_microseconds, REJECT), checked against exact queueing formulas and against a plain
event-by-event reference."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from infergraph_lite.core.policy import BatchPolicy
from infergraph_lite.core.stage import Exponential, Stage
from infergraph_lite.simulation.graph import simulate_graph
from infergraph_lite.simulation.queue import REFUSED, SERVED, TIMED_OUT, batch_by_batch, simulate_batching


def mm1k_blocking(rho: float, capacity: int) -> float:
    """P(an arrival finds the system full) in M/M/1/N, N = ``capacity`` in the system (PASTA)."""
    if rho == 1.0:
        return 1.0 / (capacity + 1)
    return (1 - rho) * rho**capacity / (1 - rho ** (capacity + 1))


def mm1_deterministic_patience(rho: float, patience: float) -> float:
    """P(abandon) in M/M/1 (mu = 1) where a customer leaves if its wait would exceed ``patience``.

    With FIFO and a fixed patience, a customer abandons exactly when the work ahead of it (of customers
    who stay) exceeds the patience; the density of that work solves a level-crossing equation, which gives
    (1 - rho) rho a / (1 - rho^2 a) with a = exp(-(1 - rho) patience) (Boots & Tijms, 1999).
    """
    a = math.exp(-(1 - rho) * patience)
    return (1 - rho) * rho * a / (1 - rho**2 * a)


# Loads below, at and above capacity; blocking of at least a few percent, so 200k requests hold it to 3 %.
@pytest.mark.parametrize(("rho", "waiting"), [(0.5, 1), (0.8, 4), (1.0, 2), (1.5, 1), (1.5, 4), (2.0, 4)])
def test_one_exponential_server_with_k_waiting_is_mm1_k_plus_1(rho, waiting):
    r = simulate_batching(rho, Exponential(1.0), max_queue_size=waiting, n_requests=200_000, seed=3)
    exact = mm1k_blocking(rho, waiting + 1)  # K may wait, one is served: K + 1 in the system
    assert r.refused.mean() == pytest.approx(exact, rel=0.03)
    assert not r.timed_out.any()
    # What is not refused is served: throughput = rate x (1 - blocking), latencies over the answered only.
    assert r.throughput == pytest.approx(rho * (1 - exact), rel=0.03)
    assert len(r.latencies) == np.count_nonzero(~r.refused) and np.isfinite(r.latencies).all()
    assert np.isnan(r.finish[r.refused]).all() and (r.batch_size[r.refused] == 0).all()


@pytest.mark.parametrize(("rho", "patience"), [(0.7, 1.0), (1.5, 0.5), (1.5, 3.0)])
def test_timeout_matches_mm1_with_deterministic_patience(rho, patience):
    r = simulate_batching(rho, Exponential(1.0), queue_timeout=patience, n_requests=200_000, seed=4)
    assert r.timed_out.mean() == pytest.approx(mm1_deterministic_patience(rho, patience), rel=0.03)
    assert not r.refused.any()
    served = ~r.timed_out
    assert (r.start[served] - r.arrival[served] <= patience).all()  # nobody served after its deadline


def reference(times, service, cap, max_wait, replicas, limit, patience):
    """Event by event: arrivals, batch starts and deadlines in time order (arrival, then batch, then deadline
    at a tie), the queue a deque.  Returns per-request outcome and start."""
    n = len(times)
    outcome, start = np.zeros(n, dtype=np.int8), np.full(n, np.nan)
    queue: deque[int] = deque()
    free = [0.0] * replicas
    j = 0
    while j < n or queue:
        t_arrive = times[j] if j < n else math.inf
        t_batch = t_drop = math.inf
        if queue:
            full_at = times[queue[cap - 1]] if cap is not None and len(queue) >= cap else math.inf
            oldest = times[queue[0]]
            t_batch = max(min(free), oldest, min(full_at, oldest + max_wait))
            t_drop = oldest + patience
        if t_arrive <= min(t_batch, t_drop):
            if len(queue) < limit:
                queue.append(j)
            else:
                outcome[j] = REFUSED
            j += 1
        elif t_batch <= t_drop:
            size = len(queue) if cap is None else min(len(queue), cap)
            members = [queue.popleft() for _ in range(size)]
            start[members] = t_batch
            free[free.index(min(free))] = t_batch + service(size)
        else:
            outcome[queue.popleft()] = TIMED_OUT
    return outcome, start


@pytest.mark.parametrize("case", range(12))
def test_batch_loop_sheds_as_the_event_by_event_reference(case):
    rng = np.random.default_rng(case)
    n = 400
    times = np.sort(rng.uniform(0, n / rng.uniform(1.0, 6.0), n))
    cap = [1, 3, 8, None][case % 4]
    max_wait = [0.0, 0.4][case % 2]
    replicas = 1 + case % 3
    limit = [2, 5, n][case % 3]
    patience = [math.inf, 1.5, 0.7, 3.0][(case // 3) % 4]

    def service(b):
        return 1.0 + 0.3 * b

    outcome = np.zeros(n, dtype=np.int8)
    firsts, starts, _, _ = batch_by_batch(times, service, BatchPolicy(cap, max_wait), replicas, max_queue_size=limit,
                                          queue_timeout=None if math.isinf(patience) else patience, outcome=outcome)
    expected_outcome, expected_start = reference(times, service, cap, max_wait, replicas, limit, patience)
    assert outcome.tolist() == expected_outcome.tolist()
    served = np.flatnonzero(outcome == SERVED)
    sizes = np.diff(np.append(np.searchsorted(served, firsts), len(served)))
    np.testing.assert_allclose(np.repeat(starts, sizes), expected_start[served])
    assert (outcome != SERVED).any() or limit == n  # the cases do shed


def test_no_limit_is_the_unlimited_run():
    kwargs = dict(arrival_rate=3.0, service_time=(1.0, 0.2), max_batch_size=8, max_wait=0.5, replicas=2,
                  n_requests=20_000)
    plain = simulate_batching(**kwargs)
    huge = simulate_batching(**kwargs, max_queue_size=10**9, queue_timeout=1e18)
    np.testing.assert_array_equal(plain.finish, huge.finish)
    np.testing.assert_array_equal(plain.batches_size, huge.batches_size)
    assert plain.throughput == huge.throughput and plain.mean_latency == huge.mean_latency
    assert not plain.refused.any() and len(plain.refused) == len(plain.arrival)


def test_goodput_and_dropped_fraction():
    r = simulate_batching(2.0, Exponential(1.0), max_queue_size=2, n_requests=50_000)
    assert r.dropped_fraction == pytest.approx(r.refused.mean())
    slo = r.percentile(50)
    assert r.goodput(slo) == pytest.approx(r.throughput * np.mean(r.latencies <= slo))
    assert r.goodput(math.inf) == pytest.approx(r.throughput)
    # Without a limit the same load is unstable and refused up front; the limit is what makes it servable.
    with pytest.raises(ValueError, match="offered load"):
        simulate_batching(2.0, Exponential(1.0), n_requests=1000)


@pytest.mark.parametrize(("kwargs", "message"), [({"max_queue_size": 0}, "max_queue_size"),
                                                  ({"max_queue_size": 1.5}, "max_queue_size"),
                                                  ({"queue_timeout": -1.0}, "queue_timeout")])
def test_bad_shedding_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate_batching(0.5, 1.0, n_requests=100, **kwargs)


def test_batch_loop_needs_an_outcome_array_to_shed():
    with pytest.raises(ValueError, match="outcome"):
        batch_by_batch(np.array([0.0, 1.0]), lambda b: 1.0, BatchPolicy(1), max_queue_size=1)


def test_graph_stage_honours_max_queue_size():
    one = {"a": (Stage(service_time=Exponential(1.0), max_queue_size=3), ["request"])}
    graph = simulate_graph(one, 1.5, n_requests=20_000)
    alone = simulate_batching(1.5, Exponential(1.0), max_queue_size=3, n_requests=20_000)
    np.testing.assert_array_equal(graph.refused, alone.refused)
    np.testing.assert_array_equal(graph.finish, alone.finish)
    assert graph.throughput == alone.throughput

    tandem = {"a": (Stage(service_time=(1.0, 0.2), max_batch_size=4, max_wait=0.5), ["request"]),
              "b": (Stage(service_time=Exponential(0.8), max_queue_size=2), ["a"]),
              "c": (Stage(service_time=0.5), ["request"]),
              "d": (Stage(service_time=(0.2, 0.1), max_batch_size=8), ["b", "c"])}
    r = simulate_graph(tandem, 1.5, n_requests=20_000, queue_timeouts={"d": 0.3})
    b, d = r.stages["b"], r.stages["d"]
    assert b.refused.any() and not r.stages["a"].refused.any()
    np.testing.assert_array_equal(r.refused, b.refused)  # only b refuses
    assert np.isnan(d.arrival[b.refused]).all() and not d.timed_out[b.refused].any()  # shed requests go no further
    np.testing.assert_array_equal(r.timed_out, d.timed_out)
    assert np.isnan(r.finish[r.refused | r.timed_out]).all()
    assert len(r.latencies) == np.count_nonzero(~(r.refused | r.timed_out))
    with pytest.raises(ValueError, match="'x'"):
        simulate_graph(tandem, 1.5, n_requests=100, queue_timeouts={"x": 1.0})
