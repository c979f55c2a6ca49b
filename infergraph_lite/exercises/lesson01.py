"""Checkers for the exercises of notebook 01, *Inference is a pipeline*.

Each takes the learner's function, runs it on the seed's graph (and a variant it has not seen), and returns
:class:`~infergraph_lite.exercises.feedback.Feedback`.

>>> check_add_postprocess(lambda nodes: nodes)
Not right yet: the returned graph has no 'postprocess' node
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infergraph_lite.core.execute import run_graph
from infergraph_lite.core.graph import levels
from infergraph_lite.exercises.feedback import checker, require
from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

__all__ = ["check_add_postprocess", "check_confidence_gate", "check_modelC"]


@checker
def check_add_postprocess(add_postprocess: Callable[[dict], dict]) -> str:
    """Exercise 01.1: a ``postprocess`` node after ``combine`` that formats ``'len=6 a_count=3'``."""
    original = banana_nodes()
    before = dict(original)
    nodes = add_postprocess(original)
    require(original == before, "add_postprocess changed the graph it was given; return a new dict instead")
    require(isinstance(nodes, dict) and "postprocess" in nodes, "the returned graph has no 'postprocess' node")
    deps = list(nodes["postprocess"][1])
    require(deps == ["combine"], f"postprocess should depend on ['combine'] only, not {deps}")
    require(set(nodes) == set(before) | {"postprocess"}, "keep every original node, and add only postprocess")
    out = run_graph(nodes, BANANA_INPUTS)["postprocess"]
    require(out == "len=6 a_count=3", f"for '  BANANA  ' postprocess returned {out!r}, "
                                      "expected 'len=6 a_count=3'")
    other = run_graph(nodes, {"text": "Alfalfa"})["postprocess"]
    require(other == "len=7 a_count=3", f"for 'Alfalfa' it returned {other!r}: compute from combine, don't hard-code")
    return "postprocess runs after combine and formats its dict."


@checker
def check_modelC(add_vowel_model: Callable[[dict], dict]) -> str:
    """Exercise 01.2: a third model counting vowels, beside modelA and modelB, fed into combine."""
    nodes = add_vowel_model(banana_nodes())
    require("modelC" in nodes, "there is no 'modelC' node")
    require(list(nodes["modelC"][1]) == ["pre"], f"modelC should depend on ['pre'] only (to run beside A and B), "
                                                 f"not {list(nodes['modelC'][1])}")
    require(set(nodes["combine"][1]) == {"modelA", "modelB", "modelC"}, "combine should use modelA, modelB and modelC")
    require(levels(nodes, BANANA_INPUTS)[1] == ["modelA", "modelB", "modelC"],
            "modelA, modelB and modelC should share a level")
    out = run_graph(nodes, BANANA_INPUTS)["combine"]
    require(out == {"len": 6, "a_count": 3, "vowels": 3}, f"combine gave {out}, expected "
                                                         "{'len': 6, 'a_count': 3, 'vowels': 3}")
    out = run_graph(nodes, {"text": " Queue "})["combine"]
    require(out.get("vowels") == 4, f"'Queue' has 4 vowels (u, e, u, e) but modelC said {out.get('vowels')}")
    return "three models in one level, combined."


@checker
def check_confidence_gate(add_gate: Callable[[dict], dict]) -> str:
    """Exercise 01.3: ``needs_review`` is True when topic or sentiment confidence is below 0.6."""

    def fake_model(label: str, confidence: float) -> Callable[[Any], dict]:
        return lambda _: {"label": label, "confidence": confidence}

    def pipeline(topic_conf: float, sentiment_conf: float) -> dict:
        return {"topic": (fake_model("food", topic_conf), ["text"]),
                "sentiment": (fake_model("positive", sentiment_conf), ["text"])}

    nodes = add_gate(pipeline(0.9, 0.9))
    require("needs_review" in nodes, "there is no 'needs_review' node")
    require(sorted(nodes["needs_review"][1]) == ["sentiment", "topic"],
            f"needs_review should depend on topic and sentiment, not {list(nodes['needs_review'][1])}")
    cases = [((0.9, 0.9), False), ((0.5, 0.9), True), ((0.9, 0.59), True), ((0.6, 0.6), False), ((0.2, 0.3), True)]
    for (t, s), expected in cases:
        got = run_graph(add_gate(pipeline(t, s)), {"text": "x"})["needs_review"]
        require(got is expected, f"with topic confidence {t} and sentiment confidence {s}, needs_review was {got!r}, "
                                 f"expected {expected} (review when either is below 0.6)")
    return "low-confidence answers are flagged for review."

