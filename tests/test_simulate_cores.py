"""simulate_graph(cores=..., hop_work=...): the stages sharing a machine's cores, in one event loop."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite.core.stage import Exponential, Stage, service_time_fn
from infergraph_lite.simulation.graph import simulate_graph
from infergraph_lite.simulation.queue import UnstableLoadError
from tests.test_simulate_graph import stage_graphs

GAPS = st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 1.5, 0.3]), min_size=2, max_size=40)


def per_stage(result, name):
    s = result.stages[name]
    return s.arrival, s.start, s.finish, s.batch_size, s.batches_size, s.batches_start, s.batches_end


@settings(max_examples=120, deadline=None)
@given(stage_graphs(), GAPS, st.integers(0, 3), st.sampled_from([0.0, 0.25]))
def test_with_a_core_for_every_job_it_is_the_stage_by_stage_simulation_exactly(graph, gaps, seed, hop):
    # Ties abound here (fixed gaps, fixed service times, windows): both loops must break them the same way.
    arrivals = np.cumsum(gaps)
    common = {"arrivals": arrivals, "warmup": 0.0, "seed": seed, "allow_unstable": True, "hop_delay": hop}
    alone = simulate_graph(graph, None, **common)
    shared = simulate_graph(graph, None, cores=1_000, **common)
    np.testing.assert_allclose(shared.finish, alone.finish, rtol=0, atol=1e-9)
    for name in graph:
        for ours, theirs in zip(per_stage(shared, name), per_stage(alone, name)):
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)


def running(starts, ends, at):
    return int(np.count_nonzero((starts <= at) & (ends > at)))


@settings(max_examples=80, deadline=None)
@given(stage_graphs(), GAPS, st.sampled_from([1, 1.5, 2]))
def test_processor_sharing_conserves_work_and_never_runs_a_batch_faster_than_alone(graph, gaps, cores):
    graph = {name: (stage, deps) for name, (stage, deps) in graph.items()
             if not isinstance(stage.service_time, Exponential)}
    graph = {name: (stage, [d for d in deps if d in graph or d == "request"] or ["request"])
             for name, (stage, deps) in graph.items()}
    if not graph:
        return
    result = simulate_graph(graph, None, arrivals=np.cumsum(gaps), warmup=0.0, cores=cores, allow_unstable=True)
    starts, ends, works = [], [], []
    for name, (stage, _) in graph.items():
        s = result.stages[name]
        work = np.array([service_time_fn(stage.service_time, allow_zero=True)(int(b)) for b in s.batches_size])
        assert np.all(s.batches_end - s.batches_start >= work - 1e-9), name  # sharing only slows a batch
        keep = work > 0
        starts.append(s.batches_start[keep])
        ends.append(s.batches_end[keep])
        works.append(work[keep])
    starts, ends, works = np.concatenate(starts), np.concatenate(ends), np.concatenate(works)
    if len(works) == 0:
        return
    # Between consecutive event times the number of running batches is constant; the cores serve
    # min(running, cores) seconds of work per second, and that adds up to every batch's work.
    edges = np.unique(np.concatenate([starts, ends]))
    served = sum(min(running(starts, ends, a), cores) * (b - a) for a, b in itertools.pairwise(edges))
    assert served == pytest.approx(works.sum(), rel=1e-9, abs=1e-9)
    # A batch that never shared the cores with more jobs than there are cores takes exactly its work.
    for a, b, w in zip(starts, ends, works):
        inside = edges[(edges >= a) & (edges < b)]
        if all(running(starts, ends, x) <= cores for x in inside):
            assert b - a == pytest.approx(w, abs=1e-9)


def test_two_replicas_on_one_core_are_an_mm1_queue():
    # Two busy replicas at half speed each serve at rate 1 in total, so the stage is M/M/1: 1 / (1 - 0.6) = 2.5.
    pair = {"a": (Stage(service_time=Exponential(1.0), replicas=2), ["request"])}
    one_core = simulate_graph(pair, 0.6, 200_000, cores=1)
    assert one_core.mean_latency == pytest.approx(2.5, rel=0.03)
    assert simulate_graph(pair, 0.6, 50_000, cores=2).mean_latency == pytest.approx(
        simulate_graph(pair, 0.6, 50_000).mean_latency, abs=1e-12)


def test_two_stages_on_one_core_share_it_while_both_run():
    fixed = {"a": (Stage(service_time=1.0), ["request"]), "b": (Stage(service_time=1.0), ["a"])}
    r = simulate_graph(fixed, None, arrivals=[0.0, 0.0], warmup=0.0, cores=1, allow_unstable=True)
    # request 0 leaves a at 1; then b (request 0) and a (request 1) share the core until 3; b alone until 4
    assert r.stages["a"].finish.tolist() == [1.0, 3.0]
    assert r.stages["b"].finish.tolist() == [3.0, 4.0]
    assert r.finish.tolist() == [3.0, 4.0]


def test_two_parallel_stages_split_one_core_equally_until_the_shorter_is_done():
    fan = {"a": (Stage(service_time=1.0), ["request"]), "b": (Stage(service_time=3.0), ["request"]),
           "join": (Stage(service_time=0.0), ["a", "b"])}
    r = simulate_graph(fan, None, arrivals=[0.0, 100.0], warmup=0.0, cores=1, allow_unstable=True)
    # both at half speed: a's 1 s of work is done at 2; b has 2 s left, alone, done at 4
    assert r.stages["a"].finish.tolist() == [2.0, 102.0] and r.stages["b"].finish.tolist() == [4.0, 104.0]
    assert r.finish.tolist() == [4.0, 104.0]


def test_a_stage_that_names_one_dependency_twice_is_entered_once_on_shared_cores():
    twice = {"a": (Stage(service_time=1.0), ["request"]), "b": (Stage(service_time=0.5), ["request"]),
             "d": (Stage(service_time=0.25), ["a", "a", "b"])}
    common = {"arrivals": [0.0, 0.5, 3.0], "warmup": 0.0, "allow_unstable": True}
    shared, alone = simulate_graph(twice, None, cores=100, **common), simulate_graph(twice, None, **common)
    assert shared.stages["d"].batch_size.tolist() == [1, 1, 1]
    np.testing.assert_allclose(shared.finish, alone.finish, rtol=0, atol=1e-12)


def test_numpy_numbers_and_per_stage_hop_work_are_accepted():
    chain = {"a": (Stage(service_time=0.5), ["request"]), "b": (Stage(service_time=0.5), ["a"])}
    r = simulate_graph(chain, None, arrivals=[0.0, 100.0], warmup=0.0, cores=np.float64(2.0),
                       hop_work={"b": 0.25}, allow_unstable=True)
    assert r.finish.tolist() == [1.25, 101.25]  # only the hand-off into b costs work
    assert r.stages["b"].arrival.tolist() == [0.75, 100.75]


def test_a_batching_stage_is_not_refused_at_a_load_its_batches_carry():
    # one at a time, 0.9 requests/s of 1.5 s would need 1.35 cores; batches of 4 at 2.4 s need 0.54
    batched = {"a": (Stage(service_time=(1.2, 0.3), max_batch_size=4, max_wait=1.0), ["request"])}
    r = simulate_graph(batched, 0.9, 5_000, cores=1, seed=1)
    assert r.throughput == pytest.approx(0.9, rel=0.1)


def test_hop_work_is_one_thread_that_queues_the_hand_offs_and_takes_a_core():
    wide = {"a": (Stage(service_time=1.0, replicas=2), ["request"])}
    # no cores given: only the one thread serialises; request 1 is handed in after request 0
    r = simulate_graph(wide, None, arrivals=[0.0, 0.0], warmup=0.0, hop_work=1.0, allow_unstable=True)
    assert r.stages["a"].arrival.tolist() == [1.0, 2.0] and r.finish.tolist() == [2.0, 3.0]
    # one core: request 1's hand-off (from 1 s) shares it with request 0's batch, both done at 3
    r = simulate_graph(wide, None, arrivals=[0.0, 0.0], warmup=0.0, hop_work=1.0, cores=1,
                       allow_unstable=True)
    assert r.stages["a"].arrival.tolist() == [1.0, 3.0] and r.finish.tolist() == [3.0, 4.0]
    # a lone request pays hop_work then hop_delay on every stage it enters
    chain = {f"s{k}": (Stage(service_time=0.5), ["request" if k == 0 else f"s{k - 1}"]) for k in range(3)}
    lone = simulate_graph(chain, None, arrivals=[0.0, 100.0], warmup=0.0, hop_work=0.25, hop_delay=0.125, cores=2)
    assert (lone.finish - lone.arrival).tolist() == [3 * (0.5 + 0.25 + 0.125)] * 2


def test_a_load_the_cores_cannot_carry_is_refused_naming_the_cores():
    pair = {"a": (Stage(service_time=1.0, replicas=3), ["request"]), "b": (Stage(service_time=0.5), ["a"])}
    simulate_graph(pair, 0.6, 2_000, cores=1)  # 0.6 + 0.3 = 0.9 of one core: stable
    # hand-offs of 0.33 s into each of two stages add 0.6 * 0.66 = 0.396: 1.296 cores
    with pytest.raises(UnstableLoadError, match=r"cores=1 cannot keep up.*1\.296 cores.*stage 'a'"):
        simulate_graph(pair, 0.6, 2_000, cores=1, hop_work=0.33)
    with pytest.raises(UnstableLoadError, match="hand-off thread cannot keep up"):
        simulate_graph(pair, 0.6, 2_000, hop_work=1.0)
    assert simulate_graph(pair, 0.6, 2_000, cores=1, hop_work=0.33, allow_unstable=True).throughput < 0.6


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cores": 0}, "cores must be a number > 0"),
    ({"cores": -2}, "cores must be a number > 0"),
    ({"cores": "2"}, "cores must be a number > 0"),
    ({"cores": True}, "cores must be a number > 0"),
    ({"cores": float("nan")}, "cores must be a number > 0"),
    ({"hop_work": -1.0}, "hop_work"),
    ({"hop_work": float("nan")}, "hop_work"),
    ({"hop_work": {"nope": 1.0}}, "hop_work names 'nope'"),
    ({"cores": 2, "queue_timeouts": {"a": 1.0}}, "stage 'a' sheds load"),
])
def test_bad_core_arguments_are_named_before_anything_runs(kwargs, message):
    one = {"a": (Stage(service_time=1.0), ["request"])}
    with pytest.raises(ValueError, match=message):
        simulate_graph(one, 0.5, 100, **kwargs)


def test_a_shedding_stage_is_refused_on_shared_cores():
    shedding = {"a": (Stage(service_time=1.0, max_queue_size=2), ["request"])}
    with pytest.raises(ValueError, match="stage 'a' sheds load"):
        simulate_graph(shedding, 0.5, 100, cores=1)
    with pytest.raises(ValueError, match="stage 'a' sheds load"):
        simulate_graph(shedding, 0.5, 100, hop_work=0.1)
