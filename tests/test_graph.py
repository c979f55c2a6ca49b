"""graph.py: validation and every error message, cycles, levels, topological order, critical path."""

from __future__ import annotations

import graphlib
import math

import pytest

from infergraph_lite import (
    CycleError,
    GraphError,
    InvalidNodeError,
    MissingDependencyError,
    MissingInputError,
    NameConflictError,
    critical_path,
    find_cycle,
    levels,
    prepare,
    run_graph,
    run_plan,
    run_plan_parallel,
    topological_order,
    validate_graph,
)
from infergraph_lite.core.graph import Countdown
from tests.graphs import BANANA_INPUTS, banana_nodes


def chain(n: int, reverse: bool = False) -> dict:
    nodes = {f"n{i}": (len, [f"n{i - 1}" if i else "x"]) for i in range(n)}
    return dict(reversed(nodes.items())) if reverse else nodes


# --- validation ----------------------------------------------------------------------------------


def test_every_graph_error_is_a_value_error_so_the_seeds_except_still_works():
    for cls in (CycleError, MissingDependencyError, NameConflictError, InvalidNodeError):
        assert issubclass(cls, GraphError) and issubclass(cls, ValueError)


def test_missing_dependency_names_the_node_and_the_missing_names():
    nodes = {"combine": (max, ["modelA", "modelC", "modelD"]), "modelA": (len, ["text"])}
    with pytest.raises(MissingDependencyError) as info:
        validate_graph(nodes, inputs=["text"])
    assert info.value.node == "combine"
    assert info.value.missing == ["modelC", "modelD"]
    assert str(info.value) == (
        "node 'combine' depends on 'modelC', 'modelD', which are neither nodes nor inputs"
    )


def test_an_input_that_is_not_given_is_a_missing_dependency():
    with pytest.raises(MissingDependencyError, match="node 'pre' depends on 'text'"):
        validate_graph(banana_nodes(), inputs={})


def test_cycle_error_carries_the_cycle_in_data_flow_order():
    nodes = {"a": (len, ["c"]), "b": (len, ["a"]), "c": (len, ["b"]), "d": (len, ["a"])}
    with pytest.raises(CycleError) as info:
        validate_graph(nodes)
    assert info.value.cycle == ["a", "b", "c"]
    assert str(info.value) == "cycle: a -> b -> c -> a"


def test_self_dependency_is_a_cycle_of_one():
    with pytest.raises(CycleError, match=r"^cycle: loop -> loop$"):
        validate_graph({"loop": (len, ["loop"])})


def test_name_used_as_input_and_node_is_rejected():
    with pytest.raises(NameConflictError, match="'text' is both an input and a node") as info:
        validate_graph({"text": (str.upper, [])}, inputs={"text": "hi"})
    assert info.value.node == "text"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (len, r"node 'bad': expected \(func, \[dependency names\]\), got <built-in function len>"),
        ((len,), r"node 'bad': expected \(func, \[dependency names\]\)"),
        ((len, ["x"], "extra"), r"node 'bad': expected \(func, \[dependency names\]\)"),
        ((len, "x"), r"node 'bad': dependencies must be a list of names, got the string 'x'; write \['x'\]"),
        ((len, {"x"}), r"node 'bad': dependencies must be a list of names, got \{'x'\}"),
        ((len, [1]), r"node 'bad': dependency names must be strings, got 1"),
        ((len, [["x"]]), r"node 'bad': dependency names must be strings, got \['x'\]"),
        (("len", ["x"]), r"node 'bad': func must be callable, got str 'len'"),
    ],
)
def test_malformed_entries_are_rejected_naming_the_entry(entry, message):
    with pytest.raises(InvalidNodeError, match=message) as info:
        validate_graph({"ok": (len, ["x"]), "bad": entry}, inputs=["x"])
    assert info.value.node == "bad"


def test_non_string_node_name_is_rejected():
    with pytest.raises(InvalidNodeError, match="node names must be strings, got int"):
        validate_graph({3: (len, [])})


def test_non_mapping_graph_and_string_inputs_are_rejected():
    with pytest.raises(TypeError, match="nodes must be a mapping"):
        validate_graph([("a", (len, []))])
    with pytest.raises(TypeError, match="not the string 'text'"):
        validate_graph(banana_nodes(), inputs="text")


def test_non_callable_func_is_allowed_when_only_the_shape_matters():
    # The simulator puts a stage spec where the function goes.
    graph = validate_graph({"stage": ({"service_time": 1.0}, ["x"])}, ["x"], require_callable=False)
    assert graph["stage"] == ({"service_time": 1.0}, ("x",))


def test_validation_reports_the_most_basic_problem_first():
    # A malformed entry is reported even though a cycle exists as well.
    with pytest.raises(InvalidNodeError):
        validate_graph({"a": (len, ["b"]), "b": (len, ["a"]), "c": (len, "a")})


# --- find_cycle -----------------------------------------------------------------------------------


def test_find_cycle_none_on_a_dag_and_ignores_inputs():
    assert find_cycle(banana_nodes()) is None
    assert find_cycle({}) is None


def test_find_cycle_rotates_to_the_smallest_name_whatever_the_dict_order():
    a = {"z": (len, ["y"]), "y": (len, ["m"]), "m": (len, ["z"])}
    b = dict(reversed(a.items()))
    assert find_cycle(a) == find_cycle(b) == ["m", "y", "z"]  # y uses m, z uses y, m uses z


def test_find_cycle_handles_long_chains_without_recursion():
    nodes = chain(50_000)
    nodes["n0"] = (len, ["n49999"])
    cycle = find_cycle(nodes)
    assert cycle is not None and len(cycle) == 50_000 and cycle[0] == "n0"


# --- topological order and levels ----------------------------------------------------------------


def test_topological_order_respects_dependencies_and_dict_order_breaks_ties():
    order = topological_order(banana_nodes(), BANANA_INPUTS)
    assert order == ["pre", "modelA", "modelB", "combine"]


def test_topological_order_agrees_with_graphlib():
    nodes = chain(30, reverse=True)
    order = topological_order(nodes, ["x"])
    sorter = graphlib.TopologicalSorter({n: [d for d in deps if d in nodes] for n, (_, deps) in nodes.items()})
    assert order == list(sorter.static_order())


def test_levels_of_the_seed_example():
    assert levels(banana_nodes(), BANANA_INPUTS) == [["pre"], ["modelA", "modelB"], ["combine"]]


def test_levels_put_a_node_one_past_its_deepest_dependency():
    nodes = {"a": (len, ["x"]), "b": (len, ["a"]), "c": (len, ["a", "b"]), "d": (len, ["x"])}
    assert levels(nodes, ["x"]) == [["a", "d"], ["b"], ["c"]]


def test_levels_validate_first():
    with pytest.raises(CycleError):
        levels({"a": (len, ["b"]), "b": (len, ["a"])})
    assert levels({}) == []


# --- critical path --------------------------------------------------------------------------------


def test_critical_path_of_a_diamond():
    durations = {"pre": 1.0, "modelA": 5.0, "modelB": 2.0, "combine": 0.5}
    assert critical_path(banana_nodes(), durations) == (["pre", "modelA", "combine"], 6.5)


def test_critical_path_accepts_a_function_and_breaks_ties_alphabetically():
    path, total = critical_path(banana_nodes(), lambda name: 1.0)
    assert (path, total) == (["pre", "modelA", "combine"], 3.0)


def test_critical_path_of_independent_nodes_is_the_longest_one():
    nodes = {"a": (len, []), "b": (len, []), "c": (len, [])}
    assert critical_path(nodes, {"a": 1, "b": 3, "c": 2}) == (["b"], 3.0)
    assert critical_path({}, {}) == ([], 0.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan])
def test_critical_path_rejects_negative_or_nan_durations_naming_the_node(bad):
    with pytest.raises(ValueError, match=r"duration of node 'modelB' must be >= 0"):
        critical_path(banana_nodes(), {"pre": 1, "modelA": 1, "modelB": bad, "combine": 1})


def test_critical_path_names_a_node_without_a_duration():
    with pytest.raises(ValueError, match="durations has no entry for node 'combine'"):
        critical_path(banana_nodes(), {"pre": 1, "modelA": 1, "modelB": 1})


# --- the prepared Plan ------------------------------------------------------------------------------------


def test_prepare_once_run_many_times_with_the_same_answers_as_run_graph():
    plan = prepare(banana_nodes(), ["text"])
    assert plan.order == ["pre", "modelA", "modelB", "combine"]
    assert plan.levels == [["pre"], ["modelA", "modelB"], ["combine"]]
    assert plan.dependents["pre"] == ["modelA", "modelB"] and plan.in_degree["combine"] == 2
    for text in ["  BANANA  ", "Alfalfa", ""]:
        assert run_plan(plan, {"text": text}) == run_graph(banana_nodes(), {"text": text})
        assert run_plan_parallel(plan, {"text": text}, max_workers=2) == run_plan(plan, {"text": text})


def test_a_plan_refuses_a_run_that_lacks_an_input_or_shadows_a_node():
    plan = prepare(banana_nodes(), ["text"])
    with pytest.raises(MissingInputError, match="input 'text' was not given; the graph reads it"):
        run_plan(plan, {"txt": "typo"})
    with pytest.raises(NameConflictError, match="'pre' is both an input and a node"):
        run_plan(plan, {"text": "x", "pre": "y"})


def test_levels_order_and_critical_path_all_come_from_one_plan():
    plan = prepare(banana_nodes(), ["text"])
    durations = {"pre": 1.0, "modelA": 5.0, "modelB": 2.0, "combine": 0.5}
    assert plan.critical_path(durations) == critical_path(banana_nodes(), durations) == (["pre", "modelA",
                                                                                          "combine"], 6.5)
    assert plan.levels == levels(banana_nodes(), ["text"]) and plan.order == topological_order(banana_nodes(),
                                                                                                ["text"])


def test_countdown_releases_a_node_after_its_last_dependency_even_one_listed_twice():
    plan = prepare({"a": (len, ["x"]), "b": (len, ["x"]), "c": (max, ["a", "b", "a"]), "d": (len, ["c"])}, ["x"])
    countdown = Countdown(plan)
    assert countdown.first() == ["a", "b"] and countdown.left == 4
    assert countdown.done("a") == []  # c still waits for b
    assert countdown.done("b") == ["c"]
    assert countdown.done("c") == ["d"] and countdown.done("d") == [] and countdown.left == 0
    with pytest.raises(ValueError, match="'zz' is not a node"):
        countdown.done("zz")
    assert Countdown(plan).first() == ["a", "b"], "each run counts down on its own copy"
