"""planning.py (the greedy SLO planner against brute force, the uniform baseline, cost arithmetic) and
autoscale.py (Ray Serve's rule, a fleet that changes size under a load step)."""

from __future__ import annotations

import numpy as np
import pytest

from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.stage import Exponential, Stage
from infergraph_lite.simulation.autoscale import simulate_autoscaling, step_arrivals
from infergraph_lite.simulation.graph import simulate_graph
from infergraph_lite.simulation.planning import (
    PlanningProblem,
    brute_force_plan,
    cost_per_hour,
    cost_per_million,
    plan_capacity,
    tunable_stages,
    uniform_plan,
)
from infergraph_lite.simulation.queue import simulate_batching

PRICE = {"pre": 0.1, "topic": 2.5, "sentiment": 2.5, "merge": 0.1}
SMALL = {
    "pre": (Stage(service_time=0.3), ["request"]),
    "topic": (Stage(service_time=(5.0, 0.5)), ["pre"]),
    "sentiment": (Stage(service_time=(3.0, 0.3)), ["pre"]),
    "merge": (Stage(service_time=0), ["topic", "sentiment"]),
}
OPTIONS = {"price_per_replica_hour": PRICE, "n_requests": 8_000, "batch_sizes": (1, 2, 4, 8, 16, 32),
           "max_waits": (0.0,)}


# --- cost -----------------------------------------------------------------------------------------------


def test_cost_is_replicas_times_price_and_per_million_requests_scales_with_time():
    stages = {"a": (Stage(service_time=1.0, replicas=3), ["request"]), "b": (Stage(service_time=1.0), ["a"])}
    assert cost_per_hour(stages, 2.0) == 8.0
    assert cost_per_hour(stages, {"a": 1.0, "b": 5.0}) == 8.0
    # 1e6 requests at 1 per ms take 1000 s: 8 per hour * 1000 / 3600
    assert cost_per_million(stages, 1.0, 2.0) == pytest.approx(8 * 1000 / 3600)
    assert cost_per_million(stages, 2.0, 2.0) == pytest.approx(cost_per_million(stages, 1.0, 2.0) / 2)
    assert cost_per_million(stages, 1.0, 2.0, time_unit=1.0) == pytest.approx(8 * 1e6 / 3600)
    with pytest.raises(ValueError, match="no price for stage 'b'"):
        cost_per_hour(stages, {"a": 1.0})


def test_only_stages_with_a_batch_profile_are_tuned():
    assert tunable_stages(SMALL) == ["topic", "sentiment"]
    assert tunable_stages({"e": (Stage(service_time=Exponential(1.0)), ["request"]),
                           "f": (Stage(service_time=lambda b: 1 + b), ["e"])}) == ["f"]


# --- the planner ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "target"), [(2.0, 20.0), (3.0, 18.0)])
def test_greedy_plan_meets_the_target_at_the_brute_force_cost(rate, target):
    plan = plan_capacity(SMALL, rate, target, **OPTIONS)
    best = brute_force_plan(SMALL, rate, target, max_replicas=6, **OPTIONS)
    assert plan.feasible and best.feasible
    assert plan.p99 <= target and best.p99 <= target
    assert plan.cost_per_hour == pytest.approx(best.cost_per_hour)
    assert plan.evaluations < best.evaluations
    # the plan's graph, simulated again with the same arrivals, has the p99 the plan reports
    again = simulate_graph(plan.stages, rate, n_requests=8_000)
    assert again.percentile(99) == pytest.approx(plan.p99)


def test_a_batching_model_gets_smaller_batches_and_more_replicas_when_the_target_tightens():
    loose = plan_capacity(SMALL, 2.0, 40.0, **OPTIONS)
    tight = plan_capacity(SMALL, 2.0, 15.0, **OPTIONS)
    assert loose.feasible and tight.feasible
    assert tight.replicas["topic"] > loose.replicas["topic"]
    assert tight.knobs()["topic"][0] < loose.knobs()["topic"][0]
    assert tight.cost_per_million > loose.cost_per_million


def test_the_plan_is_never_dearer_than_the_uniform_baseline():
    plan = plan_capacity(SMALL, 3.0, 18.0, **OPTIONS)
    uniform = uniform_plan(SMALL, 3.0, 18.0, max_batch_size=8, price_per_replica_hour=PRICE, n_requests=8_000)
    assert uniform.feasible and len(set(uniform.replicas.values())) == 1
    assert plan.cost_per_hour < uniform.cost_per_hour


def test_an_impossible_target_is_reported_not_hidden():
    # a batch of one takes 5.5 ms on topic: no configuration has p99 under 5 ms
    plan = plan_capacity(SMALL, 1.0, 5.0, **OPTIONS)
    assert not plan.feasible and plan.p99 > 5.0
    assert "cannot be met" in plan.steps[-1]
    assert "MISSES" in plan.table()


def test_planner_errors_are_named():
    with pytest.raises(ValueError, match="stage 'topic' cannot keep up"):
        plan_capacity(SMALL, 10.0, 20.0, max_replicas=4, **OPTIONS)
    with pytest.raises(ValueError, match="max_load"):
        plan_capacity(SMALL, 1.0, 20.0, max_load=1.5, **OPTIONS)
    with pytest.raises(ValueError, match="p99_target"):
        plan_capacity(SMALL, 1.0, -1.0, **OPTIONS)


# --- the autoscaler -----------------------------------------------------------------------------------------


def test_rays_rule_desired_replicas_from_ongoing_requests():
    scaler = AutoscalingConfig(target_ongoing_requests=2, min_replicas=1, max_replicas=6)
    assert scaler.desired(mean_ongoing=7.0, current=2) == 4     # ceil(7 / 2)
    assert scaler.desired(mean_ongoing=100.0, current=2) == 6   # clipped to max
    assert scaler.desired(mean_ongoing=0.0, current=3) == 1     # clipped to min
    half = AutoscalingConfig(target_ongoing_requests=2, max_replicas=20, upscaling_factor=0.5,
                             downscaling_factor=0.1)
    assert half.desired(mean_ongoing=20.0, current=2) == 6      # 2 + 0.5 * (10 - 2)
    assert half.desired(mean_ongoing=2.0, current=4) == 3       # a tiny factor still moves down by one
    with pytest.raises(ValueError, match="max_replicas"):
        AutoscalingConfig(min_replicas=3, max_replicas=2)


@pytest.mark.parametrize(("service", "max_batch_size", "max_wait", "replicas"),
                         [(1.0, 1, 0.0, 2), ((2.0, 0.15), 8, 1.0, 3), (Exponential(1.0), 4, 0.0, 2)])
def test_without_an_autoscaler_it_is_simulate_batching(service, max_batch_size, max_wait, replicas):
    arrivals = step_arrivals([1.0, 2.0], [2_000.0, 2_000.0], seed=3)
    stage = Stage(service_time=service, max_batch_size=max_batch_size, max_wait=max_wait, replicas=replicas)
    ours = simulate_autoscaling(stage, arrivals)
    theirs = simulate_batching(None, service, max_batch_size, max_wait, arrivals=arrivals, warmup=0.0,
                               replicas=replicas, allow_unstable=True)
    np.testing.assert_array_equal(ours.finish, theirs.finish)
    assert ours.replica_time == pytest.approx(replicas * (ours.finish.max() - arrivals[0]))


def test_an_autoscaler_pinned_to_one_size_changes_nothing():
    arrivals = step_arrivals([1.0, 3.0, 1.0], [3_000.0, 3_000.0, 3_000.0], seed=1)
    fixed = simulate_autoscaling(Stage(service_time=Exponential(2.0), replicas=8), arrivals)
    pinned = simulate_autoscaling(Stage(service_time=Exponential(2.0)), arrivals,
                                  AutoscalingConfig(min_replicas=8, max_replicas=8, upscale_delay_s=0.0,
                                                    downscale_delay_s=0.0))
    np.testing.assert_array_equal(fixed.finish, pinned.finish)
    assert set(pinned.replicas.tolist()) == {8}


def test_upscale_and_downscale_wait_for_their_delays():
    # Overload from the start: ongoing requests only grow, so every decision says "up"; Ray acts on the
    # decision after int(delay / interval) consecutive ones.
    overload = np.arange(0.0, 3_000.0, 1 / 3)
    scaler = AutoscalingConfig(target_ongoing_requests=1, max_replicas=4, upscale_delay_s=0.5,
                               look_back_period_s=0.1, metrics_interval_s=0.1)
    run = simulate_autoscaling(Stage(service_time=1.0), overload, scaler)
    assert run.replicas[:5].tolist() == [1] * 5 and run.replicas[5] == 4   # the 6th decision acts
    # Light load on a large fleet: every decision says "down".
    light = np.arange(0.0, 5_000.0, 10.0)
    scaler = AutoscalingConfig(target_ongoing_requests=1, max_replicas=8, initial_replicas=8, downscale_delay_s=1.0,
                               look_back_period_s=0.1, metrics_interval_s=0.1)
    run = simulate_autoscaling(Stage(service_time=1.0), light, scaler)
    assert run.replicas[:10].tolist() == [8] * 10 and run.replicas[10] == 1


def step_run(**overrides):
    arrivals = step_arrivals([1.0, 3.0, 1.0], [10_000.0, 10_000.0, 10_000.0], seed=2)
    options = {"target_ongoing_requests": 0.7, "max_replicas": 12, "initial_replicas": 3, "upscale_delay_s": 0.5,
               "downscale_delay_s": 5.0, "look_back_period_s": 3.0, "metrics_interval_s": 0.1}
    scaler = AutoscalingConfig(**{**options, **overrides})
    return arrivals, scaler, simulate_autoscaling(Stage(service_time=Exponential(2.0)), arrivals, scaler,
                                                  startup_s=0.5)


def test_a_load_step_scales_up_and_back_down_and_saves_replica_time_at_the_cost_of_the_tail():
    arrivals, scaler, run = step_run()
    t, replicas = run.control_times, run.replicas
    before, peak, after = replicas[t < 10_000], replicas[(t > 13_000) & (t < 20_000)], replicas[t > 27_000]
    assert before.mean() < peak.mean() and after.mean() < peak.mean()
    assert peak.mean() >= 6 / 0.7 - 1  # about the load (3 per ms x 2 ms) over the target per replica
    assert replicas.min() >= scaler.min_replicas and replicas.max() <= scaler.max_replicas
    fixed = simulate_autoscaling(Stage(service_time=Exponential(2.0), replicas=9), arrivals)
    assert run.replica_time < 0.9 * fixed.replica_time      # it pays for fewer replica-seconds ...
    assert run.percentile(99) > fixed.percentile(99)        # ... with a worse tail, from the step
def test_no_more_batches_run_at_once_than_replicas_were_ordered():
    _, scaler, run = step_run(downscale_delay_s=1.0)
    starts, first = np.unique(run.start, return_index=True)
    ends = run.finish[first]
    for s in starts[::50]:
        busy = np.sum((starts <= s) & (ends > s))
        ordered = run.replicas[run.control_times <= s]
        recent = run.replicas[(run.control_times <= s) & (run.control_times >= s - 50.0)]  # still draining
        allowed = max([ordered[-1] if len(ordered) else scaler.initial_replicas, *recent.tolist()])
        assert busy <= allowed


# --- one planning problem ---------------------------------------------------------------------------------


def test_the_three_planners_take_one_problem_and_their_keyword_calls_still_work():
    # Equal plans either way, however many requests each candidate is simulated with: a quarter of OPTIONS'.
    options = {**OPTIONS, "n_requests": 2_000}
    problem = PlanningProblem(SMALL, 2.0, 20.0, **options, max_replicas=6)
    assert plan_capacity(problem) == plan_capacity(SMALL, 2.0, 20.0, max_replicas=6, **options)
    assert brute_force_plan(problem) == brute_force_plan(SMALL, 2.0, 20.0, max_replicas=6, **options)
    assert uniform_plan(problem) == uniform_plan(SMALL, 2.0, 20.0, max_replicas=6, max_load=0.9, **options)
    with pytest.raises(ValueError, match="not both"):
        plan_capacity(problem, 2.0, 20.0)


@pytest.mark.parametrize(("fields", "named"), [
    ({"arrival_rate": None}, "arrival_rate"), ({"p99_target": 0}, "p99_target"), ({"max_load": 1.0}, "max_load"),
    ({"n_requests": 1.5}, "n_requests"), ({"batch_sizes": (1, 0)}, "batch_sizes"),
    ({"max_waits": (-1.0,)}, "max_waits"), ({"price_per_replica_hour": {"pre": 1.0}}, "no price for stage 'topic'"),
    ({"stages": {"a": (Stage(service_time=1.0), ["nowhere"])}}, "nowhere"),
])
def test_a_bad_problem_is_refused_by_name_before_anything_is_simulated(fields, named):
    with pytest.raises(ValueError, match=named):
        PlanningProblem(**{"stages": SMALL, "arrival_rate": 2.0, "p99_target": 20.0, **fields})
