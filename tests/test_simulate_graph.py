"""simulate_graph against queueing-network theory, against simulate_batching, and against a literal
event-by-event reference on random graphs; and its errors."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite.core.graph import CycleError, InvalidNodeError, MissingDependencyError
from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import Exponential, Stage, service_time_fn
from infergraph_lite.simulation.graph import simulate_graph
from infergraph_lite.simulation.queue import UnstableLoadError, simulate_batching
from infergraph_lite.simulation.theory import (
    batch_means_interval,
    fork_join_mean_latency,
    jackson_tandem_mean_latency,
    mmc_mean_latency,
)


def within_interval(latencies, expected):
    mean, half = batch_means_interval(latencies)
    assert abs(mean - expected) <= half, f"simulated {mean:.4f} ± {half:.4f}, theory {expected:.4f}"


def fork(k, mean=1.0, **stage):
    """k identical exponential branches off the request, joined by a stage that costs nothing."""
    graph = {f"branch{i}": (Stage(service_time=Exponential(mean), **stage), ["request"]) for i in range(k)}
    graph["join"] = (Stage(service_time=0), [f"branch{i}" for i in range(k)])
    return graph


# --- exact results for networks -----------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_exponential_tandem_mean_latency_follows_jacksons_theorem(rate):
    stages = {
        "pre": (Stage(service_time=Exponential(1.0)), ["request"]),
        "model": (Stage(service_time=Exponential(2.5), replicas=2), ["pre"]),
        "post": (Stage(service_time=Exponential(0.5)), ["model"]),
    }
    result = simulate_graph(stages, rate, n_requests=300_000, seed=2)
    within_interval(result.latencies, jackson_tandem_mean_latency(rate, [1.0, (2.5, 2), 0.5]))
    for name, mean, servers in [("pre", 1.0, 1), ("model", 2.5, 2), ("post", 0.5, 1)]:
        within_interval(result.stages[name].latencies, mmc_mean_latency(rate, mean, servers))
        assert result.stages[name].utilization == pytest.approx(rate * mean / servers, rel=0.02)


def test_tandem_of_two_identical_mm1_stations_has_an_erlang_latency_distribution():
    # Sojourn times at M/M/1 stations in series are independent exponentials with rate mu - lambda, so the
    # end-to-end latency is Erlang-2: P(T <= t) = 1 - exp(-theta t) (1 + theta t).
    rate, theta = 0.5, 0.5
    stages = {"a": (Stage(service_time=Exponential(1.0)), ["request"]),
              "b": (Stage(service_time=Exponential(1.0)), ["a"])}
    result = simulate_graph(stages, rate, n_requests=400_000, seed=5)
    for q in (50, 90, 99):
        lo, hi = 0.0, 100.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 1 - math.exp(-theta * mid) * (1 + theta * mid) < q / 100 else (lo, mid)
        assert result.percentile(q) == pytest.approx(lo, rel=0.03), q


@pytest.mark.parametrize("rate", [0.3, 0.6])
def test_two_branch_fork_join_matches_the_exact_nelson_tantawi_result(rate):
    result = simulate_graph(fork(2), rate, n_requests=400_000, seed=1)
    expected = fork_join_mean_latency(rate, 1.0, 2)
    assert expected == pytest.approx((12 - rate) / 8 / (1 - rate))
    within_interval(result.latencies, expected)
    # and a join is slower than either branch: here by the factor the formula says, (12 - rho) / 8
    one_branch = result.stages["branch0"].latencies.mean()
    assert result.mean_latency / one_branch == pytest.approx((12 - rate) / 8, rel=0.03)


def test_fork_join_of_more_branches_is_within_the_nelson_tantawi_approximation():
    for k in (4, 8):
        result = simulate_graph(fork(k), 0.5, n_requests=200_000, seed=k)
        assert result.mean_latency == pytest.approx(fork_join_mean_latency(0.5, 1.0, k), rel=0.05)


def test_deterministic_tandem_whose_downstream_stage_is_faster_never_queues_there():
    stages = {"slow": (Stage(service_time=1.0), ["request"]), "fast": (Stage(service_time=0.6), ["slow"])}
    result = simulate_graph(stages, 0.9, n_requests=50_000, seed=3)
    fast = result.stages["fast"]
    assert np.all(fast.queue_times == 0)  # requests leave 'slow' at least 1.0 apart, 'fast' needs 0.6
    np.testing.assert_allclose(result.latencies, result.stages["slow"].latencies + 0.6)
    assert result.bottleneck == "slow"


@pytest.mark.parametrize(
    ("service", "max_batch_size", "max_wait", "replicas"),
    [(1.0, 1, 0.0, 1), (1.0, 1, 0.0, 3), (Exponential(1.0), 1, 0.0, 1), (Exponential(1.0), 1, 0.0, 2),
     ((2.0, 0.15), 16, 1.0, 2), ((2.0, 0.15), None, 0.0, 1), (Exponential(1.5), 4, 0.5, 2),
     ((2.0, 0.15), AIMD(latency_target=4.0), 0.0, 1), (lambda b: 0.5 + 0.1 * b, 8, 0.2, 1)],
)
def test_a_one_stage_graph_is_simulate_batching_request_by_request(service, max_batch_size, max_wait, replicas):
    cap = Stage(service_time=service, max_batch_size=max_batch_size, replicas=replicas).capacity()
    rate = 0.8 * min(cap, 5.0)
    graph = {"m": (Stage(service_time=service, max_batch_size=max_batch_size, max_wait=max_wait,
                         replicas=replicas), ["request"])}
    ours = simulate_graph(graph, rate, n_requests=60_000, seed=7)
    theirs = simulate_batching(rate, service, max_batch_size, max_wait, n_requests=60_000, seed=7,
                               replicas=replicas)
    np.testing.assert_array_equal(ours.arrival, theirs.arrival)
    # the same arithmetic where the same loop runs; the vectorised FIFO paths differ in the last bits
    np.testing.assert_allclose(ours.finish, theirs.finish, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(ours.stages["m"].batch_size, theirs.batch_size)
    assert ours.throughput == pytest.approx(theirs.throughput, rel=1e-9)
    assert ours.stages["m"].mean_batch_size == pytest.approx(theirs.mean_batch_size)
    assert ours.stages["m"].utilization == pytest.approx(theirs.utilization, abs=2e-3)


# --- a literal event-by-event reference on random graphs ------------------------------------------------


def reference_graph(stages, arrivals, seed):
    """The graph served literally: events in time order; at each instant deliver every completion, then let
    each stage (in topological order) start every batch the policy allows.  Returns end-to-end finish times."""
    names = list(stages)
    deps = {name: list(dict.fromkeys(d for d in stages[name][1] if d in stages)) for name in names}
    from_input = {name: not deps[name] or any(d not in stages for d in stages[name][1]) for name in names}
    users = {name: [u for u in names if name in deps[u]] for name in names}
    needed = {name: len(deps[name]) + from_input[name] for name in names}
    order, seen = [], set()
    while len(order) < len(names):
        for name in names:
            if name not in seen and all(d in seen for d in deps[name]):
                order.append(name)
                seen.add(name)
    service = {name: service_time_fn(stages[name][0].service_time, np.random.default_rng([seed, 1 + k]),
                                     allow_zero=True) for k, name in enumerate(names)}
    n = len(arrivals)
    remaining = {name: [needed[name]] * n for name in names}
    queue = {name: [] for name in names}  # heap of (time it joined, request)
    free = {name: stages[name][0].replicas for name in names}
    finished = {name: [None] * n for name in names}
    events = [(t, 0, i, None) for i, t in enumerate(arrivals)]  # (time, seq, request or batch, stage)
    heapq.heapify(events)
    seq = [n]

    def deliver(name, request, now):  # one dependency of `name` is done for `request`
        remaining[name][request] -= 1
        if remaining[name][request] == 0:
            heapq.heappush(queue[name], (now, request))

    def done(name, batch, now):
        for request in batch:
            finished[name][request] = now
            for user in users[name]:
                deliver(user, request, now)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, what, name = heapq.heappop(events)
            if name is None:  # a request arrives
                for stage in names:
                    if from_input[stage]:
                        deliver(stage, what, now)
            elif what is not None:  # a batch finished
                free[name] += 1
                done(name, what, now)
        for name in order:
            stage = stages[name][0]
            cap = stage.max_batch_size or math.inf
            while free[name] > 0 and queue[name]:
                oldest = queue[name][0][0]
                if len(queue[name]) >= cap or now >= oldest + stage.max_wait:
                    batch = [heapq.heappop(queue[name])[1] for _ in range(int(min(cap, len(queue[name]))))]
                    duration = service[name](len(batch))
                    if duration == 0:
                        done(name, batch, now)
                    else:
                        free[name] -= 1
                        seq[0] += 1
                        heapq.heappush(events, (now + duration, seq[0], batch, name))
                else:
                    seq[0] += 1
                    heapq.heappush(events, (oldest + stage.max_wait, seq[0], None, name))  # a wake-up
                    break
    sinks = [name for name in names if not users[name]]
    return np.array([max(finished[s][i] for s in sinks) for i in range(n)])


SERVICES = [0.0, 0.5, 1.0, 1.25, (0.5, 0.25), (1.0, 0.125), Exponential(0.75)]


@st.composite
def stage_graphs(draw):
    n_stages = draw(st.integers(1, 5))
    graph = {}
    for i in range(n_stages):
        earlier = [f"s{j}" for j in range(i)]
        deps = draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        if not deps or draw(st.booleans()):
            deps = [*deps, "request"]
        stage = Stage(service_time=draw(st.sampled_from(SERVICES)),
                      max_batch_size=draw(st.sampled_from([1, 2, 3, None])),
                      max_wait=draw(st.sampled_from([0.0, 0.5, 1.5])), replicas=draw(st.integers(1, 3)))
        graph[f"s{i}"] = (stage, deps)
    return graph


@settings(max_examples=120)
@given(stage_graphs(), st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 1.5, 0.3]), min_size=2, max_size=40),
       st.integers(0, 3))
def test_matches_a_literal_event_by_event_reference_on_random_graphs(graph, gaps, seed):
    arrivals = np.cumsum(gaps)
    result = simulate_graph(graph, None, arrivals=arrivals, warmup=0.0, seed=seed, allow_unstable=True)
    np.testing.assert_allclose(result.finish, reference_graph(graph, list(arrivals), seed), rtol=0, atol=1e-9)
    for name, (_, deps) in graph.items():  # every stage starts a request only after all its dependencies
        stats = result.stages[name]
        for dep in deps:
            before = result.stages[dep].finish if dep in graph else result.arrival
            assert np.all(stats.start >= before - 1e-12)


# --- behaviour a user relies on ---------------------------------------------------------------------------


def test_a_join_waits_for_its_slowest_branch_and_latency_is_to_the_last_sink():
    stages = {
        "pre": (Stage(service_time=0.2), ["request"]),
        "fast": (Stage(service_time=Exponential(0.5)), ["pre"]),
        "slow": (Stage(service_time=Exponential(1.5)), ["pre"]),
        "join": (Stage(service_time=0), ["fast", "slow"]),
        "log": (Stage(service_time=0.1), ["pre"]),  # a second sink
    }
    result = simulate_graph(stages, 0.4, n_requests=20_000)
    join = result.stages["join"]
    np.testing.assert_array_equal(join.arrival, np.maximum(result.stages["fast"].finish, result.stages["slow"].finish))
    np.testing.assert_array_equal(join.finish, join.arrival)  # a join that costs nothing adds nothing
    assert set(result.sinks) == {"join", "log"}
    np.testing.assert_array_equal(result.finish, np.maximum(join.finish, result.stages["log"].finish))


def test_adding_replicas_to_the_bottleneck_moves_it_and_cuts_latency():
    def graph(model_replicas):
        return {"pre": (Stage(service_time=1.0), ["request"]),
                "model": (Stage(service_time=Exponential(4.0), replicas=model_replicas), ["pre"]),
                "post": (Stage(service_time=0.5), ["model"])}

    before = simulate_graph(graph(3), 0.7, n_requests=30_000)  # model at 0.7 * 4 / 3 = 93 %, pre at 70 %
    after = simulate_graph(graph(5), 0.7, n_requests=30_000)   # model at 56 %
    assert before.bottleneck == "model" and after.bottleneck == "pre"
    assert after.percentile(99) < before.percentile(99)
    assert before.throughput == pytest.approx(0.7, rel=0.03)


def test_per_stage_parts_add_up_and_batch_sizes_respect_the_cap():
    stages = {"a": (Stage(service_time=(2.0, 0.15), max_batch_size=8, max_wait=1.0, replicas=2), ["request"]),
              "b": (Stage(service_time=Exponential(0.4)), ["a"])}
    result = simulate_graph(stages, 2.0, n_requests=20_000)
    for s in result.stages.values():
        np.testing.assert_allclose(s.queue_times + s.service_times, s.latencies)
        assert np.all(s.queue_times >= 0) and np.all(s.service_times >= 0)
        assert s.mean_wait == pytest.approx(s.queue_times.mean()) and s.mean_service > 0
    a = result.stages["a"]
    assert 1 < a.mean_batch_size <= 8 and a.batch_size.max() <= 8
    np.testing.assert_allclose(a.service_times, 2.0 + 0.15 * a.batch_size)
    assert result.offered_load == pytest.approx(max(s.offered_load for s in result.stages.values()))


def test_seeded_runs_repeat_exactly_and_differ_across_seeds_and_warmup_is_dropped():
    stages = fork(2)
    a, b = simulate_graph(stages, 0.5, n_requests=5_000, seed=1), simulate_graph(stages, 0.5, n_requests=5_000, seed=1)
    c = simulate_graph(stages, 0.5, n_requests=5_000, seed=2)
    np.testing.assert_array_equal(a.latencies, b.latencies)
    assert not np.array_equal(a.latencies, c.latencies)
    assert len(a.latencies) == 4_500
    assert len(simulate_graph(stages, 0.5, n_requests=5_000, warmup=0.0).latencies) == 5_000


def test_a_given_arrival_trace_is_replayed():
    stages = {"a": (Stage(service_time=1.0), ["request"])}
    result = simulate_graph(stages, None, arrivals=[0.0, 0.5, 3.0], warmup=0.0)
    np.testing.assert_allclose(result.finish, [1.0, 2.0, 4.0])


@pytest.mark.parametrize(
    ("stages", "error", "fragment"),
    [
        ({"a": (Stage(service_time=1.0), ["b"])}, MissingDependencyError, "node 'a' depends on 'b'"),
        ({"a": (Stage(service_time=1.0), ["b"]), "b": (Stage(service_time=1.0), ["a"])}, CycleError, "a -> b -> a"),
        ({"a": (len, ["request"])}, InvalidNodeError, "node 'a': expected a Stage"),
        ({"a": (Stage(fn=lambda xs: xs), ["request"])}, InvalidNodeError, "node 'a': this Stage has no service_time"),
        ({"a": (Stage(service_time=1.0), "request")}, InvalidNodeError, "node 'a'"),
    ],
)
def test_graph_and_stage_errors_name_the_node(stages, error, fragment):
    with pytest.raises(error, match=fragment):
        simulate_graph(stages, 0.5)


def test_an_unstable_stage_is_named_before_anything_runs():
    stages = {"pre": (Stage(service_time=0.5), ["request"]),
              "model": (Stage(service_time=Exponential(3.0), replicas=2), ["pre"])}
    with pytest.raises(UnstableLoadError, match=r"stage 'model' cannot keep up.*capacity 0\.6667"):
        simulate_graph(stages, 0.9)
    saturated = simulate_graph(stages, 0.9, n_requests=20_000, allow_unstable=True)
    assert saturated.throughput == pytest.approx(2 / 3, rel=0.05)
    assert saturated.bottleneck == "model" and saturated.offered_load == pytest.approx(1.35)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"warmup": 1.0}, "warmup"), ({"n_requests": 1}, "n_requests"), ({"arrival_rate": -1.0}, "arrival_rate"),
     ({"arrival_rate": None, "arrivals": [1.0, 0.0]}, "sorted")],
)
def test_bad_parameters_are_named(kwargs, message):
    options = {"arrival_rate": 0.5, **kwargs}
    with pytest.raises(ValueError, match=message):
        simulate_graph({"a": (Stage(service_time=1.0), ["request"])}, **options)


# --- hop_delay: a pure delay on entering a stage -------------------------------------------------------


def chain(n, service=1.0, **stage):
    names = [f"s{i}" for i in range(n)]
    return {name: (Stage(service_time=service, **stage), [names[i - 1]] if i else ["request"])
            for i, name in enumerate(names)}


@pytest.mark.parametrize("n", [1, 3])
def test_a_chain_of_n_stages_with_hop_delay_adds_exactly_n_delays_at_light_load(n):
    arrivals = np.arange(50) * 10.0  # far apart: nothing ever queues
    plain = simulate_graph(chain(n), None, arrivals=arrivals, warmup=0.0)
    hopped = simulate_graph(chain(n), None, arrivals=arrivals, warmup=0.0, hop_delay=0.25)
    np.testing.assert_allclose(plain.latencies, n * 1.0)
    np.testing.assert_allclose(hopped.latencies, n * 1.0 + n * 0.25)
    assert hopped.stages["s0"].arrival[0] == pytest.approx(0.25)  # the stage's queue sees it d later
    assert hopped.stages["s0"].mean_wait == 0.0  # the delay occupies no server and never queues


def test_a_hop_delay_shifts_a_loaded_chain_without_changing_its_queueing():
    # Shifting every arrival at a FIFO stage by d shifts every finish by d: a chain's waits are unchanged.
    stages = {"a": (Stage(service_time=Exponential(1.0), max_batch_size=4), ["request"]),
              "b": (Stage(service_time=Exponential(0.8)), ["a"])}
    plain = simulate_graph(stages, 0.7, n_requests=20_000, seed=3)
    hopped = simulate_graph(stages, 0.7, n_requests=20_000, seed=3, hop_delay={"a": 0.1, "b": 0.3})
    np.testing.assert_allclose(hopped.latencies, plain.latencies + 0.4, atol=1e-9)
    for name in stages:
        np.testing.assert_allclose(hopped.stages[name].start - hopped.stages[name].arrival,
                                   plain.stages[name].start - plain.stages[name].arrival, atol=1e-9)


def test_a_hop_delay_on_one_branch_of_a_join_makes_the_join_wait_for_it():
    stages = {"fast": (Stage(service_time=1.0), ["request"]), "slow": (Stage(service_time=2.0), ["request"]),
              "join": (Stage(service_time=0.0), ["fast", "slow"])}
    arrivals = np.arange(20) * 10.0
    r = simulate_graph(stages, None, arrivals=arrivals, warmup=0.0, hop_delay={"fast": 1.5})
    np.testing.assert_allclose(r.latencies, 2.5)  # the fast branch now finishes at 2.5, after the slow one
    assert r.stages["slow"].arrival[0] == 0.0  # a stage not named gets no delay


def test_hop_delay_at_its_default_changes_nothing():
    stages = fork(3, max_batch_size=4, max_wait=0.2)
    plain = simulate_graph(stages, 0.6, n_requests=5_000, seed=9)
    zero = simulate_graph(stages, 0.6, n_requests=5_000, seed=9, hop_delay=0.0)
    zeros = simulate_graph(stages, 0.6, n_requests=5_000, seed=9, hop_delay={"join": 0})
    for other in (zero, zeros):
        np.testing.assert_array_equal(other.latencies, plain.latencies)
        for name in stages:
            np.testing.assert_array_equal(other.stages[name].start, plain.stages[name].start)


@pytest.mark.parametrize(
    ("hop_delay", "message"),
    [(-0.1, r"hop_delay must be >= 0, got -0\.1"), (float("nan"), "hop_delay must be a finite number"),
     ("1ms", "hop_delay must be a finite number, got '1ms'"), ({"nope": 1.0}, "hop_delay names 'nope'"),
     ({"a": -1}, r"hop_delay\['a'\] must be >= 0")],
)
def test_bad_hop_delays_are_named(hop_delay, message):
    with pytest.raises(ValueError, match=message):
        simulate_graph({"a": (Stage(service_time=1.0), ["request"])}, 0.5, hop_delay=hop_delay)
