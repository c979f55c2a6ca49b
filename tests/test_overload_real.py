"""Overload on real servers: a full queue and an expired deadline are refusals, each seen by the client as the
framework reports it, and the load generators count them as refused (not failed).

The batcher and GraphServer tests block the batch function on an event, so what waits is decided by the test,
not by timing.  The Triton test starts the real binary (skips where the wheel cannot run); the Ray test starts
one local Ray (marked ``ray``: tens of seconds).
"""

from __future__ import annotations

import threading
import time

import pytest

from infergraph_lite.core.stage import Stage
from infergraph_lite.serving.batcher import (
    DynamicBatcher,
    QueueFullError,
    QueueTimeoutError,
    RequestRefusedError,
    is_refusal,
)
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop
from tests.overload_models import slow_stages


class Gate:
    """A batch function that holds its batch until ``open()``; ``entered`` is set when a batch is inside."""

    def __init__(self) -> None:
        self.entered, self.opened, self.seen = threading.Event(), threading.Event(), []

    def __call__(self, items: list) -> list:
        self.seen.extend(items)
        self.entered.set()
        assert self.opened.wait(30)
        return [f"done {x}" for x in items]

    def open(self) -> None:
        self.opened.set()


def test_a_request_past_its_queue_timeout_fails_before_any_batch_runs_it():
    gate = Gate()
    with DynamicBatcher(gate, max_batch_size=1, max_queue_size=2, queue_timeout=0.05) as batcher:
        first = batcher.submit(0)
        assert gate.entered.wait(30)       # request 0 is in the only worker's batch
        waiting = [batcher.submit(1), batcher.submit(2)]
        with pytest.raises(QueueFullError):
            batcher.submit(3)              # two wait: the queue is full
        time.sleep(0.3)                    # well past 1's and 2's deadline
        late = batcher.submit(4)           # their deadline passed: they no longer hold a place, so 4 gets in
        gate.open()
        assert first.result(30) == "done 0" and late.result(30) == "done 4"
        for future in waiting:
            with pytest.raises(QueueTimeoutError, match=r"queue_timeout=0\.05"):
                future.result(30)
    assert gate.seen == [0, 4]             # the expired requests never reached the batch function


def test_an_idle_worker_drops_a_request_at_its_deadline():
    # A window longer than the deadline: the worker wakes at the deadline and drops the request itself.
    calls = []
    with DynamicBatcher(lambda xs: calls.append(xs) or xs, max_batch_size=8, max_wait=30.0,
                        queue_timeout=0.05) as batcher:
        future = batcher.submit("alone")
        with pytest.raises(QueueTimeoutError):
            future.result(10)
    assert calls == []


def test_bad_queue_timeout_is_named():
    with pytest.raises(ValueError, match="queue_timeout"):
        DynamicBatcher(lambda xs: xs, queue_timeout=-1.0)


def test_graph_server_refuses_at_the_full_stage_and_the_load_test_counts_it_as_refused():
    gate = Gate()
    stages = {"pre": (Stage(fn=lambda xs: [x.upper() for x in xs], max_batch_size=4), ["text"]),
              "model": (Stage(fn=gate, max_batch_size=1, max_queue_size=1), ["pre"])}
    server = GraphServer(stages, inputs=("text",))
    try:
        first = server.submit({"text": "a"})
        assert gate.entered.wait(30)
        second = server.submit({"text": "b"})
        deadline = time.monotonic() + 30
        while server.batchers["model"].queued() < 1 and time.monotonic() < deadline:
            time.sleep(0.005)              # "b" passes "pre" and waits at "model"
        third = server.submit({"text": "c"})
        with pytest.raises(QueueFullError) as refused:
            third.result(30)
        assert refused.value.stage == "model" and is_refusal(refused.value)
        gate.open()
        assert first.result(30)["model"] == "done A" and second.result(30)["model"] == "done B"
        # One client at a time never finds the queue full.
        report = run_closed_loop(server, n_clients=1, n_requests=3, make_item=lambda i: {"text": str(i)})
        assert report.failed == 0 and report.refused == 0 and len(report.latencies) == 3
        gate.opened.clear()
        gate.entered.clear()
        # A burst into a closed gate: one in the batch, one waiting, the rest refused -- counted as refused.
        opener = threading.Timer(0.5, gate.open)
        opener.start()
        report = run_open_loop(server, [0.0] * 8, make_item=lambda i: {"text": f"burst {i}"})
        opener.join()
        assert report.failed == 0 and report.refused >= 1
        assert report.refused + len(report.latencies) == 8
    finally:
        gate.open()
        server.close()


def test_a_refusal_is_found_through_the_errors_it_caused():
    assert issubclass(QueueFullError, RequestRefusedError) and issubclass(QueueTimeoutError, RequestRefusedError)
    try:
        try:
            raise QueueFullError("full", stage="s")
        except QueueFullError as inner:
            raise RuntimeError("the stage failed") from inner
    except RuntimeError as outer:
        assert is_refusal(outer)
    assert not is_refusal(RuntimeError("a model bug")) and not is_refusal(None)


def test_triton_refuses_a_full_queue_as_triton_reports_it(tmp_path):
    from infergraph_lite.frameworks.triton import TritonServer, to_model_repository, triton_available

    if triton_available() is not None:
        pytest.skip(f"no Triton here: {triton_available()}")
    from tritonclient.utils import InferenceServerException

    repo = to_model_repository(slow_stages(1), tmp_path, factory="tests.overload_models:slow_stages",
                               example={"text": "hi"})
    assert "default_queue_policy { max_queue_size: 1 }" in (tmp_path / "slow" / "config.pbtxt").read_text()
    with TritonServer(repo) as server, server.client() as client:
        futures = [client.submit({"text": f"x{i}"}) for i in range(6)]  # 0.25 s each: a burst fills the queue
        errors = []
        for future in futures:
            try:
                assert future.result(timeout=60) == {"slow": 2}
            except QueueFullError as error:
                errors.append(error)
        assert 1 <= len(errors) <= 5
        for error in errors:  # Triton's words and status, its exception kept as the cause
            assert "Exceeds maximum queue size" in str(error) and "UNAVAILABLE" in str(error)
            assert isinstance(error.__cause__, InferenceServerException)
        report = run_open_loop(client, [0.0] * 6, make_item=lambda i: {"text": f"y{i}"})
        assert report.failed == 0 and report.refused >= 1 and report.refused + len(report.latencies) == 6


@pytest.mark.ray
def test_ray_serve_refuses_past_max_queued_requests_with_back_pressure(tmp_path):
    # The replica holds every request until the test opens the gate (a file), so none is answered while a
    # burst arrives: one replica takes at most max_ongoing_requests, its caller queues one more, and the rest
    # of a burst larger than both is refused, however fast the machine.
    from ray.serve.exceptions import BackPressureError

    from infergraph_lite.frameworks.ray.serve import RayServeGraph
    from tests.overload_models import gated_stages

    gate = tmp_path / "open"
    with RayServeGraph(gated_stages(str(gate)), inputs=("text",)) as served:
        options = served.served["slow"].options
        assert options["max_queued_requests"] == 1
        burst = options["max_ongoing_requests"] + options["max_queued_requests"] + 3
        futures = [served.submit({"text": f"x{i}"}) for i in range(burst)]
        deadline = time.monotonic() + 60  # the refusals come back while the gate is still shut
        while sum(f.done() for f in futures) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(f.done() and f.exception() is None for f in futures), "answered through a shut gate"
        gate.touch()
        errors = []
        for i, future in enumerate(futures):
            try:  # whichever requests were taken are answered, each with its own text's length
                assert future.result(timeout=120)["slow"] == len(f"x{i}")
            except QueueFullError as error:
                errors.append(error)
        assert len(errors) >= 3, f"a burst of {burst} into a held replica with max_queued_requests=1: {errors}"
        for error in errors:  # Serve's BackPressureError, named by the stage whose queue was full
            assert error.stage == "slow" and isinstance(error.__cause__, BackPressureError)
        gate.unlink()  # shut again: the load generator's burst, counted by it as refused
        sent: list = []

        class Recorded:  # the server, with every future the load generator gets kept to watch
            def submit(self, item):
                sent.append(served.submit(item))
                return sent[-1]

        def open_after_three_refusals() -> None:
            deadline = time.monotonic() + 60
            while sum(f.done() for f in list(sent)) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            gate.touch()

        opener = threading.Thread(target=open_after_three_refusals)
        opener.start()
        report = run_open_loop(Recorded(), [0.0] * burst, make_item=lambda i: {"text": f"y{i}"})
        opener.join()
        assert report.failed == 0 and report.refused >= 3 and report.refused + len(report.latencies) == burst
