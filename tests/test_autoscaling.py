"""AutoscalingConfig (Ray Serve's settings, once) and the batch loop's hook that the simulated autoscaler drives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.policy import BatchPolicy
from infergraph_lite.core.stage import Stage
from infergraph_lite.simulation.autoscale import simulate_autoscaling, step_arrivals
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
