"""The checkers of exercises 06: each accepts the worked answer and rejects plausible wrong ones, saying why."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from infergraph_lite.core.stage import mean_service_time
from infergraph_lite.exercises import lesson06
from infergraph_lite.exercises.feedback import Feedback
from infergraph_lite.simulation.graph import simulate_graph
from infergraph_lite.simulation.planning import brute_force_plan


def assert_wrong(feedback: Feedback, *fragments: str) -> None:
    assert feedback.status == "wrong", feedback
    for fragment in fragments:
        assert fragment in feedback.message, feedback


def fewest_replicas(stages, rate, target):
    """The worked answer: from the fewest replicas that keep up, every way of adding 1, 2, 3, ... replicas."""
    low = {name: next(r for r in range(1, 100) if rate < dataclasses.replace(stage, replicas=r).capacity())
           for name, (stage, _) in stages.items()}
    for extra in range(20):
        for added in itertools.combinations_with_replacement(stages, extra):
            replicas = {name: low[name] + added.count(name) for name in stages}
            if simulate_graph(lesson06.with_replicas(stages, replicas), rate, n_requests=20_000,
                              seed=0).percentile(99) <= target:
                return replicas
    return None


def sized_by(fraction, ceiling=0.8):
    """A sizing rule: add a replica to every stage whose offered load (or busy fraction) is above the ceiling."""
    def answer(stages, rate, target):
        replicas = {name: next(r for r in range(1, 100) if rate < dataclasses.replace(stage, replicas=r).capacity())
                    for name, (stage, _) in stages.items()}
        while True:
            run = simulate_graph(lesson06.with_replicas(stages, replicas), rate, n_requests=20_000, seed=0)
            over = [name for name in stages if getattr(run.stages[name], fraction) > ceiling]
            if not over:
                return replicas
            for name in over:
                replicas[name] += 1
    return answer


def right_for_the_chain(rule):
    """The worked answer for the chain, ``rule`` for the other graphs: reaches the checker's later cases."""
    return lambda stages, rate, target: (fewest_replicas if "embed" in stages else rule)(stages, rate, target)


def test_fewest_replicas_accepts_the_worked_answer():
    assert lesson06.check_fewest_replicas_for_p99(fewest_replicas).passed


def test_fewest_replicas_rejects_sizing_on_offered_load_which_misses_the_target():
    assert_wrong(lesson06.check_fewest_replicas_for_p99(sized_by("offered_load")), "chain graph", "give p99 10.65 ms",
                 "longest tail is at 'embed'", "busy 100% of the time at 39% offered load")


def test_fewest_replicas_rejects_sizing_on_busy_fraction_which_overbuys_the_batching_stage():
    assert_wrong(lesson06.check_fewest_replicas_for_p99(sized_by("utilization")), "with 12 in all, but 7 suffice",
                 "'embed' needs only 2", "busy 97% of the time at 19% offered load", "batches grow")


def test_fewest_replicas_rejects_busy_fraction_buying_the_batching_stage_a_replica_the_tail_does_not_need():
    assert_wrong(lesson06.check_fewest_replicas_for_p99(right_for_the_chain(sized_by("utilization"))), "example graph",
                 "longest tail is at 'modelB'", "busy 61% of the time at 60% offered load")


def test_fewest_replicas_rejects_sizing_as_if_no_stage_batched():
    def no_batching(stages, rate, target):
        return {name: math.ceil(rate * mean_service_time(stage.service_time, 1) / 0.8)
                for name, (stage, _) in stages.items()}

    assert_wrong(lesson06.check_fewest_replicas_for_p99(no_batching), "but 7 suffice", "'embed' needs only 2")


def test_fewest_replicas_rejects_a_stage_that_cannot_keep_up_and_a_malformed_answer():
    assert_wrong(lesson06.check_fewest_replicas_for_p99(lambda stages, rate, target: dict.fromkeys(stages, 1)),
                 "cannot keep up")
    assert_wrong(lesson06.check_fewest_replicas_for_p99(lambda stages, rate, target: [1]), "for every stage")


def test_the_search_graph_is_met_on_offered_load_and_overbought_on_busy_fraction():
    stages, rate, target = lesson06.replica_cases()["search"]
    fewest, _ = lesson06.fewest_replicas_for("search")
    assert sum(sized_by("offered_load")(stages, rate, target).values()) == fewest
    assert sum(sized_by("utilization")(stages, rate, target).values()) > fewest


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
