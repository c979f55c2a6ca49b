"""Every engine of the registry: it is an Engine (protocol and signatures), its old import paths still work, and,
started, it answers, listens on loopback only and leaves no process behind.

The engines come from :data:`~infergraph_lite.frameworks.registry.REGISTRY`; the only table here is how to
build each one's small example, and a registered engine without one fails
:func:`test_every_registered_engine_has_an_example`.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from infergraph_lite.frameworks.engine import Engine, protocol_problems
from infergraph_lite.frameworks.registry import REGISTRY, stage_graph_engines
from tests.proc_sockets import descendants, listening, not_loopback
from tests.stage_fns import two_stages

TEXT = {"text": "  BANANA  "}


def tiny_model() -> Any:
    from infergraph_lite.frameworks.llamacpp import write_tiny_llama

    return write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512, seed=0)


# name -> (the build arguments, made when needed; the request; a check of the answer)
EXAMPLES: dict[str, tuple[Callable[[], tuple[tuple[Any, ...], dict[str, Any]]], Any, Callable[[Any], bool]]] = {
    "GraphServer": (lambda: ((two_stages(), ["text"]), {}), TEXT, lambda answer: answer["n"] == 6),
    "Triton": (lambda: ((two_stages(), ["text"]), {"factory": "tests.stage_fns:two_stages", "example": TEXT}),
               TEXT, lambda answer: int(answer["n"]) == 6),
    "Ray Serve": (lambda: ((two_stages(), ["text"]), {"num_cpus": 2}), TEXT, lambda answer: answer["n"] == 6),
    "Dask": (lambda: ((two_stages(), ["text"]), {"n_workers": 1}), TEXT, lambda answer: answer["n"] == 6),
    "llama.cpp": (lambda: ((tiny_model(),), {"n_parallel": 1, "client_options": {"n_predict": 4}}),
                  "Once upon a time", lambda completion: completion.n_tokens == 4),
}
# Ray's start takes tens of seconds on 2 cores: its case carries the ray mark, as tests/test_ray_serve.py's do.
NAMES = [pytest.param(name, marks=pytest.mark.ray) if name == "Ray Serve" else name for name in REGISTRY]


def available(name: str) -> None:
    reason = REGISTRY[name].available()
    if reason is not None:
        pytest.skip(reason)


def test_every_registered_engine_has_an_example():
    assert set(EXAMPLES) == set(REGISTRY)


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registered_engine_satisfies_the_engine_protocol(name):
    available(name)
    engine_type = REGISTRY[name].engine_type()
    assert protocol_problems(engine_type) == []
    make, _, _ = EXAMPLES[name]
    args, options = make()
    engine = REGISTRY[name].build(*args, **options)  # built, not started: nothing runs yet
    assert isinstance(engine, Engine)
    assert engine.started_pids() == []


@pytest.mark.parametrize("name", list(stage_graph_engines()))
def test_an_entry_is_named_as_its_engine_names_itself_in_a_refusal(name):
    module = importlib.import_module(REGISTRY[name].stage_options.partition(":")[0])
    assert name == module.ENGINE


def test_the_registry_and_the_framework_folders_import_no_framework():
    # A fresh interpreter: what `import infergraph_lite` and the light parts of each folder load.
    code = ("import sys, infergraph_lite, infergraph_lite.frameworks.registry, infergraph_lite.frameworks.engine\n"
            "from infergraph_lite.frameworks import dask, llamacpp, ray, triton\n"
            "from infergraph_lite.frameworks.ray import from_stage\n"
            "from infergraph_lite.frameworks.dask import from_stage\n"
            "[e.available() for n, e in infergraph_lite.frameworks.registry.REGISTRY.items() if n != 'Triton']\n"
            "print(sorted(m for m in ('ray', 'dask', 'distributed', 'tritonclient', 'openai', 'xllamacpp', 'scipy')"
            " if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


# The module paths before issue 36's move: each is a shim whose every public name is the real one.
OLD_PATHS = {
    "ray_serve": ["infergraph_lite.frameworks.ray.serve"],
    "ray_serve_options": ["infergraph_lite.frameworks.ray.options"],
    "ray_node": ["infergraph_lite.frameworks.ray.node"],
    "dask_graph": ["infergraph_lite.frameworks.dask.graph", "infergraph_lite.frameworks.dask.cluster"],
    "llamacpp_client": ["infergraph_lite.frameworks.llamacpp.client"],
    "llamacpp_model": ["infergraph_lite.frameworks.llamacpp.model"],
    "llamacpp_profile": ["infergraph_lite.frameworks.llamacpp.profile"],
    "llamacpp_serve": ["infergraph_lite.frameworks.llamacpp.serve"],
    "llamacpp_server": ["infergraph_lite.frameworks.llamacpp.server"],
}


@pytest.mark.parametrize("old", list(OLD_PATHS))
def test_every_name_of_a_moved_module_is_still_importable_from_its_old_path(old):
    shim = importlib.import_module(f"infergraph_lite.frameworks.{old}")
    for home in map(importlib.import_module, OLD_PATHS[old]):
        for name in [n for n in vars(home) if not n.startswith("_")]:
            assert getattr(shim, name) is getattr(home, name), (old, name)
    assert all(hasattr(shim, name) for name in shim.__all__)


def test_the_old_llamacpp_serve_path_still_runs_as_a_script():
    # An older parent starts the child as `python -m infergraph_lite.frameworks.llamacpp_serve`: it must still
    # be the child's main (here it fails on a missing model file, and says so, instead of importing nothing).
    done = subprocess.run([sys.executable, "-m", "infergraph_lite.frameworks.llamacpp_serve",
                           '{"model": "no-such.gguf", "n_ctx": 256, "n_parallel": 1, "n_batch": 64, "n_ubatch": 64,'
                           ' "cont_batching": true, "threads": 1, "port": 0}'],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout.startswith("FAILED"), (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize("name", NAMES)
def test_each_engine_answers_on_loopback_only_and_leaves_nothing(name):
    available(name)
    make, request, check = EXAMPLES[name]
    args, options = make()
    engine = REGISTRY[name].build(*args, **options)
    try:
        engine.start()
        assert check(engine.submit(request).result(timeout=120))
        pids = engine.started_pids()
        entries = listening([os.getpid(), *descendants(os.getpid())])
        assert not_loopback(entries) == [], f"{name}: a process we started listens beyond 127.0.0.1"
        assert isinstance(engine.statistics(), dict)
    finally:
        engine.close(timeout=60)
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == [] and engine.started_pids() == []
