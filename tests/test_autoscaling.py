"""AutoscalingConfig (Ray Serve's settings, once) and the batch loop's hook that the simulated autoscaler drives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.policy import BatchPolicy
from infergraph_lite.core.stage import Exponential, Stage
from infergraph_lite.simulation.autoscale import simulate_autoscaling, simulate_graph_autoscaling, step_arrivals
from infergraph_lite.simulation.queue import batch_by_batch, serve_queue


@pytest.mark.filterwarnings("ignore:The `metrics_interval_s` field:DeprecationWarning")
def test_fields_and_defaults_are_rays():
    config = pytest.importorskip("ray.serve.config")
    ours = AutoscalingConfig()
    theirs = config.AutoscalingConfig()
    for field in dataclasses.fields(ours):
        assert field.name in type(theirs).model_fields, field.name
        if field.name not in ("upscaling_factor", "downscaling_factor"):
            assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
    chosen = AutoscalingConfig(min_replicas=0, max_replicas=5, initial_replicas=2, target_ongoing_requests=3,
                               upscale_delay_s=1, downscale_delay_s=20, look_back_period_s=5, metrics_interval_s=1,
                               upscaling_factor=0.5)
    parsed = config.AutoscalingConfig(**chosen.to_ray_config())   # Ray accepts the dict as it is
    assert "metrics_interval_s" not in AutoscalingConfig(max_replicas=2).to_ray_config()  # Ray's default: left out
    assert {k: getattr(parsed, k) for k in chosen.to_ray_config()} == chosen.to_ray_config()


@pytest.mark.parametrize(("fields", "named"), [
    ({"min_replicas": -1}, "min_replicas"), ({"max_replicas": 0}, "max_replicas"),
    ({"max_replicas": True}, "max_replicas"), ({"target_ongoing_requests": 0}, "target_ongoing_requests"),
    ({"upscale_delay_s": -1.0}, "upscale_delay_s"), ({"look_back_period_s": float("inf")}, "look_back_period_s"),
    ({"max_replicas": 4, "initial_replicas": 5}, "initial_replicas"), ({"downscaling_factor": 0}, "downscaling_factor"),
])
def test_bad_settings_are_refused_by_name(fields, named):
    with pytest.raises(ValueError, match=named):
        AutoscalingConfig(**fields)


def test_the_simulator_does_not_scale_to_zero():
    with pytest.raises(ValueError, match="min_replicas"):
        simulate_autoscaling(Stage(service_time=1.0), [0.0, 1.0], AutoscalingConfig(min_replicas=0, max_replicas=2))


def test_a_hook_that_adds_a_server_at_once_equals_two_replicas():
    times = np.sort(np.random.default_rng(4).uniform(0, 1_000, 3_000))
    added = []

    def add_one(start, next_request, state):
        if added:
            return False
        added.append(next_request)
        state.free_at.append(0.0)   # a second server, free from the start (a valid heap: both are 0)
        return True

    hooked = batch_by_batch(times, lambda b: 1.0 + 0.2 * b, BatchPolicy(4, 0.5), on_batch_start=add_one)
    two = serve_queue(times, lambda b: 1.0 + 0.2 * b, BatchPolicy(4, 0.5), replicas=2)
    assert added == [0]
    for ours, theirs in zip(hooked, two):
        np.testing.assert_array_equal(ours, theirs)


def test_reports_every_metrics_interval_are_all_the_controller_sees():
    arrivals = step_arrivals([0.3, 3.0], [2_000.0, 4_000.0], seed=5)
    options = {"target_ongoing_requests": 1, "max_replicas": 8, "upscale_delay_s": 0.2, "look_back_period_s": 0.5}
    fresh = simulate_autoscaling(Stage(service_time=1.0), arrivals, AutoscalingConfig(metrics_interval_s=0.1,
                                                                                       **options))
    stale = simulate_autoscaling(Stage(service_time=1.0), arrivals, AutoscalingConfig(metrics_interval_s=100.0,
                                                                                       **options))
    assert fresh.replicas.max() >= 4
    assert set(stale.replicas.tolist()) == {1}   # one report, at the first control step, under light load


STEP_OPTIONS = {"target_ongoing_requests": 1, "max_replicas": 200, "upscale_delay_s": 0.2, "look_back_period_s": 0.5,
                "metrics_interval_s": 0.1, "downscale_delay_s": 30.0}


def test_replicas_run_startup_s_after_they_are_ordered_and_the_wait_makes_the_fleet_overshoot():
    arrivals = step_arrivals([0.3, 2.0], [3_000.0, 12_000.0], seed=2)
    stage = Stage(service_time=Exponential(1.0))
    quick = simulate_autoscaling(stage, arrivals, AutoscalingConfig(**STEP_OPTIONS), startup_s=0.0)
    slow = simulate_autoscaling(stage, arrivals, AutoscalingConfig(**STEP_OPTIONS), startup_s=3.0)
    np.testing.assert_array_equal(quick.running, quick.replicas)   # no start-up: every ordered replica runs
    first_up = int(np.argmax(slow.replicas > slow.replicas[0]))
    t_order = slow.control_times[first_up]
    waiting = (slow.control_times >= t_order) & (slow.control_times < t_order + 3_000.0 - 1e-6)
    assert np.all(slow.running[waiting] == slow.replicas[0]), "an ordered replica serves only startup_s later"
    assert slow.running[slow.control_times >= t_order + 3_000.0][0] > slow.replicas[0]
    # The load needs about 2 / ms x 1 ms / target 1 = 2 replicas (a few more for queueing).  Even with instant
    # start-up the backlog of the upscale delay, averaged over the look-back, buys far more; while replicas
    # take 3 s to start the queue keeps growing and the controller keeps ordering, to more than twice as many.
    assert quick.replicas.max() > 10
    assert slow.replicas.max() > 2 * quick.replicas.max()
    assert slow.percentile(99) > 5 * quick.percentile(99)


def test_scaling_factors_act_on_the_running_replicas_not_the_ordered_ones():
    # upscaling_factor 0.5 moves half-way from the *running* count to the wanted one.  Nothing ordered starts
    # within the run, so every order is half-way from 1, never compounding on replicas still starting.
    arrivals = step_arrivals([0.2, 6.0], [2_000.0, 6_000.0], seed=3)
    config = AutoscalingConfig(**{**STEP_OPTIONS, "max_replicas": 10_000, "upscaling_factor": 0.5})
    run = simulate_autoscaling(Stage(service_time=Exponential(1.0)), arrivals, config, startup_s=100.0)
    assert set(run.running.tolist()) == {1}, "nothing starts within the run"
    changed = np.flatnonzero(np.diff(run.replicas) > 0) + 1
    assert len(changed) >= 2
    for k in changed:
        assert run.replicas[k] == config.desired(run.mean_ongoing[k], current=1)
    k = changed[1]  # the second order, made while the first was still starting
    assert run.replicas[k] < config.desired(run.mean_ongoing[k], current=int(run.replicas[k - 1])), \
        "from the ordered count it would have asked for more"


def test_a_downscale_stops_replicas_still_starting_first():
    # A burst orders replicas that take 20 s to start; the load stops before they run, the downscale cancels
    # them, and no batch ever ran on them.
    arrivals = np.concatenate([np.sort(np.random.default_rng(1).uniform(0, 500, 2_000)), [9_000.0, 9_001.0]])
    config = AutoscalingConfig(**{**STEP_OPTIONS, "downscale_delay_s": 0.3})
    run = simulate_autoscaling(Stage(service_time=1.0), arrivals, config, startup_s=20.0)
    assert run.replicas.max() > 1 and run.replicas[-1] == 1
    assert run.running.max() == 1, "the ordered replicas were stopped before they started"


def test_a_one_stage_graph_is_simulate_autoscaling_and_each_stage_scales_on_its_own_load():
    arrivals = step_arrivals([0.3, 1.5], [2_000.0, 4_000.0], seed=4)
    config = AutoscalingConfig(**STEP_OPTIONS)
    model = Stage(service_time=Exponential(2.0))
    alone = simulate_autoscaling(model, arrivals, config, seed=7, startup_s=1.0)
    graph = simulate_graph_autoscaling({"model": (model, ["request"])}, arrivals, {"model": config}, seed=7,
                                       startup_s=1.0)
    np.testing.assert_array_equal(graph.finish, alone.finish)
    np.testing.assert_array_equal(graph.stages["model"].replicas, alone.replicas)
    chain = {"pre": (Stage(service_time=0.2), ["request"]), "model": (model, ["pre"])}
    run = simulate_graph_autoscaling(chain, arrivals, {"model": config}, startup_s={"pre": 0.0, "model": 1.0})
    np.testing.assert_array_equal(run.stages["model"].arrival, run.stages["pre"].finish)
    assert run.stages["pre"].control_times.size == 0 and run.stages["model"].replicas.max() >= 3
    assert np.all(run.finish >= run.stages["model"].finish) and run.replica_time > run.stages["model"].replica_time
    with pytest.raises(ValueError, match="unknown"):
        simulate_graph_autoscaling(chain, arrivals, {"model": config}, startup_s={"model": 1.0, "gpu": 2.0})
    with pytest.raises(ValueError, match="does not have"):
        simulate_graph_autoscaling(chain, arrivals, {"topic": config})
