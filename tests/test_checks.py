"""The checkers of exercises 01-05 and 07: each rejects plausible wrong answers with a specific reason, and spots stubs.

That each accepts the worked answer is shown by solutions/, whose check cells must print "Correct"
(tests/test_exercises.py), re-run by nbval.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from infergraph_lite import critical_path, levels, run_graph, simulate_batching
from infergraph_lite.exercises import lesson01, lesson02, lesson03, lesson04, lesson05, lesson07
from infergraph_lite.exercises.feedback import Feedback, WrongAnswer, require_count, require_number
from infergraph_lite.frameworks.triton import triton_available

LESSONS = [f"infergraph_lite.exercises.lesson0{n}" for n in range(1, 8)]
CHECKERS = [(f"{module.rsplit('.', 1)[1]}.{name}", getattr(importlib.import_module(module), name))
            for module in LESSONS for name in importlib.import_module(module).__all__ if name.startswith("check_")]


def stub(*_args, **_kwargs):
    raise NotImplementedError("use (func, ['combine'])")


def assert_wrong(feedback: Feedback, *fragments: str) -> None:
    assert feedback.status == "wrong", feedback
    for fragment in fragments:
        assert fragment in feedback.message, feedback


def test_feedback_reads_as_one_line():
    assert repr(Feedback("correct", "well done.")) == "Correct: well done."
    assert repr(Feedback("not done", "x")).startswith("Not done yet: ")
    assert repr(Feedback("wrong", "x")).startswith("Not right yet: ")


def test_feedback_renders_as_a_coloured_box_per_status_that_wraps_only_between_words():
    boxes = {status: Feedback(status, "node <b> ran before 'a' & more")._repr_html_()
             for status in ("correct", "wrong", "not done")}
    for status, label in [("correct", "Correct"), ("wrong", "Not right yet"), ("not done", "Not done yet")]:
        assert label in boxes[status]
        assert "node &lt;b&gt; ran before &#x27;a&#x27; &amp; more" in boxes[status]  # the message is escaped
        assert "word-break: normal" in boxes[status] and "hyphens: none" in boxes[status]
    colours = {re.search(r"border-left: 6px solid (#[0-9a-f]{6})", box).group(1) for box in boxes.values()}
    assert len(colours) == 3  # the three verdicts look different
    with pytest.raises(ValueError, match="status must be one of"):
        Feedback("almost", "x")


def test_every_lesson_exports_its_checkers_and_nothing_is_exported_twice():
    names = [label.split(".")[1] for label, _ in CHECKERS]
    assert len(names) == len(set(names)) == 24  # the checks of notebooks 01-07
    for module in map(importlib.import_module, LESSONS):
        defined = {name for name in vars(module) if name.startswith("check_")}
        assert defined == {name for name in module.__all__ if name.startswith("check_")}, module.__name__
        assert all(hasattr(module, name) for name in module.__all__)


@pytest.mark.parametrize("checker", [c for _, c in CHECKERS], ids=[label for label, _ in CHECKERS])
def test_every_checker_reports_a_stub_as_not_done_never_raising(checker):
    feedback = checker(stub)
    assert feedback.status == "not done" and not feedback.passed
    assert "Hint: use (func, ['combine'])" in feedback.message


def test_lesson02_loads_neither_triton_nor_the_planner():
    # A fresh interpreter: this one has imported every lesson already.
    code = ("import infergraph_lite.exercises.lesson02, sys; "
            "print(sorted(m for m in sys.modules if m.startswith(('infergraph_lite.frameworks', 'tritonclient', "
            "'infergraph_lite.simulation.planning'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_answer_counts_and_numbers_are_checked_by_the_core_argument_checks_and_read_as_wrong_answers():
    assert require_count("replicas", 3) == 3
    with pytest.raises(WrongAnswer, match=r"replicas of 'embed' must be an integer >= 1, got 2.5"):
        require_count("replicas of 'embed'", 2.5)
    with pytest.raises(WrongAnswer, match="max_wait must be >= 0, got -1"):
        require_number("max_wait", -1, positive=False)
    assert_wrong(lesson04.check_fewest_replicas(lambda rate, service, target: 2.0), "must be an integer >= 1")
    assert_wrong(lesson04.check_fanout_median(lambda k, load: float("nan")), "median latency in ms for k=1",
                 "finite number")


def test_a_crashing_answer_is_feedback_not_an_exception():
    feedback = lesson01.check_add_postprocess(lambda nodes: 1 / 0)
    assert_wrong(feedback, "ZeroDivisionError")


# --- 01 ------------------------------------------------------------------------------------------------


def test_add_postprocess_rejects_wrong_wiring_mutation_and_hard_coding():
    def wrong_dep(nodes):
        return dict(nodes, postprocess=(lambda n: f"len={n}", ["modelA"]))

    def mutates(nodes):
        nodes["postprocess"] = (lambda d: f"len={d['len']} a_count={d['a_count']}", ["combine"])
        return nodes

    def hard_coded(nodes):
        return dict(nodes, postprocess=(lambda d: "len=6 a_count=3", ["combine"]))

    assert_wrong(lesson01.check_add_postprocess(wrong_dep), "depend on ['combine']")
    assert_wrong(lesson01.check_add_postprocess(mutates), "changed the graph it was given")
    assert_wrong(lesson01.check_add_postprocess(hard_coded), "don't hard-code")


def test_modelC_rejects_a_sequential_model_and_a_wrong_count():
    def after_modelA(nodes):
        combine = lambda n, a, v: {"len": n, "a_count": a, "vowels": v}  # noqa: E731
        return dict(nodes, modelC=(lambda s, _: sum(c in "aeiou" for c in s), ["pre", "modelA"]),
                    combine=(combine, ["modelA", "modelB", "modelC"]))

    def counts_y(nodes):
        combine = lambda n, a, v: {"len": n, "a_count": a, "vowels": v}  # noqa: E731
        return dict(nodes, modelC=(lambda s: sum(c in "aeiouy" for c in s) + s.count("q"), ["pre"]),
                    combine=(combine, ["modelA", "modelB", "modelC"]))

    assert_wrong(lesson01.check_modelC(after_modelA), "depend on ['pre'] only")
    assert_wrong(lesson01.check_modelC(counts_y), "4 vowels")


def test_confidence_gate_rejects_and_instead_of_or_and_a_wrong_threshold():
    def both_low(nodes):
        gate = lambda t, s: t["confidence"] < 0.6 and s["confidence"] < 0.6  # noqa: E731
        return dict(nodes, needs_review=(gate, ["topic", "sentiment"]))

    def inclusive(nodes):
        gate = lambda t, s: min(t["confidence"], s["confidence"]) <= 0.6  # noqa: E731
        return dict(nodes, needs_review=(gate, ["topic", "sentiment"]))

    assert_wrong(lesson01.check_confidence_gate(both_low), "either is below 0.6")
    assert_wrong(lesson01.check_confidence_gate(inclusive), "confidence 0.6")


# --- 02 ------------------------------------------------------------------------------------------------


def test_run_graph_with_levels_rejects_shallowest_dependency_and_one_flat_level():
    def by_shallowest(nodes, inputs):
        depth = {}
        for generation in levels(nodes, inputs):  # pretend-correct order, wrong depth rule
            for name in generation:
                node_deps = [d for d in nodes[name][1] if d in nodes]
                depth[name] = 1 + min((depth[d] for d in node_deps), default=-1)
        grouped = {}
        for name, d in depth.items():
            grouped.setdefault(d, []).append(name)
        return run_graph(nodes, inputs), [sorted(grouped[k]) for k in sorted(grouped)]

    def flat(nodes, inputs):
        return run_graph(nodes, inputs), [sorted(nodes)]

    assert_wrong(lesson02.check_run_graph_with_levels(by_shallowest), "skip edge", "deepest")
    assert_wrong(lesson02.check_run_graph_with_levels(flat), "diamond")


def test_find_cycle_nodes_rejects_leftover_nodes_and_reversed_order():
    def leftovers(nodes):  # everything Kahn could not run: includes nodes downstream of the cycle
        order = set()
        changed = True
        while changed:
            changed = False
            for name, (_, deps) in nodes.items():
                if name not in order and all(d in order or d not in nodes for d in deps):
                    order.add(name)
                    changed = True
        rest = [n for n in nodes if n not in order]
        return rest or None

    def reversed_cycle(nodes):
        from infergraph_lite import find_cycle

        cycle = find_cycle(nodes)
        return cycle[::-1] if cycle and len(cycle) > 2 else cycle

    assert_wrong(lesson02.check_find_cycle_nodes(leftovers), "3-cycle with a tail", "not part of it")
    assert_wrong(lesson02.check_find_cycle_nodes(reversed_cycle), "data-flow order")


def test_find_cycle_nodes_rejects_a_recursive_search_on_the_lessons_ring():
    def recursive(nodes):  # right on small graphs, but one Python call per node on the path
        state: dict[str, str] = {}

        def visit(name, path):
            state[name] = "active"
            path.append(name)
            for dep in nodes[name][1]:
                if dep in nodes and state.get(dep) == "active":
                    return path[path.index(dep):][::-1]
                if dep in nodes and dep not in state and (cycle := visit(dep, path)):
                    return cycle
            path.pop()
            state[name] = "done"
            return None

        return next((cycle for name in nodes if name not in state and (cycle := visit(name, []))), None)

    assert sorted(recursive({"a": (None, ["b"]), "b": (None, ["a"])})) == ["a", "b"]
    assert_wrong(lesson02.check_find_cycle_nodes(recursive), "50,000 nodes", "recursion limit")


def test_missing_dependencies_rejects_first_only_and_counting_nodes_as_missing():
    def first_only(nodes, inputs):
        for name, (_, deps) in nodes.items():
            missing = [d for d in deps if d not in nodes and d not in inputs]
            if missing:
                return {name: missing}
        return {}

    def ignores_nodes(nodes, inputs):
        found = {n: [d for d in dict.fromkeys(deps) if d not in inputs] for n, (_, deps) in nodes.items()}
        return {n: m for n, m in found.items() if m}

    assert_wrong(lesson02.check_missing_dependencies(first_only), "report every node")
    assert_wrong(lesson02.check_missing_dependencies(ignores_nodes), "not missing")


def test_run_only_needed_rejects_running_everything_and_running_twice():
    def everything(nodes, inputs, wanted):
        return run_graph(nodes, inputs)

    def twice(nodes, inputs, wanted):
        def value(name):
            if name in inputs:
                return inputs[name]
            func, deps = nodes[name]
            return func(*[value(d) for d in deps])  # no memo: shared dependencies run again

        return {w: value(w) for w in wanted}

    assert_wrong(lesson02.check_run_only_needed(everything), "only pre and modelA")
    assert_wrong(lesson02.check_run_only_needed(twice), "exactly once")


# --- 03 ------------------------------------------------------------------------------------------------


def test_parallel_speedup_bound_rejects_width_and_inverted_ratio():
    # The width of the widest level is a plausible wrong answer (the most workers ever busy at once).
    assert_wrong(lesson03.check_parallel_speedup_bound(lambda nodes, d: float(max(map(len, levels(nodes, ["x"]))))),
                 "sequential time divided by the critical path")
    assert_wrong(lesson03.check_parallel_speedup_bound(
        lambda nodes, d: critical_path(nodes, d)[1] / sum(d.values())), "divided by")


def test_run_asap_parallel_rejects_sequential_and_level_by_level_executors():
    from concurrent.futures import ThreadPoolExecutor

    from infergraph_lite import run_graph_parallel

    def sequential(nodes, inputs, workers):
        return run_graph(nodes, inputs)

    def by_levels(nodes, inputs, workers):
        results = dict(inputs)
        with ThreadPoolExecutor(workers) as pool:
            for level in levels(nodes, inputs):
                futures = {n: pool.submit(nodes[n][0], *[results[d] for d in nodes[n][1]]) for n in level}
                results.update({n: f.result() for n, f in futures.items()})
        return results

    assert_wrong(lesson03.check_run_asap_parallel(sequential), "ran one after the other", "at the same time")
    assert_wrong(lesson03.check_run_asap_parallel(by_levels), "after_fast waited for slow", "level-by-level")
    assert lesson03.check_run_asap_parallel(lambda nodes, inputs, workers: run_graph_parallel(nodes, inputs,
                                                                                            max_workers=workers)).passed


def test_best_node_to_speed_up_rejects_the_longest_node_and_the_first_on_the_path():
    def longest(nodes, durations):
        return max(durations, key=durations.get)

    def first_on_path(nodes, durations):
        return critical_path(nodes, durations)[0][0]

    assert_wrong(lesson03.check_best_node_to_speed_up(longest), "longest node is not always")
    assert_wrong(lesson03.check_best_node_to_speed_up(first_on_path), "you chose", "a shorter one may sit on every")


# --- 04 ------------------------------------------------------------------------------------------------


def test_fewest_replicas_rejects_capacity_only_and_an_off_by_one():
    import math

    def capacity_only(rate, service, target):
        return math.floor(rate * service) + 1

    def one_extra(rate, service, target):
        r = 1
        while rate * service / r >= 1 or simulate_batching(rate, service, replicas=r,
                                                           n_requests=20_000).percentile(99) > target:
            r += 1
        return r + 1

    assert_wrong(lesson04.check_fewest_replicas(capacity_only), "the tail")
    assert_wrong(lesson04.check_fewest_replicas(one_extra), "the simulation says")


def test_fewest_replicas_accepts_a_correct_answer_simulated_with_another_seed():
    def with_seed(seed):
        def fewest(rate, service, target):
            r = 1
            while rate * service / r >= 1 or simulate_batching(rate, service, replicas=r, n_requests=20_000,
                                                               seed=seed).percentile(99) > target:
                r += 1
            return r
        return fewest

    for seed in (0, 3, 17):
        assert lesson04.check_fewest_replicas(with_seed(seed)).passed


def test_fanout_median_accepts_exact_and_sampled_answers_and_rejects_one_calls_median_and_p99():
    import numpy as np

    def exact(k, load):
        latencies = simulate_batching(load / 10.0, 10.0, n_requests=100_000, seed=3).latencies
        return float(np.quantile(latencies, 0.5 ** (1 / k)))

    def sampled(k, load):  # draw k calls per page from one simulated server and take the slowest
        latencies = simulate_batching(load / 10.0, 10.0, n_requests=100_000, seed=5).latencies
        pages = np.random.default_rng(1).choice(latencies, (20_000, k)).max(axis=1)
        return float(np.median(pages))

    def one_call_median(k, load):
        return float(np.median(simulate_batching(load / 10.0, 10.0, n_requests=50_000).latencies))

    def one_call_p99(k, load):
        return float(np.percentile(simulate_batching(load / 10.0, 10.0, n_requests=50_000).latencies, 99))

    assert lesson04.check_fanout_median(exact).passed
    assert lesson04.check_fanout_median(sampled).passed
    assert_wrong(lesson04.check_fanout_median(one_call_median), "slowest of its calls")
    assert_wrong(lesson04.check_fanout_median(one_call_p99), "P(one call <= x) ** k")


def test_variability_penalty_rejects_latency_ratio_and_a_constant_guess_of_one():
    from infergraph_lite.simulation.theory import md1_mean_latency, mm1_mean_latency

    latency_ratio = lambda rho: mm1_mean_latency(rho, 1.0) / md1_mean_latency(rho, 1.0)  # noqa: E731
    assert_wrong(lesson04.check_variability_penalty(latency_ratio), "latency adds s")
    assert_wrong(lesson04.check_variability_penalty(lambda rho: 1.0))


# --- 05 ------------------------------------------------------------------------------------------------


def test_batching_capacity_rejects_per_batch_rate_and_forgetting_beta_b():
    assert_wrong(lesson05.check_batching_capacity(lambda a, b_, n: 1 / (a + b_ * n)), "b requests every")
    assert_wrong(lesson05.check_batching_capacity(lambda a, b_, n: n / (a + b_)))


def test_window_tradeoff_rejects_swapped_loads_and_missing_windows():
    def swapped(windows):
        out = {}
        for w in windows:
            low = simulate_batching(0.05, (2.0, 0.15), 32, w, n_requests=5_000)
            high = simulate_batching(4.0, (2.0, 0.15), 32, w, n_requests=5_000)
            out[w] = {"low": {"latency": high.mean_latency, "batch": high.mean_batch_size},
                      "high": {"latency": low.mean_latency, "batch": low.mean_batch_size}}
        return out

    assert_wrong(lesson05.check_window_tradeoff(swapped))
    assert_wrong(lesson05.check_window_tradeoff(lambda windows: {0.0: {}}), "one entry per window")


GOOD_ENSEMBLE = """
name: "banana_ensemble"
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "pre" model_version: -1
      input_map { key: "IN" value: "TEXT" } output_map { key: "OUT" value: "clean" } },
    { model_name: "modelA" model_version: -1
      input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "len" } },
    { model_name: "modelB" model_version: -1
      input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "a" } },
    { model_name: "combine" model_version: -1
      input_map [ { key: "LEN" value: "len" }, { key: "A" value: "a" } ]
      output_map { key: "OUT" value: "RESULT" } }
  ]
}
"""


def test_triton_ensemble_accepts_a_parallel_config_and_names_what_is_wrong_otherwise():
    assert lesson05.check_triton_ensemble(GOOD_ENSEMBLE).passed
    assert lesson05.check_triton_ensemble(lambda: GOOD_ENSEMBLE).passed
    assert lesson05.check_triton_ensemble("  ").status == "not done"
    typo = GOOD_ENSEMBLE.replace('{ key: "A" value: "a" }', '{ key: "A" value: "a_count" }')
    assert_wrong(lesson05.check_triton_ensemble(typo), "no step", "a_count")
    sequential = GOOD_ENSEMBLE.replace('input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "a" }',
                                       'input_map { key: "IN" value: "len" } output_map { key: "OUT" value: "a" }')
    assert_wrong(lesson05.check_triton_ensemble(sequential), "one after another", "pre -> modelA -> modelB -> combine")
    assert_wrong(lesson05.check_triton_ensemble(GOOD_ENSEMBLE.replace('platform: "ensemble"', "")), "platform")
    misspelt = GOOD_ENSEMBLE.replace("max_batch_size: 8", "max_batch_sise: 8")
    assert_wrong(lesson05.check_triton_ensemble(misspelt), "model 'banana_ensemble'", "field max_batch_sise")
    looped = GOOD_ENSEMBLE.replace('input_map { key: "IN" value: "TEXT" }', 'input_map { key: "IN" value: "RESULT" }')
    assert_wrong(lesson05.check_triton_ensemble(looped), "not a DAG", "cycle")


# --- 07 · Real serving frameworks ---------------------------------------------------------------------------


def test_ensemble_on_triton_refuses_a_max_batch_size_above_its_models_before_any_server_starts():
    too_large = GOOD_ENSEMBLE.replace("max_batch_size: 8", f"max_batch_size: {2 * lesson07.BANANA_MAX_BATCH}")
    assert_wrong(lesson07.check_ensemble_on_triton(too_large), f"max_batch_size {2 * lesson07.BANANA_MAX_BATCH}",
                 f"the {lesson07.BANANA_MAX_BATCH} each of the four models allows")


def test_batching_where_it_pays_rejects_batching_everywhere_a_rule_of_thumb_and_milliseconds():
    def everywhere(profiles):
        return {name: {"max_batch_size": 16, "max_wait": 0.0} for name in profiles}

    def fixed_cost_dominates(profiles):  # alpha > beta: right nearly always, wrong just above alpha = beta
        return {n: {"max_batch_size": 16, "max_wait": 0.0} for n, (a, b) in profiles.items() if a > b}

    def window_in_ms(profiles):
        return {n: {"max_batch_size": 16, "max_wait": 2.0} for n, (a, b) in profiles.items()
                if 16 * (a + b) / (a + 16 * b) >= 2}

    assert_wrong(lesson07.check_batching_where_it_pays(everywhere), "tokenize", "leave it at 1")
    assert_wrong(lesson07.check_batching_where_it_pays(fixed_cost_dominates), "x (α=1.1 ms", "only 1.96x")
    assert_wrong(lesson07.check_batching_where_it_pays(window_in_ms), "seconds")

    def half_batches(profiles):  # the exercise asks for batches of 16; 8 halves what batching buys
        return {n: {"max_batch_size": 8, "max_wait": 0.0} for n, (a, b) in profiles.items()
                if 16 * (a + b) / (a + 16 * b) >= 2}

    def waits(profiles):  # a 2 ms window in seconds: a unit right, but not the max_wait of 0.0 asked for
        return {n: {"max_batch_size": 16, "max_wait": 0.002} for n, (a, b) in profiles.items()
                if 16 * (a + b) / (a + 16 * b) >= 2}

    assert_wrong(lesson07.check_batching_where_it_pays(half_batches), "max_batch_size 16, not 8")
    assert_wrong(lesson07.check_batching_where_it_pays(waits), "max_wait is 0.0", "0.002")
    assert_wrong(lesson07.check_batching_where_it_pays(lambda profiles: [("topic", 16)]), "return a dict")


def _three_models(length_deps=("tokenize",), merge_reads_length=True, format_words=True):
    import dataclasses

    from infergraph_lite.core.stage import Stage
    from infergraph_lite.lessons.examples import text_pipeline_stages

    stages = text_pipeline_stages()
    stages["length"] = (Stage(fn=lambda xs: [{"words": len(x) if isinstance(x, list) else 512} for x in xs]),
                        list(length_deps))
    merge, deps = stages["merge"]
    if merge_reads_length:
        merged = dataclasses.replace(merge, fn=lambda triples: [
            {"topic": t, "sentiment": s, "words": n["words"]} for t, s, n in triples])
        stages["merge"] = (merged, ["topic", "sentiment", "length"])
    form, deps = stages["format"]
    if format_words:
        stages["format"] = (dataclasses.replace(form, fn=lambda merged: [
            f"{text}, {m.get('words')} words" for text, m in zip(form.fn(merged), merged)]), deps)
    return stages


def test_third_model_checker_accepts_the_answer_and_names_each_wiring_mistake():
    assert lesson07.check_third_model(_three_models).passed
    assert_wrong(lesson07.check_third_model(lambda: _three_models(length_deps=["embed"])), "should read ['tokenize']")
    assert_wrong(lesson07.check_third_model(lambda: _three_models(merge_reads_length=False)),
                 "merge should read topic, sentiment and length")
    swapped = _three_models()
    merge, _ = swapped["merge"]
    swapped["merge"] = (merge, ["sentiment", "topic", "length"])  # the order merge's fn unpacks its triples in
    assert_wrong(lesson07.check_third_model(lambda: swapped), "in that order", "['sentiment', 'topic', 'length']")
    assert_wrong(lesson07.check_third_model(lambda: _three_models(format_words=False)), "should end with ', 6 words'")


SEQUENTIAL_5_4 = GOOD_ENSEMBLE.replace('input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "a" }',
                                       'input_map { key: "IN" value: "len" } output_map { key: "OUT" value: "a" }')


def test_ensemble_on_triton_names_wiring_that_does_not_match_the_graph_before_starting_a_server():
    assert_wrong(lesson07.check_ensemble_on_triton(SEQUENTIAL_5_4), "step 'modelB' reads 'len' from 'modelA'",
                 "depends on ['pre']")
    assert_wrong(lesson07.check_ensemble_on_triton(GOOD_ENSEMBLE.replace('"modelA"', '"model_a"')),
                 "'model_a', which is not a node of the graph")
    assert_wrong(lesson07.check_ensemble_on_triton(GOOD_ENSEMBLE.replace("max_batch_size: 8", "max_batch_sise: 8")),
                 "field max_batch_sise")


@pytest.mark.skipif(triton_available() is not None, reason="no Triton binary on this platform")
def test_ensemble_on_triton_reports_what_triton_said_when_it_refuses_to_load():
    wrong_type = GOOD_ENSEMBLE.replace('{ name: "RESULT" data_type: TYPE_STRING',
                                       '{ name: "RESULT" data_type: TYPE_INT64')
    assert_wrong(lesson07.check_ensemble_on_triton(wrong_type), "Triton refused to load it", "banana_ensemble")
