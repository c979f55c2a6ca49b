"""What every checker shares: the :class:`Feedback` it returns, the :func:`checker` decorator, and ``require``.

A checker never raises into the notebook.  It returns :class:`Feedback`:
``Correct``, ``Not right yet`` with the reason, or ``Not done yet`` while the
exercise still holds its stub; a coloured box in JupyterLab, one line in a
terminal.  A checker is written as a function that returns its success
message and calls :func:`require` (or raises :class:`WrongAnswer`) when the
answer is wrong; :func:`checker` turns it into one that returns Feedback,
whatever the learner's code does.

>>> @checker
... def check_double(double):
...     require(double(2) == 4, f"double(2) gave {double(2)!r}, expected 4")
...     return "2 becomes 4."
>>> check_double(lambda x: 2 * x)
Correct: 2 becomes 4.
>>> check_double(lambda x: x + 1)
Not right yet: double(2) gave 3, expected 4
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from infergraph_lite.core.arguments import check_count, check_number

__all__ = ["Feedback", "Status", "WrongAnswer", "checker", "require", "require_count", "require_number"]

Status = Literal["correct", "wrong", "not done"]
"""A checker's verdict: the answer is right, wrong, or still the exercise's stub."""

_LOOK: dict[str, tuple[str, str, str, str]] = {  # status -> (label, symbol, border colour, background)
    "correct": ("Correct", "\u2714", "#2e7d32", "#e8f5e9"),
    "wrong": ("Not right yet", "\u2718", "#c62828", "#ffebee"),
    "not done": ("Not done yet", "\u270e", "#8d6e00", "#fff8e1"),
}


@dataclass(frozen=True)
class Feedback:
    """The verdict on one exercise, as the check cell shows it.

    In JupyterLab it renders as a coloured box (green *Correct*, red *Not
    right yet*, amber *Not done yet*) whose text wraps between words; in a
    terminal, its repr is one plain line.

    >>> Feedback("wrong", "b ran before a.")
    Not right yet: b ran before a.
    >>> Feedback("correct", "well done.").passed
    True
    """

    status: Status
    message: str

    def __post_init__(self) -> None:
        if self.status not in _LOOK:
            raise ValueError(f"status must be one of {sorted(_LOOK)}, got {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status == "correct"

    @property
    def label(self) -> str:
        """``Correct``, ``Not right yet`` or ``Not done yet``."""
        return _LOOK[self.status][0]

    def __repr__(self) -> str:
        return f"{self.label}: {self.message}"

    def _repr_html_(self) -> str:
        label, symbol, border, background = _LOOK[self.status]
        # Wrap only between words (no hyphenation, no breaking inside a word); dark text on a light fill, so the
        # box reads the same under JupyterLab's light and dark themes.
        style = (f"border-left: 6px solid {border}; background: {background}; color: #1a1a1a; padding: 0.5em 0.9em; "
                 "border-radius: 4px; margin: 0.2em 0; max-width: 60em; line-height: 1.45; white-space: normal; "
                 "word-break: normal; overflow-wrap: normal; hyphens: none; font-family: sans-serif")
        return (f'<div class="infergraph-feedback infergraph-{self.status.replace(" ", "-")}" style="{style}">'
                f'<strong style="color: {border}">{symbol} {label}</strong> &mdash; {html.escape(self.message)}</div>')


class WrongAnswer(Exception):
    """Raised inside a checker to report a wrong answer; its message is what the learner reads."""


def checker(func: Callable[..., str]) -> Callable[..., Feedback]:
    """Turn a check that returns a success message (or raises :class:`WrongAnswer`) into one returning Feedback.

    A ``NotImplementedError`` (the exercise's stub) reads *Not done yet*, with the stub's hint; any other
    exception from the learner's code reads *Not right yet*, naming it.

    >>> def stub(*_):
    ...     raise NotImplementedError("add one")
    >>> checker(lambda answer: f"{answer(1)} is right")(stub)
    Not done yet: replace the NotImplementedError stub with your answer. Hint: add one
    >>> checker(lambda answer: f"{answer(1)} is right")(lambda x: 1 / 0)
    Not right yet: your code raised ZeroDivisionError: division by zero
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Feedback:
        try:
            return Feedback("correct", func(*args, **kwargs))
        except NotImplementedError as stub:
            hint = f" Hint: {stub}" if str(stub) else ""
            return Feedback("not done", f"replace the NotImplementedError stub with your answer.{hint}")
        except WrongAnswer as wrong:
            return Feedback("wrong", str(wrong))
        except Exception as exc:  # noqa: BLE001 - a learner's bug is feedback, not a crash
            return Feedback("wrong", f"your code raised {type(exc).__name__}: {exc}")

    return wrapper


def require(condition: object, message: str) -> None:
    """Raise :class:`WrongAnswer` with ``message`` unless ``condition`` holds.

    >>> require(1 + 1 == 2, "arithmetic is broken")
    >>> require(1 + 1 == 3, "1 + 1 is not 3")
    Traceback (most recent call last):
    ...
    infergraph_lite.exercises.feedback.WrongAnswer: 1 + 1 is not 3
    """
    if not condition:
        raise WrongAnswer(message)


def require_count(name: str, value: object) -> int:
    """``value`` as an int if the answer gave an integer >= 1 (numpy's too); else WrongAnswer naming ``name``.

    The check is :func:`infergraph_lite.core.arguments.check_count`'s, so a checker and the module agree on
    what a count is.

    >>> require_count("replicas of 'embed'", 2)
    2
    >>> require_count("replicas of 'embed'", 1.5)
    Traceback (most recent call last):
    ...
    infergraph_lite.exercises.feedback.WrongAnswer: replicas of 'embed' must be an integer >= 1, got 1.5
    """
    try:
        return int(check_count(name, value))
    except ValueError as err:
        raise WrongAnswer(str(err)) from None


def require_number(name: str, value: object, *, positive: bool = True) -> float:
    """``value`` as a float if the answer gave a finite number > 0 (>= 0 unless ``positive``); else WrongAnswer.

    >>> require_number("the median latency", 12)
    12.0
    >>> require_number("max_wait of 'topic'", None, positive=False)
    Traceback (most recent call last):
    ...
    infergraph_lite.exercises.feedback.WrongAnswer: max_wait of 'topic' must be a finite number, got None
    """
    try:
        return check_number(name, value, positive=positive)
    except ValueError as err:
        raise WrongAnswer(str(err)) from None
