"""Claims in a lesson's prose, checked against the numbers the lesson computed.

A sentence such as "batching triples the capacity" rests on a number.  The
cell above the sentence computes that number and calls :func:`expect` with the
sentence, so a re-run whose output no longer supports the text fails loudly
instead of leaving the text silently wrong.

Used by every notebook.
"""

from __future__ import annotations

__all__ = ["ClaimError", "expect"]


class ClaimError(AssertionError):
    """A sentence of the lesson is not true of this run's output; ``.claim`` quotes it."""

    def __init__(self, claim: str, detail: str = ""):
        self.claim = claim
        message = f"the text claims: {claim!r}, but this run's output does not support it"
        super().__init__(f"{message} ({detail})" if detail else message)


def expect(condition: object, claim: str, detail: str = "") -> str:
    """Check that ``condition`` holds for the sentence ``claim``; return a short confirmation.

    ``detail`` (the measured numbers, say) is added to the error when the claim fails.

    >>> expect(3 > 2, "three is more than two")
    'checked: three is more than two'
    >>> expect(1 > 2, "one is more than two", detail="1 vs 2")
    Traceback (most recent call last):
    ...
    infergraph_lite.lessons.claims.ClaimError: the text claims: 'one is more than two', but this run's ... (1 vs 2)
    """
    if not condition:
        raise ClaimError(claim, detail)
    return f"checked: {claim}"
