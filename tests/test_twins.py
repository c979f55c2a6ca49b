"""lessons.twins: a twin calibrated on lone requests predicts them exactly; the recorded twin and its errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from infergraph_lite.core.stage import Stage
from infergraph_lite.lessons.twins import HopCalibration, calibrate_hops, recorded_twin, service_table
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
        assert hops.work[name] == 0.003  # the twin's work
        assert hops.trip[name] == pytest.approx(hops.round_trip[name] - 0.003)
        assert hops.hop_delay[name] == pytest.approx(hops.trip[name] + hops.outside)
    # "exactly": to a nanosecond, the rounding of float sums (1e-12 failed once by 1.4e-12)
    predicted = simulate_graph(twin, None, arrivals=np.arange(10) * 1.0, warmup=0.0, hop_delay=hops.hop_delay)
    assert np.median(predicted.latencies) == pytest.approx(hops.lone_latency, abs=1e-9)
    assert hops.per_hop == pytest.approx((hops.lone_latency - 0.006) / 2, abs=1e-9)
    # The trip as occupancy instead of a delay: a lone request takes the same time
    occupied = simulate_graph(hops.occupying(twin), None, arrivals=np.arange(10) * 1.0, warmup=0.0,
                              hop_delay=hops.outside)
    assert np.median(occupied.latencies) == pytest.approx(hops.lone_latency, abs=1e-9)


def spin(items):
    """About 2 ms of pure-Python CPU work per item."""
    for _ in items:
        deadline = time.thread_time() + 0.002
        while time.thread_time() < deadline:
            pass
    return items


def test_calibrated_on_the_recorded_work_a_round_trip_never_looks_shorter_than_its_work():
    # A twin whose work is badly off (a profile taken on a busier machine): work_from="records" measures the hop
    # above the CPU seconds the server recorded for the same batches instead
    stages = {"a": (Stage(fn=spin), ["request"]), "b": (Stage(fn=spin), ["a"])}
    inflated = {name: (Stage(service_time=0.050), deps) for name, (_, deps) in stages.items()}
    with GraphServer(stages) as server:
        hops = calibrate_hops(server, inflated, lambda i: {"request": i}, n_requests=20, work_from="records")
        records = server.stage_records()
    for name in stages:
        assert 0.002 <= hops.work[name] < 0.004  # the CPU seconds the function used, where it ran
        assert hops.trip[name] >= 0.0            # each batch's wall time holds its CPU time, so the medians too
    worked = recorded_twin(records, inflated, measure="work")
    predicted = simulate_graph(worked, None, arrivals=np.arange(10) * 1.0, warmup=0.0, hop_delay=hops.hop_delay)
    if hops.clamped:  # a noisy moment (a lone median under the round trips' sum): held at zero, never negative
        assert min(hops.hop_delay.values()) >= 0.0 and hops.outside == 0.0
    else:             # otherwise the twin of the recorded work reproduces the lone median exactly
        assert np.median(predicted.latencies) == pytest.approx(hops.lone_latency, abs=1e-9)
    with GraphServer(stages) as server:
        naive = calibrate_hops(server, inflated, lambda i: {"request": i}, n_requests=5)
        with pytest.raises(ValueError, match="work_from must be"):
            calibrate_hops(server, inflated, lambda i: {"request": i}, n_requests=5, work_from="profile")
    assert naive.clamped and min(naive.trip.values()) < 0  # against the inflated twin the trips look negative


def test_occupying_adds_each_stage_trip_to_every_batch_of_any_service_time_shape():
    twin = {"a": (Stage(service_time=(1.0, 0.5)), ["request"]), "b": (Stage(service_time=2.0), ["a"])}
    hops = HopCalibration(0.0, 0.0, {}, 0.0, {}, trip={"a": 0.25, "b": -1.0})
    occupied = hops.occupying(twin)
    assert occupied["a"][0].service_time(2) == pytest.approx(2.25)
    assert occupied["b"][0].service_time(3) == pytest.approx(2.0)  # a negative trip (noise) adds nothing
    assert occupied["b"][1] == ["a"]


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
    with pytest.raises(ValueError, match="stage 'a' has records without a work"):
        recorded_twin({"a": rows, "b": [RequestRecord(0.0, 4.0, 3)]}, base, measure="work")
    with pytest.raises(ValueError, match="measure must be"):
        recorded_twin({"a": rows, "b": rows}, base, measure="latency")
    worked = recorded_twin({"a": [RequestRecord(0.0, 3.0, 2, 1.5)], "b": [RequestRecord(0.0, 4.0, 3, 2.0)]}, base,
                           measure="work")
    assert worked["a"][0].service_time(2) == 1.5 and worked["b"][0].service_time(3) == 2.0


def test_service_table_is_never_dearer_per_request_than_one_nor_cheaper_than_a_smaller_batch():
    s = service_table([1, 2, 4], [1.0, 3.0, 2.0])
    assert [s(b) for b in (1, 2, 4)] == [1.0, 2.0, 2.0]
