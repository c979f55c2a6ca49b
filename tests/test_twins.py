"""lessons.twins: a twin calibrated on lone requests predicts them exactly; the recorded twin and its errors."""

from __future__ import annotations

import time

import numpy as np
import pytest

from infergraph_lite.core.stage import Exponential, Stage, service_time_fn
from infergraph_lite.lessons.twins import HopCalibration, at_work, calibrate_hops, recorded_twin, service_table
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
    # The trip and the turnaround as occupancy instead of a delay: a lone request takes the same time
    assert set(hops.turnaround) == {"a", "b"} and min(hops.turnaround.values()) >= 0.0
    occupied = simulate_graph(hops.occupying(twin), None, arrivals=np.arange(10) * 1.0, warmup=0.0,
                              hop_delay=hops.handoff)
    if hops.outside >= np.mean(list(hops.turnaround.values())):
        assert np.median(occupied.latencies) == pytest.approx(hops.lone_latency, abs=1e-9)
    else:  # a turnaround longer than the whole hand-off (noise): the delay is held at 0, never negative, and said
        assert hops.handoff == 0.0 and hops.clamped


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


def answer_slowly(done):
    time.sleep(0.005)  # a callback on the stage's worker thread: it holds the worker before its next batch


def test_turnaround_is_the_time_a_worker_spends_answering_after_the_batch():
    twin = {"a": (Stage(service_time=0.003), ["request"])}
    with GraphServer({"a": (Stage(fn=nap), ["request"])}) as server:
        original = server.batchers["a"].submit
        server.batchers["a"].submit = lambda item: _with_callback(original(item))
        hops = calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=10, spacing=0.03)
    assert hops.turnaround["a"] >= 0.005  # the slow callback ran before the worker was released
    assert hops.handoff == pytest.approx(max(hops.outside - hops.turnaround["a"], 0.0))


def _with_callback(future):
    future.add_done_callback(answer_slowly)
    return future


def test_spaced_calibration_sends_one_request_per_spacing_and_refuses_one_shorter_than_a_lone_request():
    stages = {"a": (Stage(fn=nap), ["request"])}
    twin = {"a": (Stage(service_time=0.003), ["request"])}
    with GraphServer(stages) as server:
        started = time.perf_counter()
        hops = calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=10, spacing=0.02)
        assert time.perf_counter() - started >= 9 * 0.02  # open loop: the last one sent 9 spacings after the first
        assert hops.lone_latency >= 0.003
        with pytest.raises(ValueError, match=r"spacing=0\.001 s is shorter than a lone request's median latency"):
            calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=5, spacing=0.001)
        for bad in (0, -0.01, float("nan")):
            with pytest.raises(ValueError, match="spacing"):
                calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=5, spacing=bad)


def test_a_spread_twin_draws_each_batch_from_the_records_of_its_size_and_is_seeded():
    rows = [RequestRecord(0.0, t, 1) for t in (0.003, 0.003, 0.012)] + [RequestRecord(0.0, 0.005, 2)] * 2
    base = {"a": (Stage(service_time=0.001, max_batch_size=4), ["request"])}
    draw = recorded_twin({"a": rows}, base, spread=True, seed=3)["a"][0].service_time
    ones = [draw(1) for _ in range(3000)]
    assert set(np.round(ones, 9)) == {0.003, 0.012}
    assert np.mean(ones) == pytest.approx(0.006, rel=0.05)  # the records' mean, above their median 0.003
    assert {round(draw(2), 9) for _ in range(50)} == {0.005}  # size 2 has one value: no spread to draw
    again = recorded_twin({"a": rows}, base, spread=True, seed=3)["a"][0].service_time
    assert [again(1) for _ in range(3000)] == ones  # the same seed, the same draws
    assert recorded_twin({"a": rows}, base)["a"][0].service_time(1) == 0.003  # without spread: the median


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


def test_at_work_rescales_every_batch_size_to_a_runs_work_per_request_and_names_a_bad_stage():
    twin = {"a": (Stage(service_time=(0.001, 0.001)), ["request"]), "join": (Stage(service_time=0.0), ["a"])}
    scaled = at_work(twin, {"a": 0.004, "join": 0.0})
    s = service_time_fn(scaled["a"][0].service_time)
    assert s(1) == pytest.approx(0.004) and s(3) == pytest.approx(0.008)  # the profile's shape: 2 ms + 2 ms per item
    assert scaled["a"][1] == ["request"] and service_time_fn(scaled["join"][0].service_time, allow_zero=True)(5) == 0.0
    with pytest.raises(ValueError, match="no work per request given for stage 'join'"):
        at_work(twin, {"a": 0.004})
    with pytest.raises(ValueError, match="stage 'join' costs nothing"):
        at_work(twin, {"a": 0.004, "join": 0.001})
    with pytest.raises(ValueError, match=r"per_request\['a'\]"):
        at_work(twin, {"a": -1.0, "join": 0.0})
    with pytest.raises(ValueError, match="per_request names 'b', which is not a stage"):
        at_work(twin, {"a": 0.004, "join": 0.0, "b": 1.0})
    drawn = at_work({"e": (Stage(service_time=Exponential(0.002)), ["request"])}, {"e": 0.006})["e"][0]
    assert drawn.service_time == Exponential(0.006)  # still an Exponential: the simulator's seed draws it


def test_validate_graph_server_gives_a_row_per_load_and_its_replay_of_a_sleeping_graph_is_close():
    from infergraph_lite.lessons.twins import validate_graph_server

    stages = {"a": (Stage(fn=nap, max_batch_size=4), ["request"]), "b": (Stage(fn=nap), ["a"])}
    twin = {name: (Stage(service_time=0.003, max_batch_size=stage.max_batch_size), deps)
            for name, (stage, deps) in stages.items()}
    with GraphServer(stages) as server:
        hops = calibrate_hops(server, twin, lambda i: {"request": i}, n_requests=20)
        rows = validate_graph_server(server, twin, lambda i: {"request": i}, hops, rates={0.2: 30.0, 0.4: 60.0},
                                     n_requests=40)
    assert [row.load for row in rows] == [0.2, 0.4]
    for row in rows:
        assert row.measured[0] >= 0.006 and row.measured[1] >= row.measured[0]  # two naps at least; p99 >= mean
        # a sleep costs the same under load: the replay of the run's own batch times is close
        assert abs(row.error("replay")[0]) < 0.5


def test_validate_graph_server_refuses_a_bad_rate_before_sending_anything():
    from infergraph_lite.lessons.twins import validate_graph_server

    with GraphServer({"a": (Stage(fn=nap), ["request"])}) as server:
        with pytest.raises(ValueError, match=r"rates\[0.5\] must be > 0"):
            validate_graph_server(server, {}, lambda i: {"request": i}, None, rates={0.3: 10.0, 0.5: -1.0})
        assert server.records == []
