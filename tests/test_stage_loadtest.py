"""stage.py and loadtest.py: stage specs are checked where they are written; load generators measure any server."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

from infergraph_lite import AIMD, DynamicBatcher, Exponential, InvalidNodeError, QueueFullError, Stage, capacity
from infergraph_lite.core.stage import mean_service_time, prepare_stages, service_time_fn
from infergraph_lite.lessons.examples import text_pipeline, text_pipeline_stages, trained_text_models
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "a Stage needs a service_time"),
        ({"service_time": -1.0}, "service_time must be >= 0, got -1.0"),
        ({"service_time": (1.0, -0.1)}, r"service_time \(alpha, beta\) must be >= 0"),
        ({"service_time": 1.0, "replicas": 0}, "replicas must be an integer >= 1, got 0"),
        ({"service_time": 1.0, "max_batch_size": 0}, "max_batch_size must be an integer >= 1, None or an AIMD"),
        ({"service_time": 1.0, "max_wait": -2}, "max_wait must be >= 0, got -2"),
        ({"service_time": 1.0, "max_queue_size": 0}, "max_queue_size must be an integer >= 1 or None, got 0"),
        ({"fn": "not a function"}, "fn must be a batch function list -> list"),
        ({"service_time": Exponential(1.0), "replicas": 2.0}, "replicas must be an integer >= 1, got 2.0"),
    ],
)
def test_a_bad_stage_is_refused_where_it_is_written_naming_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Stage(**kwargs)


def test_a_stage_normalises_numpy_numbers_and_allows_a_free_join():
    stage = Stage(service_time=0, max_batch_size=np.int64(8), replicas=np.int32(2))
    assert (stage.max_batch_size, stage.replicas) == (8, 2) and type(stage.replicas) is int
    assert stage.capacity() == math.inf
    assert Stage(service_time=(2.0, 0.15), max_batch_size=16, replicas=2).capacity() == pytest.approx(
        2 * 16 / 4.4)


def test_exponential_service_is_seeded_and_has_its_mean():
    draw = service_time_fn(Exponential(2.0), np.random.default_rng(7))
    samples = np.array([draw(1) for _ in range(20_000)])
    assert samples.mean() == pytest.approx(2.0, rel=0.03) and mean_service_time(Exponential(2.0), 16) == 2.0
    assert capacity(Exponential(2.0), max_batch_size=4, replicas=3) == pytest.approx(6.0)


def test_stage_graphs_are_checked_node_by_node_before_anything_runs():
    with pytest.raises(InvalidNodeError, match=r"node 'b': expected a Stage in place of the function, got builtin"):
        prepare_stages({"a": (Stage(service_time=1.0), ["request"]), "b": (len, ["a"])})
    with pytest.raises(InvalidNodeError, match="node 'a': this Stage has no service_time"):
        prepare_stages({"a": (Stage(fn=list), ["request"])}, need="service_time")
    assert prepare_stages({"a": (Stage(service_time=1.0, max_batch_size=AIMD(2.0)), ["request"])}).order == ["a"]


def test_text_pipeline_stages_answer_as_the_one_at_a_time_pipeline_does():
    stages = text_pipeline_stages()
    nodes = text_pipeline(*trained_text_models())
    texts = ["The pizza was excellent for lunch.", "My laptop crashed again, awful.", "A lovely beach holiday."]
    # Run the stage graph batch-wise by hand, stage by stage in order, to check each batch function.
    values: dict[str, list] = {"text": texts}
    for name in ["tokenize", "embed", "topic", "sentiment", "merge", "format"]:
        stage, deps = stages[name]
        items = values[deps[0]] if len(deps) == 1 else list(zip(*(values[d] for d in deps)))
        values[name] = list(stage.fn(items))
    from infergraph_lite import run_graph
    assert values["format"] == [run_graph(nodes, {"text": t})["format"] for t in texts]
    with pytest.raises(ValueError, match=r"options name stages that the text pipeline does not have: \['embedd'\]"):
        text_pipeline_stages(options={"embedd": {"max_batch_size": 4}})


def test_open_loop_keeps_its_schedule_and_counts_failures():
    def fn(xs):
        if any(x == 3 for x in xs):
            raise ValueError("bad request 3")
        return xs

    with DynamicBatcher(fn, max_batch_size=1) as batcher:
        report = run_open_loop(batcher, np.arange(6) * 0.002, make_item=lambda i: i)
    assert report.failed == 1 and len(report.latencies) == 5 and report.throughput > 0
    assert set(report.summary()) == {"throughput_rps", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "failed",
                                     "refused"}


def test_closed_loop_never_has_more_requests_in_flight_than_clients():
    in_flight, most = 0, 0
    lock = threading.Lock()

    def fn(xs):
        time.sleep(0.001)
        return xs

    def submit(item):
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        future = batcher.submit(item)

        def done(_):
            nonlocal in_flight
            with lock:
                in_flight -= 1
        future.add_done_callback(done)
        return future

    with DynamicBatcher(fn, max_batch_size=8, max_wait=0.0) as batcher:
        report = run_closed_loop(submit, n_clients=4, n_requests=80, make_item=lambda i: i)
    assert len(report.latencies) == 80 and report.failed == 0 and most <= 4
    assert "closed loop, 4 clients: 80 requests" in str(report)


def test_closed_loop_stops_at_its_time_bound():
    def slow(xs):
        time.sleep(0.05)
        return xs

    with DynamicBatcher(slow) as batcher:
        report = run_closed_loop(batcher, n_clients=1, n_requests=10_000, make_item=lambda i: i, max_seconds=0.3)
    assert 1 <= len(report.latencies) < 100


def test_replicas_serve_batches_at_the_same_time():
    gate = threading.Barrier(2, timeout=5)

    def meet(xs):
        gate.wait()  # only returns when two batches are being served at once
        return xs

    with DynamicBatcher(meet, max_batch_size=1, replicas=2) as batcher:
        futures = [batcher.submit(i) for i in range(4)]
        assert [f.result(timeout=10) for f in futures] == [0, 1, 2, 3]


def test_aimd_runs_in_the_real_batcher_too():
    with DynamicBatcher(lambda xs: xs, max_batch_size=AIMD(latency_target=10.0, cap=1, max_size=4)) as batcher:
        for _ in range(20):
            [f.result(timeout=5) for f in [batcher.submit(i) for i in range(8)]]
    assert max(b.size for b in batcher.batches) == 4 and batcher.max_batch_size == 4


def test_open_loop_counts_refusals_at_submit_and_serves_the_rest():
    entered, gate = threading.Event(), threading.Event()

    def fn(xs):
        entered.set()
        gate.wait(5.0)  # the first batch holds the worker, so the queue fills behind it
        return xs

    with DynamicBatcher(fn, max_batch_size=1, max_queue_size=2) as batcher:
        first = batcher.submit(-1)
        assert entered.wait(5.0)
        calls = 0

        def submit(item):
            nonlocal calls
            calls += 1
            try:
                return batcher.submit(item)
            finally:
                if calls == 7:
                    gate.set()  # after the last submit: only then may the worker drain the queue

        report = run_open_loop(submit, np.zeros(7), make_item=lambda i: i, timeout=10.0)
        first.result(timeout=5.0)
    # 2 wait behind the running request; the other 5 are refused synchronously, and nothing is abandoned
    assert (report.refused, len(report.latencies), report.failed) == (5, 2, 0)
    assert "refused 5" in str(report)


def test_open_loop_times_requests_from_their_schedule_and_reports_its_lag():
    def slow_submit(item):
        time.sleep(0.05)  # a submit that blocks makes the generator fall behind its schedule
        future: Future = Future()
        future.set_result(item)
        return future

    report = run_open_loop(slow_submit, np.zeros(5), make_item=lambda i: i)
    # request i was due at 0 but submitted after i slow submits: its latency includes that lag
    assert report.max_lag >= 0.15
    assert report.latencies[-1] >= 0.2 > report.latencies[0]


def test_closed_loop_counts_refusals_apart_from_failures():
    def submit(item):
        if item % 2:
            raise QueueFullError("full")
        future: Future = Future()
        future.set_result(item)
        return future

    report = run_closed_loop(submit, n_clients=2, n_requests=10, make_item=lambda i: i)
    assert (report.refused, report.failed, len(report.latencies)) == (5, 0, 5)
