"""The same graph on Dask: same answers as run_graph, graph errors before anything runs, loopback-only cluster."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import psutil
import pytest

pytest.importorskip("distributed")

from dask.task_spec import DataNode, Task

from infergraph_lite import (
    CycleError,
    InvalidNodeError,
    MissingDependencyError,
    MissingInputError,
    NodeError,
    run_graph,
)
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks.dask import DaskGraphCluster, run_dask, stage_item, to_dask_graph
from infergraph_lite.lessons.examples import (
    BANANA_INPUTS,
    banana_nodes,
    text_pipeline,
    text_pipeline_stages,
    trained_text_models,
)
from tests.proc_sockets import descendants, listening, not_loopback

TEXTS = ["The pasta was delicious and the staff were lovely.", "Terrible battery, the phone died after an hour.", ""]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a
    )


def test_the_dict_becomes_a_task_graph():
    graph = to_dask_graph(banana_nodes(), BANANA_INPUTS)
    assert isinstance(graph["text"], DataNode) and isinstance(graph["combine"], Task)
    assert graph["combine"].dependencies == {"modelA", "modelB"}
    keyed = to_dask_graph(banana_nodes(), BANANA_INPUTS, request=7)
    assert set(keyed) == {(name, 7) for name in graph}, "one request's keys carry its number"


def test_run_dask_equals_run_graph():
    assert _same(run_dask(banana_nodes(), BANANA_INPUTS), run_graph(banana_nodes(), BANANA_INPUTS))
    nodes, stages = text_pipeline(*trained_text_models()), text_pipeline_stages()
    for text in TEXTS:
        assert _same(run_dask(stages, {"text": text}), run_graph(nodes, {"text": text}))


def test_an_input_value_that_looks_like_a_key_is_data():
    # In Dask's older tuple graphs, {"text": "pre"} would be an alias of the key "pre" (here, a cycle).
    assert run_dask(banana_nodes(), {"text": "pre"})["combine"] == {"len": 3, "a_count": 0}


def test_stage_item_packs_several_dependencies_into_one_tuple():
    assert stage_item(lambda items: [repr(i) for i in items], 1, "b") == "(1, 'b')"


@pytest.mark.parametrize(
    ("nodes", "error"),
    [
        ({"a": (len, ["b"]), "b": (len, ["a"])}, CycleError),
        ({"a": (len, ["nowhere"])}, MissingDependencyError),
        ({"a": (Stage(service_time=1.0), ["text"])}, InvalidNodeError),
        ({"a": ("not callable", ["text"])}, InvalidNodeError),
    ],
)
def test_bad_graph_fails_before_anything_runs(nodes, error):
    calls = []
    nodes = {**nodes, "spy": (lambda t: calls.append(t), ["text"])}
    with pytest.raises(error):
        run_dask(nodes, {"text": "x"})
    with pytest.raises(error):
        DaskGraphCluster(nodes, inputs=["text"])
    assert calls == []


def test_missing_input_fails_as_in_run_graph():
    with pytest.raises(MissingDependencyError) as caught:
        run_dask(banana_nodes(), {})
    assert (caught.value.node, caught.value.missing) == ("pre", ["text"])
    with pytest.raises(MissingInputError):
        DaskGraphCluster(banana_nodes(), inputs=["text"]).submit({})  # a running graph names the missing input


def test_local_cluster_answers_on_loopback_and_leaves_nothing():
    stages = text_pipeline_stages()
    # A default Stage (max_batch_size=1): Dask refuses a batching one by name (see test_stage_fields.py).
    stages["batch_seen"] = (Stage(fn=lambda items: [len(items)] * len(items)), ["embed"])
    nodes = text_pipeline(*trained_text_models())
    with DaskGraphCluster(stages, inputs=["text"], n_workers=2) as cluster:
        pids = cluster.started_pids()
        assert len(pids) >= 2, "processes=True: the workers run in processes of their own"
        futures = [cluster.submit({"text": TEXTS[i % 3]}) for i in range(24)]
        answers = [f.result(timeout=60) for f in futures]
        for i, answer in enumerate(answers):
            expected = run_graph(nodes, {"text": TEXTS[i % 3]})
            assert _same({k: v for k, v in answer.items() if k != "batch_seen"},
                         {k: v for k, v in expected.items() if k != "text"})
        assert {a["batch_seen"] for a in answers} == {1}, "a task scheduler never batches requests"

        entries = listening([os.getpid(), *descendants(os.getpid())])
        assert len(entries) >= 3, "the scheduler and each worker listen (on TCP, since processes=True)"
        assert not_loopback(entries) == [], "a process we started listens beyond 127.0.0.1"
    assert cluster.close() == []
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == []


def test_a_batching_stage_is_refused_by_name_before_anything_runs():
    stages = {"topic": (Stage(fn=lambda items: items, max_batch_size=16), ["text"])}
    for start in (lambda: run_dask(stages, {"text": "x"}), lambda: DaskGraphCluster(stages, inputs=["text"])):
        with pytest.raises(UnsupportedStageFieldError) as refused:
            start()
        assert (refused.value.engine, refused.value.stage, refused.value.field) == ("Dask", "topic", "max_batch_size")


# --- failures resolve every request; close is bounded; each cluster stops only its own processes -------------


def _faulty_stages() -> dict:
    """pre -> fault -> post: fault raises, exits or kills its worker process on the words that ask for it."""

    def fault(items: list) -> list:
        for item in items:
            if item == "raise":
                raise ValueError("cannot take 'raise'")
            if item == "exit":
                raise SystemExit("asked to exit")
            if item == "crash":
                os._exit(3)  # the worker process dies mid-task
            if item.startswith("sleep"):
                import time

                time.sleep(float(item.removeprefix("sleep")))
        return [len(item) for item in items]

    return {"pre": (Stage(fn=lambda xs: [x.strip() for x in xs]), ["text"]),
            "fault": (Stage(fn=fault), ["pre"]),
            "post": (Stage(fn=lambda xs: [x + 1 for x in xs]), ["fault"])}


def _alive(pids) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_failing_stage_is_named_whatever_it_raises_and_a_crash_too():
    with DaskGraphCluster(_faulty_stages(), inputs=["text"], n_workers=1, allowed_failures=0) as cluster:
        assert cluster.submit({"text": " ok "}).result(timeout=60) == {"pre": "ok", "fault": 2, "post": 3}
        for text, cause in (("raise", ValueError), ("exit", RuntimeError)):
            with pytest.raises(NodeError) as caught:
                cluster.submit({"text": text}).result(timeout=60)
            assert caught.value.node == "fault" and isinstance(caught.value.__cause__, cause), caught.value
        assert "SystemExit" in str(caught.value), "a SystemExit is reported as what it was"
        first = cluster.started_pids()
        with pytest.raises(NodeError) as caught:
            cluster.submit({"text": "crash"}).result(timeout=90)
        assert caught.value.node == "fault" and type(caught.value.__cause__).__name__ == "KilledWorker"
        assert re.search(r"\(Worker process \d+ exited with status 3\)$", str(caught.value)), "which process, how"
        # The nanny restarts the worker; the cluster answers again, and the new worker is counted as ours.
        assert cluster.submit({"text": "again"}).result(timeout=90)["post"] == 6
        assert set(cluster.started_pids()) - set(first), "the restarted worker is a new process of this cluster"
    assert cluster.close() == []
    assert _alive(first) == []


def test_a_request_past_its_timeout_fails_naming_the_node_still_running():
    with DaskGraphCluster(_faulty_stages(), inputs=["text"], n_workers=1, request_timeout=0.5) as cluster:
        began = time.monotonic()
        with pytest.raises(NodeError, match=r"node 'fault' failed: TimeoutError: .*request_timeout=0\.5 s"):
            cluster.submit({"text": "sleep3"}).result(timeout=60)
        assert time.monotonic() - began < 5, "failed at its deadline, not when the task ended"


def test_a_worker_that_dies_while_the_cluster_starts_is_named_and_nothing_is_left(tmp_path):
    import dask

    crash = tmp_path / "crash_preload.py"  # a worker preload: runs in each worker process as it starts
    crash.write_text("import os, sys\nprint('fatal: no GPU', file=sys.stderr, flush=True)\nos._exit(3)\n")
    before = set(descendants(os.getpid()))
    cluster = DaskGraphCluster(banana_nodes(), inputs=["text"], n_workers=1)
    began = time.monotonic()
    with dask.config.set({"distributed.worker.preload": [str(crash)]}), \
            pytest.raises(RuntimeError, match=r"cluster did not start: .*\(Worker process \d+ exited with status 3\)"):
        cluster.start()
    assert time.monotonic() - began < 20, "noticed at the death, not at a timeout"
    assert cluster.client is None and _alive(set(descendants(os.getpid())) - before) == []


def test_close_ends_a_request_in_flight_and_returns_within_its_timeout():
    cluster = DaskGraphCluster(_faulty_stages(), inputs=["text"], n_workers=1, max_requests=1).start()
    pids = cluster.started_pids()
    slow = cluster.submit({"text": "sleep60"})  # runs on the worker for a minute
    queued = cluster.submit({"text": "ok"})  # waits for a request thread
    time.sleep(1.0)
    started = time.monotonic()
    cluster.close(timeout=20)
    # A bound the code promises, not a speed: the old close waited for the request pool before closing the
    # client the pool's thread was blocked on, i.e. the whole minute.
    assert time.monotonic() - started < 20 + 5
    for future in (slow, queued):
        assert future.done(), "close left a request unresolved"
        assert future.cancelled() or future.exception(timeout=0) is not None
    assert _alive(pids) == []


def test_two_clusters_at_once_closing_one_leaves_the_other_answering():
    nodes = banana_nodes()
    with DaskGraphCluster(nodes, inputs=["text"], n_workers=1) as first, \
            DaskGraphCluster(nodes, inputs=["text"], n_workers=1) as second:
        mine, theirs = first.started_pids(), second.started_pids()
        assert mine and theirs and not set(mine) & set(theirs), "each cluster counts only its own workers"
        assert first.close() == []
        assert _alive(mine) == [] and _alive(theirs) == theirs, "closing one stopped the other's workers"
        assert second.submit(BANANA_INPUTS).result(timeout=60)["combine"] == {"len": 6, "a_count": 3}
    assert _alive(theirs) == []
