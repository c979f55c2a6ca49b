"""Checkers for the exercises of notebook 06, *Serving the whole graph*: replicas for a p99 target, fan-out tails,
batching plans.

:func:`replica_cases` are exercise 6.1's graphs, :data:`BATCHING_CHAIN` is exercise 6.3's graph and
:func:`join_cases` exercise 6.4's branches; the notebook shows them to the learner.

>>> check_fanout_p99(lambda latencies, k: 0.0).passed
False
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from functools import cache

import numpy as np

from infergraph_lite.core.stage import Exponential, Stage
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require, require_count, require_number
from infergraph_lite.simulation.graph import StageStats, simulate_graph
from infergraph_lite.simulation.planning import brute_force_plan
from infergraph_lite.simulation.queue import UnstableLoadError, simulate_batching

__all__ = ["BATCHING_CHAIN", "BATCH_SIZES_06", "check_batching_plan", "check_fanout_p99",
           "check_fewest_replicas_for_p99", "check_join_p99", "fewest_replicas_for", "join_cases", "join_p99_of", "replica_cases", "with_replicas"]

# Exercise 6.1: the fewest replicas for a p99 target.  Each case is a graph, an arrival rate (per ms) and a p99
# target (ms), chosen so that sizing every stage to 80 % offered load or to 80 % busy fraction goes wrong in a
# different way: the chain misses on offered load and overbuys its batching stage on busy fraction; the example
# graph misses on both (busy fraction buys the batching stage's replica, the p99 needs modelB's); the search
# graph meets on offered load, and overbuys its batching stage on busy fraction.
_REPLICA_N = 20_000  # requests per simulation; with seed 0, the run the exercise names


def _replica_cases() -> dict[str, tuple[dict[str, tuple[Stage, list[str]]], float, float]]:
    chain = {
        "decode": (Stage(service_time=0.5), ["request"]),
        "embed": (Stage(service_time=(3.0, 0.1), max_batch_size=32), ["decode"]),
        "classify": (Stage(service_time=0.9), ["embed"]),
    }
    example = {
        "pre": (Stage(service_time=0.4), ["request"]),
        "modelA": (Stage(service_time=(2.0, 0.15), max_batch_size=16, max_wait=1.0), ["pre"]),
        "modelB": (Stage(service_time=Exponential(1.5)), ["pre"]),
        "combine": (Stage(service_time=0.1), ["modelA", "modelB"]),
    }
    search = {
        "parse": (Stage(service_time=0.2), ["request"]),
        "retrieve": (Stage(service_time=(1.0, 0.05), max_batch_size=8), ["parse"]),
        "rerank": (Stage(service_time=Exponential(4.0)), ["retrieve"]),
    }
    return {"chain": (chain, 2.0, 9.7), "example": (example, 1.2, 8.5), "search": (search, 1.3, 25.0)}


def replica_cases() -> dict[str, tuple[dict[str, tuple[Stage, list[str]]], float, float]]:
    """Exercise 6.1's cases: name -> (stage graph, arrival rate per ms, p99 target in ms).

    >>> {name: (rate, target) for name, (_, rate, target) in replica_cases().items()}
    {'chain': (2.0, 9.7), 'example': (1.2, 8.5), 'search': (1.3, 25.0)}
    """
    return _replica_cases()


def with_replicas(stages: dict[str, tuple[Stage, list[str]]], replicas: dict[str, int]) -> dict:
    """``stages`` with each stage's replica count replaced by ``replicas[name]``, its other knobs kept.

    >>> graph = with_replicas(replica_cases()["chain"][0], {"decode": 2, "embed": 1, "classify": 3})
    >>> {name: stage.replicas for name, (stage, _) in graph.items()}
    {'decode': 2, 'embed': 1, 'classify': 3}
    """
    return {name: (dataclasses.replace(stage, replicas=replicas[name]), deps) for name, (stage, deps) in stages.items()}


def _keeping_up(stage: Stage, rate: float) -> int:
    return next(r for r in range(1, 10_000) if rate < dataclasses.replace(stage, replicas=r).capacity())


@cache
def fewest_replicas_for(case: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """The fewest replicas in all that meet ``case``'s p99 target, and one such assignment (every one searched:
    from the fewest that keep up, each way of adding 1, 2, 3, ... replicas).

    >>> fewest_replicas_for("search")
    (9, (('parse', 1), ('retrieve', 1), ('rerank', 7)))
    """
    stages, rate, target = _replica_cases()[case]
    low = {name: _keeping_up(stage, rate) for name, (stage, _) in stages.items()}
    for extra in range(40):
        for added in itertools.combinations_with_replacement(stages, extra):
            replicas = {name: low[name] + added.count(name) for name in stages}
            if simulate_graph(with_replicas(stages, replicas), rate, n_requests=_REPLICA_N, seed=0).percentile(99) \
                    <= target:
                return sum(replicas.values()), tuple(replicas.items())
    raise AssertionError(f"no assignment of replicas meets case {case!r}")  # pragma: no cover


def _fractions(stats: StageStats) -> str:
    return f"busy {stats.utilization:.0%} of the time at {stats.offered_load:.0%} offered load"


@checker
def check_fewest_replicas_for_p99(fewest_replicas: Callable[[dict, float, float], dict[str, int]]) -> str:
    """Exercise 06.1: per-stage replicas whose simulated end-to-end p99 meets a target, the fewest in all."""
    for case, (stages, rate, target) in _replica_cases().items():
        replicas = fewest_replicas(stages, rate, target)
        require(isinstance(replicas, dict) and set(replicas) == set(stages),
                f"return {{stage: replicas}} for every stage of the {case} graph: {sorted(stages)}")
        replicas = {name: require_count(f"replicas of {name!r}", replicas[name]) for name in stages}
        where = f"for the {case} graph at {rate} requests per ms, p99 <= {target} ms"
        try:
            run = simulate_graph(with_replicas(stages, replicas), rate, n_requests=_REPLICA_N, seed=0)
        except UnstableLoadError as unstable:
            raise WrongAnswer(f"{where}: {unstable}") from None
        p99 = run.percentile(99)
        if p99 > target:
            own = {name: float(np.nanpercentile(stats.finish - stats.arrival, 99))
                   for name, stats in run.stages.items()}
            slowest = max(own, key=own.__getitem__)
            raise WrongAnswer(f"{where}: your replicas {replicas} give p99 {p99:.2f} ms. The longest tail is at "
                              f"{slowest!r} (p99 {own[slowest]:.2f} ms from reaching it to leaving it; "
                              f"{_fractions(run.stages[slowest])}): a stage can keep up and still hold the tail")
        fewest, example = fewest_replicas_for(case)
        used = sum(replicas.values())
        if used > fewest:
            best = dict(example)
            hint = ""
            best_run = simulate_graph(with_replicas(stages, best), rate, n_requests=_REPLICA_N, seed=0)
            for name, (stage, _) in stages.items():
                if replicas[name] > best[name] and stage.max_batch_size != 1:
                    hint = (f" {name!r} needs only {best[name]}, {_fractions(best_run.stages[name])}: a batching "
                            "stage busy most of the time still keeps up, since its batches grow with its queue")
                    break
            raise WrongAnswer(f"{where}: your replicas meet the target with {used} in all, but {fewest} suffice, "
                              f"e.g. {best}.{hint}")
    return ("each graph meets its p99 target with the fewest replicas: neither the offered load nor the busy "
            "fraction of a stage says how many replicas the tail needs; the simulation does.")


def _branch_sample() -> np.ndarray:
    return simulate_batching(0.5, Exponential(1.0), n_requests=50_000, seed=6).latencies


@checker
def check_fanout_p99(fanout_p99: Callable[[np.ndarray, int], float]) -> str:
    """Exercise 06.2: the p99 of a k-way join, predicted from one branch's latencies (branches independent)."""
    sample = _branch_sample()
    p99 = float(np.percentile(sample, 99))
    for k in (1, 2, 10, 100):
        got = float(fanout_p99(sample.copy(), k))
        expected = float(np.percentile(sample, 100 * 0.99 ** (1 / k)))
        if math.isclose(got, expected, rel_tol=0.02):
            continue
        if k > 1 and math.isclose(got, p99, rel_tol=0.02):
            raise WrongAnswer(f"for k={k} you predicted one branch's p99 ({p99:.2f} ms): the join waits for the "
                              f"slowest of {k} branches, so it is slow whenever any of them is")
        if got > expected:
            raise WrongAnswer(f"for k={k} you predicted {got:.2f} ms, too pessimistic: the join beats t when all {k} "
                              f"branches do, probability F(t)^{k}; set that to 0.99 (expected {expected:.2f} ms)")
        raise WrongAnswer(f"for k={k} you predicted {got:.2f} ms, too low: a join is never faster than one branch; "
                          f"with P(all {k} below t) = F(t)^{k} = 0.99 it is one branch's quantile 0.99^(1/{k}) "
                          f"(expected {expected:.2f} ms)")
    return "a k-way join's p99 is one branch's quantile 0.99^(1/k) (for independent branches)."


BATCHING_CHAIN = {
    "embed": (Stage(service_time=(2.0, 0.2)), ["request"]),
    "classify": (Stage(service_time=(4.0, 0.4)), ["embed"]),
}
BATCH_SIZES_06 = (1, 2, 4, 8, 16, 32)


@cache
def _fewest_replicas_06(rate: float, target: float) -> tuple[int, tuple]:
    plan = brute_force_plan(BATCHING_CHAIN, rate, target, max_replicas=6, batch_sizes=BATCH_SIZES_06,
                            max_waits=(0.0,), max_load=0.99, n_requests=8_000)
    return plan.total_replicas, tuple((n, k[0], k[2]) for n, k in plan.knobs().items())


@checker
def check_batching_plan(choose_batching: Callable[[float, float], dict[str, tuple[int, int]]]) -> str:
    """Exercise 06.3: per-stage (max_batch_size, replicas) for BATCHING_CHAIN meeting a p99 target with the
    fewest replicas (simulated with simulate_graph, n_requests=8000, seed=0)."""
    for rate, target in ((1.0, 20.0), (2.0, 15.0)):
        config = choose_batching(rate, target)
        require(isinstance(config, dict) and set(config) == set(BATCHING_CHAIN),
                f"return {{stage: (max_batch_size, replicas)}} for the stages {sorted(BATCHING_CHAIN)}")
        stages = {}
        for name, (stage, deps) in BATCHING_CHAIN.items():
            b, r = config[name]
            require(b in BATCH_SIZES_06, f"max_batch_size of {name!r} must be one of {BATCH_SIZES_06}, got {b!r}")
            r = require_count(f"replicas of {name!r}", r)
            stages[name] = (Stage(service_time=stage.service_time, max_batch_size=b, replicas=r), deps)
        try:
            p99 = simulate_graph(stages, rate, n_requests=8_000, seed=0).percentile(99)
        except UnstableLoadError as unstable:
            raise WrongAnswer(f"at {rate} requests per ms: {unstable}") from None
        used = sum(r for _, r in config.values())
        require(p99 <= target, f"at {rate} requests per ms your configuration {config} has p99 {p99:.2f} ms, above the "
                               f"target {target} ms (a full batch of b takes alpha + beta*b: large batches are slow, "
                               "small ones need replicas)")
        fewest, example = _fewest_replicas_06(rate, target)
        if used > fewest:
            hint = ", ".join(f"{n} (batch {b}, {r} replica{'s' if r > 1 else ''})" for n, b, r in example)
            raise WrongAnswer(f"at {rate} requests per ms your configuration meets the target with {used} replicas, "
                              f"but {fewest} suffice, e.g. {hint}")
    return "the target met with the fewest replicas at both loads."



# Exercise 6.4: a join whose branches are not alike.  Each branch is an M/M/1 queue (arrival rate, mean service
# in ms, seed), so its latencies have the long exponential tail of notebook 04.
_JOIN_CASES: dict[str, dict[str, tuple[float, float, int]]] = {
    "four alike shards": {f"shard{i}": (0.5, 1.0, i) for i in range(4)},
    "a cache, a model and a ranker": {"cache": (0.5, 0.2, 10), "model": (0.5, 1.0, 11), "ranker": (0.5, 1.6, 12)},
    "four models, close but unlike": {"model_a": (0.5, 1.0, 20), "model_b": (0.5, 1.2, 21),
                                      "model_c": (0.4, 1.2, 22), "model_d": (0.6, 1.0, 23)},
}


@cache
def _join_samples(case: str) -> tuple[tuple[str, np.ndarray], ...]:
    return tuple((name, simulate_batching(rate, Exponential(mean), n_requests=50_000, seed=seed).latencies)
                 for name, (rate, mean, seed) in _JOIN_CASES[case].items())


def join_cases() -> dict[str, dict[str, np.ndarray]]:
    """Exercise 6.4's fan-outs: case name -> {branch name: a sample of that branch's latencies (ms)}.

    >>> cases = join_cases()
    >>> list(cases)
    ['four alike shards', 'a cache, a model and a ranker', 'four models, close but unlike']
    >>> sorted(cases["a cache, a model and a ranker"])
    ['cache', 'model', 'ranker']
    """
    return {case: {name: sample.copy() for name, sample in _join_samples(case)} for case in _JOIN_CASES}


def join_p99_of(branch_samples: list[np.ndarray], quantile: float = 0.99) -> float:
    """The ``quantile`` of the max of independent branches, branch i distributed like ``branch_samples[i]``: the
    least t at which the product of the branches' empirical CDFs reaches ``quantile``.

    >>> one = np.arange(1.0, 101.0)            # 1, 2, ..., 100 ms
    >>> join_p99_of([one]), join_p99_of([one, one], quantile=0.81)
    (99.0, 90.0)
    """
    times = np.unique(np.concatenate(branch_samples))
    done = np.ones(len(times))
    for sample in branch_samples:
        done *= np.searchsorted(np.sort(sample), times, side="right") / len(sample)
    return float(times[np.argmax(done >= quantile - 1e-12)])


@checker
def check_join_p99(join_p99: Callable[[list[np.ndarray]], float]) -> str:
    """Exercise 06.4: the p99 of a join whose independent branches are not alike, from one sample per branch."""
    for case in _JOIN_CASES:
        samples = [sample for _, sample in _join_samples(case)]
        got = require_number(f"join_p99 for {case}", join_p99([s.copy() for s in samples]))
        expected = join_p99_of(samples)
        if math.isclose(got, expected, rel_tol=0.02):
            continue
        k = len(samples)
        slowest_p99 = max(float(np.percentile(s, 99)) for s in samples)
        all_slowest = max(float(np.percentile(s, 100 * 0.99 ** (1 / k))) for s in samples)
        where = f"for {case} ({k} branches) you predicted {got:.2f} ms, expected {expected:.2f} ms"
        if math.isclose(got, slowest_p99, rel_tol=0.02):
            raise WrongAnswer(f"{where}: that is the slowest branch's own p99, which ignores that the join is also "
                              "late whenever any other branch is; it is done by t only when every branch is")
        if math.isclose(got, all_slowest, rel_tol=0.02):
            raise WrongAnswer(f"{where}: that treats every branch as if it were as slow as the slowest (its quantile "
                              f"0.99^(1/{k})); use each branch's own chance of being done by t")
        if got < slowest_p99:
            raise WrongAnswer(f"{where}, too low: a join is never faster than its slowest branch, whose p99 alone is "
                              f"{slowest_p99:.2f} ms")
        raise WrongAnswer(f"{where}, too high: find the least t at which the chance that every branch is done "
                          "reaches 0.99")
    return ("the join is done by t only when every branch is: P = F_1(t) x ... x F_k(t), and its p99 is where that "
            "product reaches 0.99.")
