"""serving/batcher.py: the real batcher keeps every promise under load, failure and shutdown."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

from infergraph_lite import AIMD
from infergraph_lite.serving.batcher import BatchError, DynamicBatcher, QueueFullError
from infergraph_lite.serving.loadtest import profile_service_time


def doubler(xs):
    return [2 * x for x in xs]


def test_every_request_answered_exactly_once_under_concurrent_submitters():
    calls = []

    def record(xs):
        calls.append(list(xs))
        return [x * 10 for x in xs]

    with DynamicBatcher(record, max_batch_size=8, max_wait=0.002) as batcher:
        futures: dict[int, Future] = {}
        lock = threading.Lock()

        def client(offset):
            for i in range(offset, offset + 250):
                f = batcher.submit(i)
                with lock:
                    futures[i] = f

        threads = [threading.Thread(target=client, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {i: f.result() for i, f in futures.items()} == {i: i * 10 for i in futures}
    served = [x for batch in calls for x in batch]
    assert sorted(served) == sorted(futures) and len(served) == len(set(served)) == 1000
    assert max(len(b) for b in calls) <= 8 and len(batcher.records) == 1000


def test_batches_fill_to_the_cap_when_requests_are_waiting():
    gate = threading.Event()
    sizes = []

    def slow(xs):
        gate.wait(5)
        sizes.append(len(xs))
        return xs

    with DynamicBatcher(slow, max_batch_size=4, max_wait=10.0) as batcher:
        futures = [batcher.submit(i) for i in range(9)]  # first batch of 4 starts at once: the queue is full
        time.sleep(0.05)
        gate.set()
        [f.result(timeout=5) for f in futures[:8]]
    assert sizes[:2] == [4, 4] and sum(sizes) == 9  # the last one is drained by close()


def test_a_lone_request_waits_for_the_window_then_runs_alone():
    with DynamicBatcher(doubler, max_batch_size=16, max_wait=0.05) as batcher:
        started = time.perf_counter()
        assert batcher.submit(21).result(timeout=5) == 42
        assert time.perf_counter() - started >= 0.045
    record = batcher.records[0]
    assert record.batch_size == 1 and record.queue_time >= 0.045 and record.latency >= record.queue_time


def test_failing_batch_fails_its_futures_and_the_batcher_keeps_serving():
    def flaky(xs):
        if "bad" in xs:
            raise ValueError("cannot parse 'bad'")
        return [x.upper() for x in xs]

    held, release = threading.Event(), threading.Event()

    def held_or_flaky(xs):
        if "hold" in xs:            # the worker waits here while the pair queues, so the pair is one batch
            held.set()
            release.wait(5)
        return flaky(xs)

    with DynamicBatcher(held_or_flaky, max_batch_size=2, max_wait=0.0) as batcher:
        hold = batcher.submit("hold")
        assert held.wait(5)
        bad_pair = [batcher.submit("bad"), batcher.submit("x")]
        release.set()
        assert hold.result(timeout=5) == "HOLD"
        for f in bad_pair:
            with pytest.raises(BatchError, match=r"failed: ValueError: cannot parse 'bad'") as info:
                f.result(timeout=5)
            assert isinstance(info.value.__cause__, ValueError)
        assert batcher.submit("still here").result(timeout=5) == "STILL HERE"


def test_wrong_number_of_results_fails_the_batch_clearly():
    with (
        DynamicBatcher(lambda xs: xs[:-1], max_batch_size=3, max_wait=0.0) as batcher,
        pytest.raises(BatchError, match=r"batch_fn returned 0 results for a batch of 1"),
    ):
        batcher.submit(1).result(timeout=5)


def test_close_drains_everything_queued_and_then_refuses():
    batcher = DynamicBatcher(doubler, max_batch_size=2, max_wait=60.0)  # the window alone would never fire
    futures = [batcher.submit(i) for i in range(5)]
    batcher.close()
    assert [f.result(timeout=0) for f in futures] == [0, 2, 4, 6, 8]
    with pytest.raises(RuntimeError, match=r"submit\(\) after close\(\)"):
        batcher.submit(1)
    assert not any(t.name.startswith(batcher.name) and t.is_alive() for t in threading.enumerate())


def test_full_queue_refuses_new_requests_but_loses_none():
    gate, entered = threading.Event(), threading.Event()

    def blocked(xs):
        entered.set()
        return gate.wait(5) and xs

    with DynamicBatcher(blocked, max_batch_size=1, max_wait=0.0, max_queue_size=2) as b:
        first = b.submit(0)
        assert entered.wait(5)  # the worker has taken `first` and is blocked in batch_fn
        queued = [b.submit(1), b.submit(2)]
        with pytest.raises(QueueFullError, match=r"queue is full \(2 waiting"):
            b.submit(3)
        gate.set()
    assert [f.result(timeout=5) for f in [first, *queued]] == [0, 1, 2]


def test_cancelled_requests_are_skipped_not_run():
    seen = []
    gate = threading.Event()

    def fn(xs):
        gate.wait(5)
        seen.extend(xs)
        return xs

    with DynamicBatcher(fn, max_batch_size=1, max_wait=0.0) as batcher:
        running = batcher.submit("a")
        time.sleep(0.05)
        cancelled = batcher.submit("b")
        assert cancelled.cancel()
        gate.set()
        assert running.result(timeout=5) == "a"
    assert seen == ["a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_fn": 3}, "batch_fn must be callable"),
        ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1, None or an AIMD, got 0"),
        ({"max_wait": -1}, "max_wait must be >= 0, got -1"),
        ({"max_wait": float("inf")}, "max_wait must be a finite number, got inf"),
        ({"replicas": 0}, "replicas must be an integer >= 1, got 0"),
        ({"max_queue_size": 0}, "max_queue_size must be an integer >= 1 or None, got 0"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    args = {"batch_fn": doubler, "max_batch_size": 4, "max_wait": 0.01} | kwargs
    with pytest.raises(ValueError, match=message):
        DynamicBatcher(**args)


def test_profile_recovers_a_known_linear_cost():
    def fake_model(batch):
        time.sleep(0.002 + 0.001 * len(batch))

    profile = profile_service_time(fake_model, lambda b: [0] * b, [1, 4, 8], repeats=3)
    assert profile.beta == pytest.approx(0.001, rel=0.3)
    assert profile.alpha == pytest.approx(0.002, abs=0.0015)
    assert np.all(np.diff(profile.seconds) > 0)
    with pytest.raises(ValueError, match="at least two batch sizes"):
        profile_service_time(fake_model, lambda b: [0] * b, [4])


@pytest.mark.parametrize("raised", [ValueError("bad input"), KeyboardInterrupt(), SystemExit(3)],
                         ids=["Exception", "KeyboardInterrupt", "SystemExit"])
def test_a_batch_that_raises_anything_fails_its_own_requests_and_the_worker_goes_on(raised):
    def fn(xs):
        if "boom" in xs:
            raise raised
        return xs

    with DynamicBatcher(fn, max_batch_size=1) as batcher:
        bad = batcher.submit("boom")
        with pytest.raises(BatchError, match=type(raised).__name__) as info:
            bad.result(timeout=5)
        assert info.value.__cause__ is raised
        assert batcher.submit("fine").result(timeout=5) == "fine"  # the worker survived


def test_close_returns_within_its_timeout_and_fails_what_a_hung_batch_holds():
    entered, release = threading.Event(), threading.Event()

    def hangs(xs):
        entered.set()
        release.wait(10)
        return xs

    batcher = DynamicBatcher(hangs, max_batch_size=1)
    running = batcher.submit(1)
    assert entered.wait(5)
    queued = batcher.submit(2)
    started = time.monotonic()
    batcher.close(timeout=0.3)
    assert time.monotonic() - started < 2.0
    for future in (running, queued):
        with pytest.raises(BatchError, match=r"close\(\) gave up after 0.3 s"):
            future.result(timeout=0)
    release.set()  # the abandoned batch finishes later and must not try to answer twice
    batcher._workers[0].join(5)
    assert not batcher._workers[0].is_alive()


def test_close_refuses_a_bad_timeout():
    with DynamicBatcher(doubler) as batcher, pytest.raises(ValueError, match="timeout must be a finite number"):
        batcher.close(timeout="soon")


def test_an_all_cancelled_batch_is_not_counted_as_a_full_batch_by_aimd():
    entered, gate = threading.Event(), threading.Event()
    aimd = AIMD(latency_target=1.0, cap=2, max_size=8)

    def fn(xs):
        entered.set()
        gate.wait(2)
        return xs

    with DynamicBatcher(fn, max_batch_size=aimd, max_wait=0.0) as batcher:
        first = batcher.submit(0)
        assert entered.wait(5)  # the worker is held by the first batch
        doomed = [batcher.submit(i) for i in (1, 2)]
        assert all(f.cancel() for f in doomed)
        cap_before = batcher.max_batch_size
        gate.set()
        first.result(timeout=5)
    # the cancelled pair formed a full batch of 2 that ran nothing: it must not have grown the cap
    assert batcher.max_batch_size == cap_before


def test_each_batch_records_when_its_worker_was_free_again_after_answering_it():
    # released - end is the turnaround: the worker answering the batch's requests (their callbacks run on it)
    def slow_answer(_future):
        time.sleep(0.02)

    with DynamicBatcher(lambda xs: (time.sleep(0.05), xs)[1], max_batch_size=4, max_wait=0.0) as batcher:
        first = batcher.submit(1)
        first.add_done_callback(slow_answer)  # registered while the 50 ms batch still runs
        first.result()
        batcher.submit(2).result()
        deadline = time.monotonic() + 5
        while any(np.isnan(b.released) for b in batcher.batches) and time.monotonic() < deadline:
            time.sleep(0.001)  # the last batch's released is set just after its answer
    slow, quick = batcher.batches
    assert slow.released - slow.end >= 0.02
    assert 0 <= quick.released - quick.end < 0.02
