"""lessons.twins: a twin calibrated on lone requests predicts them exactly; the recorded twin and its errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from infergraph_lite.core.stage import Stage
from infergraph_lite.lessons.twins import calibrate_hops, recorded_twin, service_table
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.metrics import RequestRecord
from infergraph_lite.simulation.graph import simulate_graph


def nap(items):
    time.sleep(0.003 * len(items))
    return items


def test_the_calibrated_twin_predicts_the_lone_median_exactly_and_hops_are_what_the_work_leaves_out():
    stages = {"a": (Stage(fn=nap, max_batch_size=4), ["request"]), "b": (Stage(fn=nap), ["a"])}
    twin = {name: (Stage(service_time=0.003, max_batch_size=stage.max_batch_size), deps)
            for name, (stage, deps) in stages.items()}
    with GraphServer(stages) as server:
        hops = calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=30)
        assert sum(len(rows) for rows in server.stage_records().values()) == 60  # only what it sent
    assert hops.twin_latency == pytest.approx(0.006)
    assert hops.lone_latency > hops.twin_latency  # a sleep never wakes early, and a hop costs something
    for name in stages:
        assert hops.round_trip[name] >= 0.003  # the batcher's view of the batch includes the nap
        assert hops.hop_delay[name] == pytest.approx(hops.round_trip[name] - 0.003 + hops.outside)
    predicted = simulate_graph(twin, None, arrivals=np.arange(10) * 1.0, warmup=0.0, hop_delay=hops.hop_delay)
    assert np.median(predicted.latencies) == pytest.approx(hops.lone_latency, abs=1e-12)
    assert hops.per_hop == pytest.approx((hops.lone_latency - 0.006) / 2, abs=1e-12)


def test_calibrate_hops_refuses_a_bad_count():
    with GraphServer({"a": (Stage(fn=nap), ["request"])}) as server, pytest.raises(ValueError, match="n_requests"):
        calibrate_hops(server, {"a": (Stage(service_time=0.003), ["request"])}, lambda i: {"request": i}, 0)


def test_recorded_twin_uses_each_size_median_and_names_a_silent_stage():
    base = {"a": (Stage(service_time=1.0, max_batch_size=4), ["request"]), "b": (Stage(service_time=1.0), ["a"])}
    rows = [RequestRecord(0.0, t, b) for t, b in [(2.0, 1), (2.2, 1), (9.0, 1), (3.0, 2), (3.0, 2)]]
    twin = recorded_twin({"a": rows, "b": [RequestRecord(0.0, 4.0, 3)]}, base)
    assert [twin["a"][0].service_time(b) for b in (1, 2)] == [2.2, 3.0]
    assert twin["a"][0].max_batch_size == 4 and twin["a"][1] == ["request"]
    assert [twin["b"][0].service_time(b) for b in (1, 3, 4)] == pytest.approx([4 / 3, 4.0, 4.0])
    with pytest.raises(ValueError, match="stage 'b' recorded no requests"):
        recorded_twin({"a": rows, "b": []}, base)


def test_service_table_is_never_dearer_per_request_than_one_nor_cheaper_than_a_smaller_batch():
    s = service_table([1, 2, 4], [1.0, 3.0, 2.0])
    assert [s(b) for b in (1, 2, 4)] == [1.0, 2.0, 2.0]
