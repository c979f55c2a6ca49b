"""The same graph on Dask: same answers as run_graph, graph errors before anything runs, loopback-only cluster."""

from __future__ import annotations

import os

import numpy as np
import psutil
import pytest

pytest.importorskip("distributed")

from dask.task_spec import DataNode, Task

from infergraph_lite import CycleError, InvalidNodeError, MissingDependencyError, MissingInputError, run_graph
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks.dask_graph import DaskGraphCluster, run_dask, stage_item, to_dask_graph
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
