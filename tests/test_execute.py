"""execute.py and original.py: results, errors, and the parallel executor's guarantees."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from infergraph_lite import (
    CycleError,
    MissingDependencyError,
    NodeError,
    TraceEvent,
    run_graph,
    run_graph_parallel,
)
from infergraph_lite.lessons.original import run_graph_original
from tests.graphs import BANANA_INPUTS, banana_nodes

EXECUTORS = [run_graph, run_graph_parallel]


@pytest.mark.parametrize("run", [*EXECUTORS, run_graph_original])
def test_seed_example_gives_the_seeds_answer(run):
    result = run(banana_nodes(), BANANA_INPUTS)
    assert result["combine"] == {"len": 6, "a_count": 3}
    assert result["text"] == "  BANANA  " and result["pre"] == "banana"
    assert list(result) == ["text", "pre", "modelA", "modelB", "combine"]


@pytest.mark.parametrize("run", EXECUTORS)
def test_dependencies_are_passed_in_the_order_listed_even_when_repeated(run):
    nodes = {"a": (lambda: "A", []), "b": (lambda: "B", []), "cat": (lambda *s: "".join(s), ["b", "a", "b"])}
    assert run(nodes, {})["cat"] == "BAB"


@pytest.mark.parametrize("run", EXECUTORS)
def test_empty_graph_returns_a_copy_of_the_inputs(run):
    inputs = {"x": 1}
    result = run({}, inputs)
    assert result == {"x": 1} and result is not inputs


@pytest.mark.parametrize("run", EXECUTORS)
def test_a_bad_graph_runs_nothing(run):
    calls = []
    nodes = {
        "first": (lambda: calls.append("first"), []),
        "loop_a": (lambda b: calls.append("a"), ["loop_b"]),
        "loop_b": (lambda a: calls.append("b"), ["loop_a"]),
    }
    with pytest.raises(CycleError, match="cycle: loop_a -> loop_b -> loop_a"):
        run(nodes, {})
    nodes = {"first": (lambda: calls.append("first"), []), "late": (len, ["nowhere"])}
    with pytest.raises(MissingDependencyError):
        run(nodes, {})
    assert calls == []


@pytest.mark.parametrize("run", EXECUTORS)
def test_a_failing_node_becomes_node_error_with_the_cause(run):
    nodes = banana_nodes()
    nodes["modelB"] = (lambda s: 1 / 0, ["pre"])
    with pytest.raises(NodeError, match=r"node 'modelB' failed: ZeroDivisionError: division by zero") as info:
        run(nodes, BANANA_INPUTS)
    assert info.value.node == "modelB"
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert isinstance(info.value, RuntimeError)


def test_original_loop_reports_cycles_vaguely_which_is_why_it_was_replaced():
    with pytest.raises(ValueError, match=r"^Cycle or missing dependency$"):
        run_graph_original({"a": (len, ["b"]), "b": (len, ["a"])}, {})


# --- the parallel executor ------------------------------------------------------------------------


def test_parallel_runs_independent_sleeps_at_the_same_time():
    nodes = {f"s{i}": (lambda: time.sleep(0.2), []) for i in range(4)}
    trace: list[TraceEvent] = []
    run_graph_parallel(nodes, {}, max_workers=4, trace=trace)
    # No wall-clock limit (machines are noisy): every sleep starts before any of them has ended.
    assert len(trace) == 4 and max(e.start for e in trace) < min(e.end for e in trace)
    assert len({e.thread for e in trace}) == 4


def test_parallel_starts_a_node_when_its_last_dependency_ends_not_when_its_level_ends():
    nodes = {
        "fast": (lambda: time.sleep(0.01), []),
        "slow": (lambda: time.sleep(0.3), []),
        "after_fast": (lambda _: time.sleep(0.01), ["fast"]),  # level 1, like nothing in level 0 waits for
    }
    trace: list[TraceEvent] = []
    run_graph_parallel(nodes, {}, max_workers=3, trace=trace)
    by_node = {e.node: e for e in trace}
    assert by_node["after_fast"].start < by_node["slow"].end


def test_parallel_trace_has_one_event_per_node_in_time_order_of_dependencies():
    trace: list[TraceEvent] = []
    run_graph_parallel(banana_nodes(), BANANA_INPUTS, max_workers=2, trace=trace)
    by_node = {e.node: e for e in trace}
    assert set(by_node) == {"pre", "modelA", "modelB", "combine"}
    assert by_node["modelA"].start >= by_node["pre"].end
    assert by_node["combine"].start >= max(by_node["modelA"].end, by_node["modelB"].end)
    assert all(e.thread.startswith("infergraph") and 0 <= e.start <= e.end for e in trace)


def test_parallel_failure_schedules_nothing_more_waits_for_running_and_leaves_no_thread():
    ran = []
    before = threading.active_count()

    def slow_sibling():
        time.sleep(0.2)
        ran.append("slow_sibling")

    nodes = {
        "boom": (lambda: (_ for _ in ()).throw(KeyError("weights")), []),
        "slow_sibling": (slow_sibling, []),
        "after_boom": (lambda _: ran.append("after_boom"), ["boom"]),
        "after_sibling": (lambda _: ran.append("after_sibling"), ["slow_sibling"]),
    }
    with pytest.raises(NodeError, match="node 'boom' failed: KeyError: 'weights'"):
        run_graph_parallel(nodes, {}, max_workers=2)
    assert ran == ["slow_sibling"]  # waited for; nothing downstream started
    assert threading.active_count() == before


@pytest.mark.parametrize("run", EXECUTORS)
def test_both_executors_pass_keyboard_interrupt_through_unwrapped_without_hanging(run):
    def interrupted():
        raise KeyboardInterrupt

    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        run({"stop": (interrupted, [])}, {})
    assert threading.active_count() == before  # the parallel executor joined its pool first


def test_parallel_with_one_worker_still_completes_a_wide_graph():
    nodes = {f"leaf{i}": (lambda i=i: i, []) for i in range(50)}
    nodes["total"] = (lambda *xs: sum(xs), list(nodes))
    assert run_graph_parallel(nodes, {}, max_workers=1)["total"] == sum(range(50))


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4"])
def test_parallel_rejects_bad_max_workers(bad):
    with pytest.raises(ValueError, match=re.escape(f"max_workers must be an integer >= 1 or None, got {bad!r}")):
        run_graph_parallel(banana_nodes(), BANANA_INPUTS, max_workers=bad)


def test_parallel_numpy_results_match_sequential():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((64, 64))
    nodes = {
        "left": (lambda x: x @ m, ["x"]),
        "right": (lambda x: x.T @ m, ["x"]),
        "sum": (np.add, ["left", "right"]),
    }
    inputs = {"x": rng.standard_normal((64, 64))}
    np.testing.assert_array_equal(run_graph(nodes, inputs)["sum"], run_graph_parallel(nodes, inputs)["sum"])


def test_parallel_can_reuse_a_callers_pool_and_leaves_it_running():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="server") as pool:
        trace: list[TraceEvent] = []
        for _ in range(3):  # many requests, one pool
            assert run_graph_parallel(banana_nodes(), BANANA_INPUTS, pool=pool, trace=trace)["combine"] == {
                "len": 6, "a_count": 3}
        assert {e.thread.split("_")[0] for e in trace} == {"server"}
        nodes = dict(banana_nodes(), modelB=(lambda s: 1 / 0, ["pre"]))
        with pytest.raises(NodeError, match="node 'modelB' failed"):
            run_graph_parallel(nodes, BANANA_INPUTS, pool=pool)
        assert pool.submit(lambda: "still serving").result() == "still serving"


def test_measure_node_durations_gives_every_node_a_median_and_rejects_bad_repeats():
    from infergraph_lite import measure_node_durations

    nodes = {"short": (lambda: time.sleep(0.005), []), "long": (lambda _: time.sleep(0.03), ["short"])}
    durations = measure_node_durations(nodes, {}, repeats=3)
    assert set(durations) == {"short", "long"} and durations["long"] > durations["short"] > 0
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        measure_node_durations(nodes, {}, repeats=0)
