"""Every Stage field x every engine of the registry: mapped onto the engine's own setting, or refused by name
before anything starts.

Each engine's mapping is a pure function (nothing starts: no thread, no Ray, no cluster, no Triton), found in
:data:`~infergraph_lite.frameworks.registry.REGISTRY` (``EngineEntry.stage_settings``): GraphServer's and Dask's
``from_stage``, Ray Serve's ``ray.options.from_stage`` and Triton's ``config_from_stage`` (a ``ModelConfig``
protobuf message).  A row either checks the engine's setting or
expects an :class:`UnsupportedStageFieldError` naming the engine, the stage and the field.  A new
``Stage`` field fails :func:`test_every_stage_field_has_a_row` until every engine maps or refuses it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import STAGE_FIELDS, Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks import triton
from infergraph_lite.frameworks.registry import REGISTRY, stage_graph_engines


def fn(items: list[Any]) -> list[Any]:
    return list(items)


NAME = "topic"


# How each registered engine's own settings are read by the rows below (the mapping itself is the registry's).
def graph_server_settings(stage: Stage) -> dict[str, Any]:
    return REGISTRY["GraphServer"].stage_settings(NAME, stage)


def ray_settings(stage: Stage) -> dict[str, Any]:
    served = REGISTRY["Ray Serve"].stage_settings(NAME, stage, num_cpus=0.5)
    return {"fn": served.fn, **served.options, "batch": served.batching}


def dask_settings(stage: Stage) -> dict[str, Any]:
    if REGISTRY["Dask"].available() is not None:
        pytest.skip(REGISTRY["Dask"].available())
    return {"task_fn": REGISTRY["Dask"].stage_settings(NAME, stage)}


def triton_settings(stage: Stage) -> Any:
    # Triton's mapping: a ModelConfig protobuf message (the schema Triton loads), or a refusal.
    return REGISTRY["Triton"].stage_settings(NAME, stage, inputs=[("embed", triton.TensorType.text())],
                                             output=(NAME, triton.TensorType.text()))


VIEWS: dict[str, Callable[[Stage], Any]] = {
    "GraphServer": graph_server_settings,
    "Ray Serve": ray_settings,
    "Dask": dask_settings,
    "Triton": triton_settings,
}
# Every engine of the registry that serves a stage graph, with the name its refusals give.
ENGINES: dict[str, tuple[str, Callable[[Stage], Any]]] = {
    name: (entry.name, VIEWS[name]) for name, entry in stage_graph_engines().items() if name in VIEWS}

REFUSED = "refused"  # the engine must raise UnsupportedStageFieldError(engine, stage, field, ...)


# (field, the stage, {engine: a check of its settings, or REFUSED}); a row may give one engine its own stage.
ROWS: list[tuple[str, Stage, dict[str, Any], dict[str, Stage]]] = [
    ("service_time", Stage(fn=fn, service_time=0.5), {
        # Not a setting of a real engine (the simulator's prediction): the settings are those without it.
        "GraphServer": lambda s: s == graph_server_settings(Stage(fn=fn)),
        "Ray Serve": lambda s: s == ray_settings(Stage(fn=fn)),
        "Dask": lambda s: s == dask_settings(Stage(fn=fn)),
        "Triton": lambda s: s == triton_settings(Stage(fn=fn)),
    }, {}),
    ("max_batch_size", Stage(fn=fn, max_batch_size=16), {
        "GraphServer": lambda s: s["max_batch_size"] == 16,
        "Ray Serve": lambda s: s["batch"]["max_batch_size"] == 16 and s["max_ongoing_requests"] >= 16,
        "Dask": REFUSED,
        "Triton": lambda s: s.max_batch_size == 16 and s.HasField("dynamic_batching"),
    }, {}),
    ("max_batch_size", Stage(fn=fn, max_batch_size=None), {
        "GraphServer": lambda s: s["max_batch_size"] is None,
        "Ray Serve": REFUSED,
        "Dask": REFUSED,
        "Triton": REFUSED,
    }, {}),
    ("max_batch_size", Stage(fn=fn, max_batch_size=AIMD(1.0, max_size=32)), {
        "GraphServer": lambda s: isinstance(s["max_batch_size"], AIMD),
        "Ray Serve": REFUSED,
        "Dask": REFUSED,
        "Triton": REFUSED,
    }, {}),
    ("max_wait", Stage(fn=fn, max_batch_size=8, max_wait=0.002), {
        "GraphServer": lambda s: s["max_wait"] == 0.002,
        "Ray Serve": lambda s: s["batch"]["batch_wait_timeout_s"] == 0.002,
        "Dask": REFUSED,
        "Triton": lambda s: s.dynamic_batching.max_queue_delay_microseconds == 2000,
    }, {"Dask": Stage(fn=fn, max_wait=0.002)}),  # Dask refuses any batching: the wait alone shows the max_wait row
    ("replicas", Stage(fn=fn, replicas=3), {
        "GraphServer": lambda s: s["replicas"] == 3,
        "Ray Serve": lambda s: s["num_replicas"] == 3,
        "Dask": REFUSED,
        "Triton": lambda s: [g.count for g in s.instance_group] == [3],
    }, {}),
    ("fn", Stage(fn=fn), {
        "GraphServer": lambda s: s["batch_fn"] is fn,
        "Ray Serve": lambda s: s["fn"] is fn,
        "Dask": lambda s: s["task_fn"] is fn,
        # A Python-backend model: its model.py rebuilds the graph with the repository's factory and runs fn.
        "Triton": lambda s: s.backend == "python",
    }, {}),
    ("max_queue_size", Stage(fn=fn, max_queue_size=50), {
        "GraphServer": lambda s: s["max_queue_size"] == 50,
        "Ray Serve": lambda s: s["max_queued_requests"] == 50,
        "Dask": REFUSED,
        # Triton's own bound: dynamic_batching { default_queue_policy { max_queue_size } }.
        "Triton": lambda s: s.dynamic_batching.default_queue_policy.max_queue_size == 50,
    }, {}),
]

def _row_id(field: str, stage: Stage) -> str:
    value = getattr(stage, field)
    if isinstance(value, AIMD):
        return "AIMD"
    return "fn" if callable(value) else str(value)


CASES = []
for field, stage, expected, own in ROWS:
    for engine, check in expected.items():
        CASES.append(pytest.param(engine, field, own.get(engine, stage), check,
                                  id=f"{engine}-{field}={_row_id(field, stage)}"))


@pytest.mark.parametrize(("engine", "field", "stage", "check"), CASES)
def test_each_field_is_mapped_or_refused_by_name(engine, field, stage, check):
    name, settings = ENGINES[engine]
    if check is REFUSED:
        with pytest.raises(UnsupportedStageFieldError) as refused:
            settings(stage)
        error = refused.value
        assert (error.engine, error.stage, error.field) == (name, NAME, field)
        assert error.value == getattr(stage, field) or isinstance(error.value, AIMD)
        assert name in str(error) and repr(NAME) in str(error) and field in str(error)
    else:
        assert check(settings(stage)), f"{engine} did not map {field}={getattr(stage, field)!r}"


def test_every_registered_stage_graph_engine_has_a_column():
    # A new entry in the registry fails here until its settings can be read and every row says what it does.
    assert set(VIEWS) == set(stage_graph_engines())


def test_the_registry_says_which_fields_each_engine_maps_as_the_rows_show():
    # A field the registry lists is mapped for at least one value other than its default; any other field is
    # refused at every such value.
    defaults = Stage(fn=fn)
    for engine, entry in stage_graph_engines().items():
        for field in STAGE_FIELDS:
            rows = [(own.get(engine, stage), expected[engine]) for f, stage, expected, own in ROWS if f == field]
            moved = [check for stage, check in rows if getattr(stage, field) != getattr(defaults, field)]
            if field in entry.fields:
                assert any(check is not REFUSED for check in moved) or field == "fn", (engine, field)
            elif field != "service_time":  # not a setting of any real engine: neither mapped nor refused
                assert moved and all(check is REFUSED for check in moved), (engine, field)


def test_every_stage_field_has_a_row_for_every_engine():
    assert set(STAGE_FIELDS) == {f.name for f in dataclasses.fields(Stage)}
    assert {field for field, *_ in ROWS} == set(STAGE_FIELDS)
    for field, _, expected, _ in ROWS:
        assert set(expected) == set(ENGINES), f"row {field}: every engine maps or refuses it"


DEFAULTS = {  # a Stage with every default: no batching, one replica, no queue bound, on every engine
    "GraphServer": lambda s: (s["max_batch_size"], s["replicas"], s["max_queue_size"]) == (1, 1, None),
    "Ray Serve": lambda s: s["batch"] is None and s["num_replicas"] == 1 and s["max_queued_requests"] == -1,
    "Dask": lambda s: s["task_fn"] is fn,
    "Triton": lambda s: s.max_batch_size == 1 and not s.HasField("dynamic_batching")
                        and [g.count for g in s.instance_group] == [1],
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_stage_with_defaults_works_everywhere(engine):
    assert DEFAULTS[engine](ENGINES[engine][1](Stage(fn=fn)))
