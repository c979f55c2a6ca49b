"""batching.GraphServer: a stage graph served for real keeps every promise under load, failure and shutdown.

No timing asserts: a test waits for a state (a gate, a queue length) with a generous deadline, never for a
duration (the benchmarks measure speed).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import psutil
import pytest

from infergraph_lite import run_graph
from infergraph_lite.core.execute import NodeError
from infergraph_lite.core.graph import CycleError, InvalidNodeError, MissingDependencyError, MissingInputError
from infergraph_lite.core.stage import Stage
from infergraph_lite.lessons.examples import (
    cpu_bound_stages,
    python_work,
    text_pipeline,
    text_pipeline_stages,
    trained_text_models,
)
from infergraph_lite.lessons.models import load_texts
from infergraph_lite.serving.batcher import BatchError, QueueFullError
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop
from infergraph_lite.serving.processes import process_tree
from infergraph_lite.serving.stage_workers import RemoteError, WorkerDiedError
from tests import stage_fns

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


# --- workers="processes": each stage's replicas in worker processes ---------------------------------------------


def worker_processes() -> set[int]:
    return set(process_tree())


@pytest.fixture()
def no_process_left():
    """Every worker a test starts is gone when it ends (and none was there before that the test could hide)."""
    before = worker_processes()
    yield
    wait_until(lambda: worker_processes() <= before, seconds=15)


def test_process_mode_answers_what_thread_mode_answers_and_leaves_the_stages_unchanged(no_process_left):
    stages = cpu_bound_stages({"parse": 50, "score": 70}, options={"parse": {"max_batch_size": 4, "max_wait": 0.001},
                                                                  "score": {"replicas": 2}})
    stages["total"] = (Stage(fn=stage_fns.add_pairs, max_batch_size=8), ["parse", "score"])
    given = dict(stages)
    with GraphServer(stages, workers="processes", name="procs") as server:
        pids = server.worker_pids
        assert {n: len(p) for n, p in pids.items()} == {"parse": 1, "score": 2, "total": 1}
        assert set().union(*pids.values()) <= worker_processes()
        assert repr(server) == "GraphServer(3 stages, 4 threads, 4 worker processes, serving)"
        in_processes = [f.result(timeout=60) for f in [server.submit({"request": i}) for i in range(40)]]
    with GraphServer(stages) as threaded:
        in_threads = [f.result(timeout=60) for f in [threaded.submit({"request": i}) for i in range(40)]]
    assert in_processes == in_threads
    assert in_processes[3] == {"parse": python_work([3], 50)[0], "score": python_work(python_work([3], 50), 70)[0],
                               "total": python_work([3], 50)[0] + python_work(python_work([3], 50), 70)[0]}
    assert stages == given and all(stages[n] is given[n] for n in given)  # the caller's dict is not touched
    assert list(server.batchers) == ["parse", "score", "total"] and server.workers == "processes"
    assert server.worker_pids == {"parse": [], "score": [], "total": []}
    assert not set().union(*pids.values()) & worker_processes()


def test_a_failing_batch_in_a_worker_fails_its_requests_with_the_exception_intact(no_process_left):
    stages = {"check": (Stage(fn=functools.partial(stage_fns.fail_on, bad=13)), ["request"]),
              "odd": (Stage(fn=functools.partial(stage_fns.unpicklable_answers)), ["request"]),
              "stop": (Stage(fn=stage_fns.raise_system_exit), ["check"])}
    with GraphServer({"check": stages["check"]}, workers="processes") as server:
        futures = [server.submit({"request": i}) for i in range(20)]
        wait_until(lambda: all(f.done() for f in futures), seconds=60)
        pid = server.worker_pids["check"]
    failed = {i for i, f in enumerate(futures) if f.exception() is not None}
    assert failed == {13}  # batches of one: only the bad request fails
    error = futures[13].exception()
    assert isinstance(error, NodeError) and error.node == "check"
    assert type(error.__cause__) is ValueError and str(error.__cause__) == "item 13 is bad"
    assert [futures[i].result() for i in (0, 12, 14)] == [{"check": 0}, {"check": 12}, {"check": 14}]
    assert len(pid) == 1
    with GraphServer({"odd": stages["odd"]}, workers="processes") as server:
        with pytest.raises(NodeError, match="'odd'") as caught:
            server.submit({"request": 1}).result(timeout=60)
        assert isinstance(caught.value.__cause__, RemoteError) and "pickle" in str(caught.value.__cause__).lower()
    with GraphServer({"stop": (stages["stop"][0], ["request"])}, workers="processes") as server:
        with pytest.raises(NodeError, match=r"node 'stop' failed: SystemExit: a model called exit\(\)"):
            server.submit({"request": 2}).result(timeout=60)
        assert len(server.worker_pids["stop"]) == 1 and server.stage_workers["stop"].replaced == []  # it serves on


def test_a_worker_killed_mid_batch_fails_its_batch_naming_stage_and_pid_and_is_replaced(tmp_path, no_process_left):
    started, release = tmp_path / "started", tmp_path / "release"
    fn = functools.partial(stage_fns.wait_for_file, started=str(started), release=str(release))
    stages = {"slow": (Stage(fn=fn, max_batch_size=8), ["request"])}
    with GraphServer(stages, workers="processes") as server:
        [pid] = server.worker_pids["slow"]
        victim = server.submit({"request": "a"})
        wait_until(started.exists, seconds=60)
        assert int(started.read_text()) == pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(NodeError, match="'slow'") as caught:
            victim.result(timeout=60)
        cause = caught.value.__cause__
        assert isinstance(cause, WorkerDiedError) and cause.stage == "slow" and cause.pid == pid
        assert str(pid) in str(cause) and cause.exitcode == -signal.SIGKILL
        release.touch()
        assert server.submit({"request": "b"}).result(timeout=60) == {"slow": "b"}  # its replacement answers
        [fresh] = server.worker_pids["slow"]
        assert fresh != pid and server.stage_workers["slow"].replaced == [pid]
    assert not psutil.pid_exists(fresh)


def test_a_worker_that_exits_and_cannot_be_replaced_marks_its_stage_failed(monkeypatch, no_process_left):
    stages = {"pre": (Stage(fn=stage_fns.add_pairs), ["a", "b"]),
              "risky": (Stage(fn=functools.partial(stage_fns.exit_on, bad=7)), ["pre"])}
    with GraphServer(stages, inputs=["a", "b"], workers="processes") as server:
        assert server.submit({"a": 1, "b": 2}).result(timeout=60) == {"pre": 3, "risky": 3}
        [pid] = server.worker_pids["risky"]
        workers = server.stage_workers["risky"]

        def no_more_processes() -> None:
            raise OSError("no more processes on this machine")

        monkeypatch.setattr(workers, "_spawn", no_more_processes)
        with pytest.raises(NodeError, match="'risky'") as caught:
            server.submit({"a": 3, "b": 4}).result(timeout=60)
        assert isinstance(caught.value.__cause__, WorkerDiedError) and caught.value.__cause__.exitcode == 3
        assert caught.value.__cause__.pid == pid
        later = server.submit({"a": 1, "b": 1})
        with pytest.raises(NodeError, match="'risky'") as caught:
            later.result(timeout=60)
        assert "the stage is failed" in str(caught.value.__cause__)


def test_a_worker_that_dies_mid_batch_is_named_with_the_last_line_of_its_stderr(no_process_left):
    stages = {"risky": (Stage(fn=functools.partial(stage_fns.complain_and_exit, bad=7)), ["request"])}
    with GraphServer(stages, workers="processes") as server:
        [pid] = server.worker_pids["risky"]
        began = time.monotonic()
        with pytest.raises(NodeError, match="'risky'") as caught:
            server.submit({"request": 7}).result(timeout=60)
        assert time.monotonic() - began < 10, "the death was noticed at once"
        cause = caught.value.__cause__
        assert isinstance(cause, WorkerDiedError) and (cause.pid, cause.exitcode) == (pid, 3)
        assert cause.log_line == "fatal: item 7 corrupted the model's memory" and cause.log_line in str(cause)
        assert server.submit({"request": 1}).result(timeout=60) == {"risky": 1}  # its replacement answers


def test_a_worker_that_dies_while_starting_is_named_with_its_stderr_and_nothing_is_left(no_process_left):
    stages = {"pre": (Stage(fn=stage_fns.add_pairs), ["a", "b"]),
              "load": (Stage(fn=stage_fns.DiesWhenLoaded("fatal: cannot map the weights")), ["pre"])}
    began = time.monotonic()
    died = r"stage 'load': worker process \d+ exited while starting \(exit code 4\); its stderr ends: 'fatal: cannot"
    with pytest.raises(WorkerDiedError, match=died):
        GraphServer(stages, inputs=["a", "b"], workers="processes")
    assert time.monotonic() - began < 20, "noticed at the death, not at the 60 s start_timeout"


def test_close_is_bounded_with_a_batch_that_never_ends_and_stops_the_worker_by_pid(tmp_path, no_process_left):
    started = tmp_path / "started"
    fn = functools.partial(stage_fns.wait_for_file, started=str(started), release=str(tmp_path / "never"))
    server = GraphServer({"stuck": (Stage(fn=fn), ["request"])}, workers="processes")
    [pid] = server.worker_pids["stuck"]
    stuck, queued = server.submit({"request": 1}), server.submit({"request": 2})
    wait_until(started.exists, seconds=60)
    began = time.monotonic()
    server.close(timeout=0.5)
    assert time.monotonic() - began < 20  # bounded: 0.5 s of draining, then the worker is stopped by signal
    for future in (stuck, queued):
        with pytest.raises(NodeError, match=r"'stuck' failed: BatchError: .*close\(\) gave up") as caught:
            future.result(timeout=0)
        assert isinstance(caught.value.__cause__, BatchError)
    assert not psutil.pid_exists(pid)


def test_process_mode_refuses_a_stage_fn_a_worker_cannot_import_by_name_before_any_process(monkeypatch):
    before = worker_processes()

    def defined_in_main(items: list[Any]) -> list[Any]:
        return items

    defined_in_main.__module__, defined_in_main.__qualname__ = "__main__", "defined_in_main"
    monkeypatch.setattr(sys.modules["__main__"], "defined_in_main", defined_in_main, raising=False)
    good = Stage(fn=stage_fns.add_pairs)
    for fn, why in [(each(len), "does not pickle"), (defined_in_main, "defined in __main__")]:
        stages = {"good": (good, ["request"]), "bad": (Stage(fn=fn), ["good"])}
        with pytest.raises(ValueError, match=rf"stage 'bad': its fn .* cannot run in a worker process: .*{why}"):
            GraphServer(stages, workers="processes")
        assert worker_processes() == before  # refused before any process started
    with pytest.raises(ValueError, match="workers must be one of"):
        GraphServer({"good": (good, ["request"])}, workers="fibers")


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_each_batch_records_the_cpu_seconds_its_function_used_where_it_ran(workers):
    # 2 ms of CPU per item and a 50 ms sleep per batch: the work holds the CPU part, not the sleep, not the pipe.
    # The margin is half the sleep: on a virtual machine whose host takes the core away for a few ms, that pause
    # is charged to the thread that was running (here the spin's last round), and it is not the sleep.
    nap = 0.05
    fn = functools.partial(stage_fns.spin_then_nap, spin=0.002, nap=nap)
    with GraphServer({"a": (Stage(fn=fn, max_batch_size=4), ["request"])}, workers=workers) as server:
        for f in [server.submit({"request": i}) for i in range(8)]:
            f.result(timeout=60)
        batches, records = server.batchers["a"].batches, server.stage_records()["a"]
    for batch in batches:
        assert 0.002 * batch.size <= batch.work < 0.002 * batch.size + nap / 2
        assert batch.end - batch.start >= batch.work + nap  # the wall time holds the sleep as well
    assert sorted(r.work for r in records) == sorted(b.work for b in batches for _ in range(b.size))


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_batches_since_and_work_per_request_count_only_the_batches_after_the_mark(workers):
    # 2 ms of CPU per item in "a", 4 ms in "b": per request, whatever the batches were
    a = functools.partial(stage_fns.spin_then_nap, spin=0.002, nap=0.0)
    b = functools.partial(stage_fns.spin_then_nap, spin=0.004, nap=0.0)
    stages = {"a": (Stage(fn=a, max_batch_size=4), ["request"]), "b": (Stage(fn=b, max_batch_size=4), ["a"])}
    with GraphServer(stages, workers=workers) as server:
        server.submit({"request": 0}).result(timeout=60)
        mark = server.batch_marks()
        assert mark == {"a": 1, "b": 1}
        for f in [server.submit({"request": i}) for i in range(6)]:
            f.result(timeout=60)
        work = server.work_per_request(mark)
        window = {name: server.batchers[name].batches[mark[name]:] for name in stages}
        assert server.batches_since(mark) == window and server.batches_since() == {
            name: server.batchers[name].batches for name in stages}
    assert {name: sum(x.size for x in batches) for name, batches in window.items()} == {"a": 6, "b": 6}
    assert 0.002 <= work["a"] < 0.002 + 0.004 and 0.004 <= work["b"] < 0.004 + 0.004
    assert work == pytest.approx({name: sum(x.work for x in batches) / 6 for name, batches in window.items()})
    assert server.work_per_request(server.batch_marks()) == {"a": pytest.approx(float("nan"), nan_ok=True),
                                                            "b": pytest.approx(float("nan"), nan_ok=True)}
    with pytest.raises(ValueError, match=r"since names stages this server does not have: \['c'\]"):
        server.work_per_request({"c": 0})
    for bad in (-1, 99, 1.5):
        with pytest.raises(ValueError, match=rf"since\['a'\] must be a batch count from 0 to the \d+ .* got {bad}"):
            server.work_per_request({"a": bad})
        with pytest.raises(ValueError, match=r"since\['a'\] must be a batch count"):
            server.batches_since({"a": bad})
