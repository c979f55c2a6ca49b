"""Checkers for the exercises of notebook 07, *Real serving frameworks*; 7.1 loads the answer into a real Triton.

>>> check_ensemble_on_triton("  ").status
'not done'
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from infergraph_lite.core.stage import Stage
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require, require_count, require_number
from infergraph_lite.frameworks.triton import (
    TritonConfigError,
    TritonServer,
    TritonStartError,
    ensemble_to_graph,
    run_stages_once,
    to_model_repository,
    triton_available,
)
from infergraph_lite.lessons.examples import BANANA_INPUTS
from infergraph_lite.lessons.models import tokenize

__all__ = ["BANANA_FACTORY", "BANANA_MAX_BATCH", "BANANA_MODEL_SECONDS", "banana_stages_for_triton",
           "check_batching_where_it_pays", "check_ensemble_on_triton", "check_third_model"]

BANANA_MODEL_SECONDS = 0.1
"""How long modelA and modelB of :func:`banana_stages_for_triton` take per call, in seconds."""

BANANA_MAX_BATCH = 64
"""The ``max_batch_size`` of each of the four models: Triton refuses an ensemble that allows more."""

# The factory Triton's model processes import to rebuild exercise 7.1's graph (module:function).
BANANA_FACTORY = "infergraph_lite.exercises.lesson07:banana_stages_for_triton"


def banana_stages_for_triton() -> dict[str, tuple[Stage, list[str]]]:
    """The seed's graph as batch functions for exercise 07.1; modelA and modelB each take 0.1 s per call.

    The wait makes it measurable whether Triton ran the two models at the same time.  A zero-argument
    factory, so Triton's model processes can rebuild it from :data:`BANANA_FACTORY`.
    """
    def slow(count: Callable[[str], int]) -> Callable[[list], list]:
        def model(batch: list) -> list:
            time.sleep(BANANA_MODEL_SECONDS)
            return [count(text) for text in batch]
        return model

    most = BANANA_MAX_BATCH
    return {
        "pre": (Stage(fn=lambda texts: [t.strip().lower() for t in texts], max_batch_size=most), ["text"]),
        "modelA": (Stage(fn=slow(len), max_batch_size=most), ["pre"]),
        "modelB": (Stage(fn=slow(lambda s: s.count("a")), max_batch_size=most), ["pre"]),
        "combine": (Stage(fn=lambda pairs: [{"len": n, "a_count": a} for n, a in pairs], max_batch_size=most),
                    ["modelA", "modelB"]),
    }


@checker
def check_ensemble_on_triton(config: str | Callable[[], str]) -> str:
    """Exercise 07.1 (5.4 for real): the learner's ensemble, loaded into a running Triton and queried.

    The members are the seed's four nodes, generated with the tensor names the ensemble uses, each with
    ``max_batch_size`` :data:`BANANA_MAX_BATCH`: Triton refuses to load an ensemble whose ``max_batch_size`` is
    larger than a member's, so that is checked first.  Checks the answer for two texts and that modelA and modelB
    ran at the same time (each takes 0.1 s).
    """
    config_text = config() if callable(config) else config
    if not config_text.strip():
        raise NotImplementedError("write the config.pbtxt of the ensemble as a string")
    try:
        graph = ensemble_to_graph(config_text)
    except TritonConfigError as err:
        raise WrongAnswer(str(err)) from None
    batch = graph.config.max_batch_size
    require(batch <= BANANA_MAX_BATCH,
            f"max_batch_size {batch} is larger than the {BANANA_MAX_BATCH} each of the four models allows: Triton "
            "refuses to load an ensemble whose max_batch_size is larger than one of its models'")
    unavailable = triton_available()
    with tempfile.TemporaryDirectory(prefix="infergraph-check-") as folder:
        try:
            to_model_repository(banana_stages_for_triton(), Path(folder), example=BANANA_INPUTS, ensemble=config_text,
                                factory=BANANA_FACTORY)
        except TritonConfigError as err:
            raise WrongAnswer(f"{err} (the models are the seed's pre, modelA, modelB and combine)") from None
        if unavailable is not None:
            return f"the ensemble is well formed (waves {graph.levels}); not run, as Triton cannot run here: " + \
                unavailable
        try:
            server = TritonServer(folder, timeout=90).start()
        except TritonStartError as err:
            raise WrongAnswer(f"Triton refused to load it: {err}") from None
        try:
            with server.client() as client:
                client.model = graph.name
                answers = {}
                for text in (BANANA_INPUTS["text"], "Alfalfa"):
                    (value,) = client.infer({"text": text}).values()
                    answers[text] = json.loads(value) if isinstance(value, str) else value
                before = client.statistics()
                started = time.perf_counter()
                client.infer({"text": "banana split"})
                one_request = time.perf_counter() - started
                stats = {name: s - before[name] for name, s in client.statistics().items()}
        finally:
            server.stop()
    require(answers[BANANA_INPUTS["text"]] == {"len": 6, "a_count": 3},
            f"for '  BANANA  ' the ensemble answered {answers[BANANA_INPUTS['text']]!r}, expected "
            "{'len': 6, 'a_count': 3}")
    require(answers["Alfalfa"] == {"len": 7, "a_count": 3}, f"for 'Alfalfa' it answered {answers['Alfalfa']!r}")
    branches = stats["modelA"].request_time + stats["modelB"].request_time
    # Run one after the other, the two models add up to 0.2 s; at the same time, about 0.1 s.  0.8 of the sum
    # leaves room for Triton's hops on a busy machine and is still well short of running them in turn.
    require(one_request < 0.8 * branches, f"one request took {one_request:.2f} s, more than 0.8 of modelA and modelB "
                                          f"added up ({branches:.2f} s): they did not run at the same time")
    return ("Triton loaded your ensemble and answered both texts correctly, and one request took less than 0.8 of "
            "modelA and modelB added up: they ran in parallel.")  # no timings: this line is a stored output


def _batching_gain(alpha: float, beta: float, b: int = 16) -> float:
    # How many times the capacity grows from batches of 1 to batches of b, with s(b) = alpha + beta * b.
    return b * (alpha + beta) / (alpha + beta * b)


@checker
def check_batching_where_it_pays(choose_batching: Callable[[dict], dict]) -> str:
    """Exercise 07.2: dynamic batching on exactly the stages where batches of 16 at least double capacity."""
    cases = [
        {"tokenize": (0.0, 0.02), "embed": (0.05, 0.08), "topic": (12.0, 0.2), "sentiment": (12.0, 0.2),
         "merge": (0.0, 0.01), "format": (0.0, 0.01)},
        {"decode": (0.2, 0.5), "detector": (8.0, 1.5), "ranker": (3.0, 0.1), "post": (0.01, 0.02)},
        {"a": (1.0, 1.0), "b": (2.0, 0.5), "c": (0.5, 2.0), "x": (1.1, 1.0), "y": (1.2, 1.0)},
    ]
    for profiles in cases:
        options = choose_batching(dict(profiles))
        require(isinstance(options, dict), f"return a dict {{stage: knobs}}, got {type(options).__name__}")
        for name, (alpha, beta) in profiles.items():
            gain = _batching_gain(alpha, beta)
            knobs = options.get(name, {})
            size = require_count(f"max_batch_size of {name!r}", knobs.get("max_batch_size", 1))
            if gain >= 2:
                require(size == 16, f"{name} (α={alpha} ms, β={beta} ms): batches of 16 raise its capacity "
                                    f"{gain:.1f}x, so turn batching on with max_batch_size 16, not {size}")
                wait = require_number(f"max_wait of {name!r}", knobs.get("max_wait", 0.0), positive=False)
                require(wait == 0.0, f"{name}: max_wait is 0.0 (seconds: batch whatever queued, never wait for "
                                     f"more); got {wait}")
            else:
                require(size == 1, f"{name} (α={alpha} ms, β={beta} ms): batches of 16 raise its capacity only "
                                   f"{gain:.2f}x; batching there buys waiting, not throughput, so leave it at 1")
    return "batching is on exactly where one call's fixed cost is worth sharing."


@checker
def check_third_model(factory: Callable[[], dict]) -> str:
    """Exercise 07.3: a third model, ``length``, beside topic and sentiment, merged and formatted, served by Triton."""
    stages = factory()
    require(isinstance(stages, dict) and "length" in stages, "the stage graph has no 'length' node")
    deps = list(stages["length"][1])
    require(deps == ["tokenize"], f"length should read ['tokenize'] (it counts words), not {deps}")
    require(list(stages["merge"][1]) == ["topic", "sentiment", "length"],
            f"merge should read topic, sentiment and length, in that order, not {list(stages['merge'][1])}")
    require(set(stages) == {"tokenize", "embed", "topic", "sentiment", "merge", "format", "length"},
            "keep the six nodes of the text pipeline and add only length")
    for text in ("The pizza was excellent for lunch.", "Awful hotel, never again!"):
        answer = run_stages_once(stages, {"text": text})["format"]
        words = len(tokenize(text))
        require(isinstance(answer, str) and answer.endswith(f", {words} words"),
                f"for {text!r} format said {answer!r}; it should end with ', {words} words'")
    with tempfile.TemporaryDirectory(prefix="infergraph-check-") as folder:
        repo = to_model_repository(stages, Path(folder), factory=factory, example={"text": "a b"})
        graph = ensemble_to_graph(repo.config(repo.ensemble))
    parallel = next(level for level in graph.levels if "length" in level)
    require(len(parallel) >= 2, "length runs alone in its wave; it should run beside another model")
    beside = [n for n in parallel if n != "length"]
    return f"a third model in the ensemble: waves {graph.levels}; length runs beside {beside}."
