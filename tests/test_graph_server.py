"""batching.GraphServer: a stage graph served for real keeps every promise under load, failure and shutdown.

No timing asserts: a test waits for a state (a gate, a queue length) with a generous deadline, never for a
duration (the benchmarks measure speed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from infergraph_lite import run_graph
from infergraph_lite.core.execute import NodeError
from infergraph_lite.core.graph import CycleError, InvalidNodeError, MissingDependencyError, MissingInputError
from infergraph_lite.core.stage import Stage
from infergraph_lite.lessons.examples import text_pipeline, text_pipeline_stages, trained_text_models
from infergraph_lite.lessons.models import load_texts
from infergraph_lite.serving.batcher import QueueFullError
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop

TEXT_STAGES = ["tokenize", "embed", "topic", "sentiment", "merge", "format"]


def each(f: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """A batch function applying ``f`` to every item."""
    return lambda items: [f(x) for x in items]


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll for a state the test needs (not a timing claim); fail if it never comes."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the state the test waits for never came")
        time.sleep(0.001)


def server_threads(server: GraphServer) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(server.name + ":")]


def gated(gate: threading.Event, entered: threading.Event | None = None, seen: list | None = None):
    """A batch function that blocks until ``gate`` opens (telling ``entered`` it started), recording batches."""

    def fn(items: list[Any]) -> list[Any]:
        if entered is not None:
            entered.set()
        assert gate.wait(10), "the test never opened the gate"
        if seen is not None:
            seen.append(list(items))
        return list(items)

    return fn


def same_answer(served: dict[str, Any], expected: dict[str, Any]) -> bool:
    if served.keys() != expected.keys():
        return False
    return all(np.array_equal(served[k], expected[k]) if isinstance(expected[k], np.ndarray)
               else served[k] == expected[k] for k in expected)


@pytest.fixture(scope="module")
def models():
    return trained_text_models()


def test_text_pipeline_answers_equal_run_graph_for_many_concurrent_requests(models):
    texts = [row.text for row in load_texts()]
    options = {"tokenize": {"max_batch_size": 8, "max_wait": 0.001},
               "embed": {"max_batch_size": 16, "max_wait": 0.001, "replicas": 2},
               "topic": {"max_batch_size": 32}, "sentiment": {"max_batch_size": 32, "replicas": 2},
               "merge": {"max_batch_size": 4}}
    futures: dict[int, Future] = {}
    lock = threading.Lock()
    with GraphServer(text_pipeline_stages(*models, options=options), inputs=["text"]) as server:
        def client(k: int) -> None:
            for i in range(k, len(texts), 4):
                future = server.submit({"text": texts[i]})
                with lock:
                    futures[i] = future

        clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        answers = {i: f.result(timeout=30) for i, f in futures.items()}
    nodes = text_pipeline(*models)
    for i, text in enumerate(texts):
        expected = {k: v for k, v in run_graph(nodes, {"text": text}).items() if k != "text"}
        assert same_answer(answers[i], expected), f"request {i} ({text!r}) got a different answer"
    assert list(answers[0]) == TEXT_STAGES  # every stage's result, in topological order
    assert len(server.records) == len(texts) and server.failed == 0
    assert all(len(rows) == len(texts) for rows in server.stage_records().values())


def test_requests_waiting_at_a_stage_are_batched_together():
    gate, entered, seen = threading.Event(), threading.Event(), []
    stages = {"slow": (Stage(fn=gated(gate, entered, seen), max_batch_size=8), ["x"]),
              "double": (Stage(fn=each(lambda v: 2 * v), max_batch_size=8), ["slow"])}
    with GraphServer(stages, inputs=["x"]) as server:
        first = server.submit({"x": 0})
        assert entered.wait(10)  # request 0 is inside a batch of one, holding the only worker
        rest = [server.submit({"x": i}) for i in range(1, 17)]
        gate.set()
        answers = [f.result(timeout=10) for f in [first, *rest]]
    assert [a["double"] for a in answers] == [2 * i for i in range(17)]
    assert [len(batch) for batch in seen] == [1, 8, 8]  # the 16 that waited went in two full batches
    sizes = [r.batch_size for r in server.stage_records()["slow"]]
    assert max(sizes) == 8 and server.stage_times()["slow"].batch_size > 1


def test_a_stage_with_several_dependencies_gets_a_tuple_in_listed_order_inputs_included():
    stages = {"n": (Stage(fn=each(len)), ["text"]),
              "pair": (Stage(fn=each(lambda args: args)), ["text", "n"]),
              "reversed": (Stage(fn=each(lambda args: args)), ["n", "text"])}
    with GraphServer(stages, inputs=["text"]) as server:
        answer = server.submit({"text": "kiwi"}).result(timeout=10)
    assert answer == {"n": 4, "pair": ("kiwi", 4), "reversed": (4, "kiwi")}


def test_a_failing_batch_fails_only_its_own_requests_with_a_node_error_naming_the_stage():
    def picky(items: list[str]) -> list[str]:
        if "bad" in items:
            raise ValueError("cannot parse 'bad'")
        return [s.upper() for s in items]

    # `check` forms batches only when full (a 60 s window), so requests 0-1 and 2-3 are the batches.
    stages = {"pre": (Stage(fn=each(str.strip)), ["text"]),
              "check": (Stage(fn=picky, max_batch_size=2, max_wait=60.0), ["pre"]),
              "out": (Stage(fn=each(lambda s: s + "!")), ["check"])}
    with GraphServer(stages, inputs=["text"]) as server:
        futures = [server.submit({"text": t}) for t in [" a ", "b", "bad", "c"]]
        assert [f.result(timeout=10)["out"] for f in futures[:2]] == ["A!", "B!"]
        for f in futures[2:]:
            with pytest.raises(NodeError, match=r"node 'check' failed: ValueError: cannot parse 'bad'") as info:
                f.result(timeout=10)
            assert info.value.node == "check" and isinstance(info.value.__cause__, ValueError)
        later = [server.submit({"text": t}) for t in ["d", "e"]]  # the stage goes on serving
        assert [f.result(timeout=10)["out"] for f in later] == ["D!", "E!"]
    assert server.failed == 2 and len(server.records) == 4


def test_a_failing_branch_fails_the_request_once_and_the_join_never_sees_it():
    joined = []

    def join(pairs: list[tuple[int, int]]) -> list[int]:
        joined.extend(pairs)
        return [a + b for a, b in pairs]

    def fragile(items: list[int]) -> list[int]:
        if 13 in items:
            raise KeyError(13)
        return items

    stages = {"a": (Stage(fn=fragile), ["x"]), "b": (Stage(fn=each(lambda v: 10 * v)), ["x"]),
              "join": (Stage(fn=join), ["a", "b"])}
    with GraphServer(stages, inputs=["x"]) as server:
        futures = [server.submit({"x": x}) for x in [1, 13, 2]]
        with pytest.raises(NodeError, match="node 'a' failed: KeyError") as info:
            futures[1].result(timeout=10)
        assert info.value.node == "a"
        assert [futures[0].result(timeout=10)["join"], futures[2].result(timeout=10)["join"]] == [11, 22]
    assert sorted(joined) == [(1, 10), (2, 20)] and server.failed == 1


def test_a_stage_returning_the_wrong_number_of_results_fails_with_a_node_error():
    stages = {"short": (Stage(fn=lambda items: items[:-1]), ["x"])}
    with GraphServer(stages, inputs=["x"]) as server, pytest.raises(NodeError, match="node 'short' failed"):
        server.submit({"x": 1}).result(timeout=10)


def test_a_full_first_stage_refuses_the_request_and_loses_none():
    gate, entered = threading.Event(), threading.Event()
    stages = {"slow": (Stage(fn=gated(gate, entered), max_queue_size=1), ["x"]),
              "after": (Stage(fn=each(lambda v: v + 1)), ["slow"])}
    with GraphServer(stages, inputs=["x"]) as server:
        running = server.submit({"x": 0})
        assert entered.wait(10)
        queued = server.submit({"x": 1})
        refused = server.submit({"x": 2})
        with pytest.raises(QueueFullError, match=r"stage 'slow' refused the request") as info:
            refused.result(timeout=0)  # refused at once: the future is already failed
        assert info.value.stage == "slow"
        gate.set()
        assert [running.result(timeout=10)["after"], queued.result(timeout=10)["after"]] == [1, 2]
    assert server.failed == 1 and len(server.records) == 2


def test_a_full_downstream_stage_refuses_a_request_that_another_branch_already_took():
    gate, entered, joined = threading.Event(), threading.Event(), []
    stages = {"pre": (Stage(fn=each(lambda v: v)), ["x"]),
              "slow": (Stage(fn=gated(gate, entered), max_queue_size=1), ["pre"]),
              "fast": (Stage(fn=each(lambda v: -v)), ["pre"]),
              "join": (Stage(fn=lambda pairs: joined.extend(pairs) or [a + b for a, b in pairs]), ["slow", "fast"])}
    with GraphServer(stages, inputs=["x"]) as server:
        first = server.submit({"x": 1})
        assert entered.wait(10)
        second = server.submit({"x": 2})
        wait_until(lambda: server.batchers["slow"].queued() == 1)
        third = server.submit({"x": 3})  # passes `pre` and `fast`, refused by the full `slow`
        with pytest.raises(QueueFullError, match="stage 'slow'") as info:
            third.result(timeout=10)
        assert info.value.stage == "slow" and isinstance(info.value.__cause__, QueueFullError)
        gate.set()
        assert [first.result(timeout=10)["join"], second.result(timeout=10)["join"]] == [0, 0]
    assert sorted(joined) == [(1, -1), (2, -2)]  # the refused request's other branch was dropped
    assert server.failed == 1 and all(f.done() for f in [first, second, third])


def test_close_serves_everything_inside_then_refuses_and_leaves_no_thread():
    before = set(threading.enumerate())
    # Windows of a minute: without close() these batches would wait; close() serves them at once.
    stages = {"first": (Stage(fn=each(lambda v: v + 1), max_batch_size=100, max_wait=60.0), ["x"]),
              "second": (Stage(fn=each(lambda v: v * 10), max_batch_size=100, max_wait=60.0, replicas=3), ["first"])}
    server = GraphServer(stages, inputs=["x"])
    assert len(server_threads(server)) == server.threads == 4
    futures = [server.submit({"x": i}) for i in range(25)]
    server.close()
    assert [f.result(timeout=0)["second"] for f in futures] == [(i + 1) * 10 for i in range(25)]
    with pytest.raises(RuntimeError, match=r"submit\(\) after close\(\)"):
        server.submit({"x": 0})
    assert server_threads(server) == [] and set(threading.enumerate()) <= before


def test_no_thread_is_left_behind_after_load_failures_and_refusals():
    before = set(threading.enumerate())
    stages = {"a": (Stage(fn=lambda xs: [1 // x for x in xs], max_batch_size=4, replicas=2), ["x"]),
              "b": (Stage(fn=each(lambda v: v), max_queue_size=2), ["a"])}
    with GraphServer(stages, inputs=["x"]) as server:
        futures = [server.submit({"x": i % 5}) for i in range(300)]
    assert all(f.done() for f in futures)  # answered, failed or refused: none left hanging
    outcomes = [type(f.exception()).__name__ if f.exception() else "ok" for f in futures]
    assert set(outcomes) <= {"ok", "NodeError", "QueueFullError"} and "NodeError" in outcomes
    assert outcomes.count("ok") == len(server.records) and len(futures) - len(server.records) == server.failed
    assert server_threads(server) == [] and set(threading.enumerate()) <= before


@pytest.mark.parametrize(("stages", "error"), [
    ({"a": (Stage(fn=each(len)), ["b"]), "b": (Stage(fn=each(len)), ["a"])}, CycleError),
    ({"a": (Stage(fn=each(len)), ["x", "nowhere"])}, MissingDependencyError),
    ({"a": (Stage(service_time=1.0), ["x"])}, InvalidNodeError),
    ({"a": (each(len), ["x"])}, InvalidNodeError),
])
def test_a_bad_stage_graph_is_refused_before_any_thread_starts(stages, error):
    before = threading.active_count()
    with pytest.raises(error):
        GraphServer(stages, inputs=["x"], name="never-started")
    assert threading.active_count() == before
    assert not any(t.name.startswith("never-started") for t in threading.enumerate())


def test_a_missing_input_is_refused_at_submit():
    with GraphServer({"n": (Stage(fn=each(len)), ["text"])}, inputs=["text"]) as server:
        with pytest.raises(MissingInputError, match="'text'"):
            server.submit({"txt": "typo"})
        assert server.submit({"text": "ok"}).result(timeout=10) == {"n": 2}


def test_load_generators_report_per_stage_times_for_their_own_run(models):
    texts = [row.text for row in load_texts()][:60]
    options = {name: {"max_batch_size": 8} for name in TEXT_STAGES}
    with GraphServer(text_pipeline_stages(*models, options=options), inputs=["text"]) as server:
        server.submit({"text": texts[0]}).result(timeout=10)  # a request before the runs: not in their reports
        closed = run_closed_loop(server, n_clients=4, n_requests=60, make_item=lambda i: {"text": texts[i]})
        arrivals = np.arange(40) * 0.0005
        opened = run_open_loop(server.submit, arrivals, make_item=lambda i: {"text": texts[i]})
    for report, n in [(closed, 60), (opened, 40)]:
        assert report.failed == 0 and len(report.latencies) == n
        assert list(report.stages) == TEXT_STAGES
        assert all(t.requests == n and t.compute > 0 and t.queue >= 0 and t.batch_size >= 1
                   for t in report.stages.values())
        assert "embed: queue" in str(report)
    assert len(server.records) == 101 and (server.latencies() > 0).all()


def test_a_graph_without_stages_answers_at_once():
    with GraphServer({}, inputs=["x"]) as server:
        assert server.submit({"x": 1}).result(timeout=1) == {} and server.threads == 0


def test_repr_and_thread_count():
    stages = {"a": (Stage(fn=each(len), replicas=2), ["x"]), "b": (Stage(fn=each(len)), ["x"])}
    server = GraphServer(stages, inputs=["x"])
    assert repr(server) == "GraphServer(2 stages, 3 threads, serving)"
    server.close()
    assert repr(server) == "GraphServer(2 stages, 3 threads, closed)"
