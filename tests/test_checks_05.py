"""Exercise 5.3's checker (the package's AIMD by hand) accepts the rule and rejects each plausible wrong version."""

from __future__ import annotations

import math

from infergraph_lite.exercises import lesson05
from infergraph_lite.exercises.feedback import Feedback


def assert_wrong(feedback: Feedback, *fragments: str) -> None:
    assert feedback.status == "wrong", feedback
    for fragment in fragments:
        assert fragment in feedback.message, feedback


def caps(waiting, alpha, beta, target, *, plain=False, rounding=math.floor, strict=False, after=False,
         floor_one=True, cap_size=True):
    # A learner's version; each keyword is one mistake.
    cap, out = 1, []
    for queued in waiting:
        if not after:
            out.append(cap)
        size = min(queued, cap) if cap_size else queued
        service = alpha + beta * size
        if service > target or (strict and service >= target):
            cap = rounding(cap * 0.9)
            cap = max(1, cap) if floor_one else cap
        elif plain or size >= cap:
            cap += 1
        if after:
            out.append(cap)
    return out


def test_the_rule_is_correct():
    feedback = lesson05.check_aimd_caps(caps)
    assert feedback.passed, feedback
    assert "between 18 and 21" in feedback.message


def test_clippers_plain_rule_is_named():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, plain=True)), "only after a full batch")


def test_rounding_to_nearest_is_named():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, rounding=round)), "round down")


def test_a_batch_on_the_target_is_within_it():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, strict=True)), "equals the target")


def test_caps_after_each_batch_are_refused():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, after=True)), "in force")


def test_a_cap_below_one_is_refused():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, floor_one=False)), "below 1")


def test_the_batch_is_capped():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a, cap_size=False)), "min(waiting, cap)")


def test_floats_and_wrong_lengths_are_refused():
    assert_wrong(lesson05.check_aimd_caps(lambda *a: [float(c) for c in caps(*a)]), "whole numbers")
    assert_wrong(lesson05.check_aimd_caps(lambda *a: caps(*a)[:-1]), "one cap per batch")


def test_a_stub_is_not_done():
    def stub(*_):
        raise NotImplementedError("keep a cap")

    assert lesson05.check_aimd_caps(stub).status == "not done"
