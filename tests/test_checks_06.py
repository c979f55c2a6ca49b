"""The checkers of exercises 06: each accepts the worked answer and rejects plausible wrong ones, saying why."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from infergraph_lite.core.stage import mean_service_time
from infergraph_lite.exercises import lesson06
from infergraph_lite.exercises.feedback import Feedback
from infergraph_lite.simulation.planning import brute_force_plan


def assert_wrong(feedback: Feedback, *fragments: str) -> None:
    assert feedback.status == "wrong", feedback
    for fragment in fragments:
        assert fragment in feedback.message, feedback


def fewest(stage, rate):
    return next(r for r in range(1, 100) if rate / dataclasses.replace(stage, replicas=r).capacity() <= 0.8)


def fix_bottleneck(stages, rate):
    loads = {name: rate / stage.capacity() for name, (stage, _) in stages.items()}
    return max(loads, key=loads.get), {name: fewest(stage, rate) for name, (stage, _) in stages.items()}


def test_fix_bottleneck_accepts_the_least_capable_stage_and_just_enough_replicas():
    assert lesson06.check_fix_bottleneck(fix_bottleneck).passed


def test_fix_bottleneck_rejects_the_slowest_stage_per_request():
    def slowest(stages, rate):
        _, replicas = fix_bottleneck(stages, rate)
        return max(stages, key=lambda n: mean_service_time(stages[n][0].service_time, 1)), replicas

    assert_wrong(lesson06.check_fix_bottleneck(slowest), "you named 'modelA'", "capacity, replicas x b/s(b)")


def test_fix_bottleneck_rejects_fixing_only_the_bottleneck():
    def only_the_bottleneck(stages, rate):
        name, replicas = fix_bottleneck(stages, rate)
        return name, {n: replicas[n] if n == name else 1 for n in stages}

    assert_wrong(lesson06.check_fix_bottleneck(only_the_bottleneck), "'decode' still runs at 100%", "exposes the next")


def test_fix_bottleneck_rejects_sizing_a_batching_stage_as_if_it_did_not_batch():
    def ignore_batching(stages, rate):
        name, _ = fix_bottleneck(stages, rate)
        return name, {n: math.ceil(rate * mean_service_time(s.service_time, 1) / 0.8) for n, (s, _) in stages.items()}

    assert_wrong(lesson06.check_fix_bottleneck(ignore_batching), "'modelA' needs only 1", "one replica serves 3.64")


def test_fix_bottleneck_rejects_a_malformed_answer():
    assert_wrong(lesson06.check_fix_bottleneck(lambda stages, rate: "modelB"), "return a pair")


def test_fanout_p99_accepts_the_quantile_of_the_max_of_independent_branches():
    assert lesson06.check_fanout_p99(lambda lat, k: np.percentile(lat, 100 * 0.99 ** (1 / k))).passed


def test_fanout_p99_rejects_no_penalty_a_linear_penalty_and_a_lower_quantile():
    assert_wrong(lesson06.check_fanout_p99(lambda lat, k: np.percentile(lat, 99)), "one branch's p99",
                 "slowest of 2 branches")
    assert_wrong(lesson06.check_fanout_p99(lambda lat, k: k * np.percentile(lat, 99)), "too pessimistic")
    assert_wrong(lesson06.check_fanout_p99(lambda lat, k: np.percentile(lat, 100 * (1 - 0.01 * k))), "too low",
                 "never faster than one branch")


def cheapest(rate, target):
    plan = brute_force_plan(lesson06.BATCHING_CHAIN, rate, target, max_replicas=6, batch_sizes=(1, 2, 4, 8, 16, 32),
                            max_waits=(0.0,), n_requests=8_000)
    return {name: (knobs[0], knobs[2]) for name, knobs in plan.knobs().items()}


def test_batching_plan_accepts_the_cheapest_configuration_that_meets_the_target():
    assert lesson06.check_batching_plan(cheapest).passed


def test_batching_plan_rejects_no_batching_huge_batches_and_too_many_replicas():
    assert_wrong(lesson06.check_batching_plan(lambda rate, target: {"embed": (1, 1), "classify": (1, 1)}),
                 "'classify' cannot keep up")
    assert_wrong(lesson06.check_batching_plan(lambda rate, target: {"embed": (32, 1), "classify": (32, 1)}),
                 "has p99", "above the target 20.0 ms")
    assert_wrong(lesson06.check_batching_plan(lambda rate, target: {"embed": (1, 6), "classify": (1, 6)}),
                 "meets the target with 12 replicas, but 3 suffice")
    assert_wrong(lesson06.check_batching_plan(lambda rate, target: {"embed": (8, 1)}), "for the stages")


def product_of_cdfs(samples):
    """The worked answer of exercise 6.4, written independently of the checker: bisection on the product of CDFs."""
    lo, hi = 0.0, max(float(np.max(s)) for s in samples)
    for _ in range(60):
        t = (lo + hi) / 2
        lo, hi = (t, hi) if np.prod([np.mean(s <= t) for s in samples]) < 0.99 else (lo, t)
    return hi


def test_join_p99_accepts_the_product_of_the_branches_cdfs():
    assert lesson06.check_join_p99(product_of_cdfs).passed


def test_join_p99_accepts_resampling_the_max_with_enough_draws():
    def resample(samples):
        rng = np.random.default_rng(1)
        return np.percentile(np.max([rng.choice(s, 400_000) for s in samples], axis=0), 99)

    assert lesson06.check_join_p99(resample).passed


def test_join_p99_rejects_the_slowest_branch_alone_and_every_branch_as_slow_as_it():
    assert_wrong(lesson06.check_join_p99(lambda samples: max(np.percentile(s, 99) for s in samples)),
                 "four alike shards", "the slowest branch's own p99")
    assert_wrong(lesson06.check_join_p99(
        lambda samples: max(np.percentile(s, 100 * 0.99 ** (1 / len(samples))) for s in samples)),
        "four alike shards", "as if it were as slow as the slowest")


def test_join_p99_rejects_averaging_the_branches_and_a_non_number():
    def mean_of_quantiles(samples):
        return float(np.mean([np.percentile(s, 100 * 0.99 ** (1 / len(samples))) for s in samples]))

    assert_wrong(lesson06.check_join_p99(mean_of_quantiles), "a cache, a model and a ranker", "too low",
                 "never faster than its slowest branch")
    assert_wrong(lesson06.check_join_p99(lambda samples: "fast"), "join_p99 for four alike shards")


def test_join_cases_are_copies():
    cases = lesson06.join_cases()
    cases["four alike shards"]["shard0"][:] = 0.0
    assert lesson06.join_cases()["four alike shards"]["shard0"].max() > 0
