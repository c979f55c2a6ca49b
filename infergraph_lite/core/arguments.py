"""The one home of argument checks: each names the offending argument and its value.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["check_count", "check_number"]


def check_number(name: str, value: object, *, positive: bool = True) -> float:
    """Return ``value`` as a float if it is a finite number, > 0 (or >= 0); else a ValueError naming it.

    >>> check_number("max_wait", 0, positive=False)
    0.0
    >>> check_number("rate", float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: rate must be a finite number, got nan
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (positive and value <= 0) or value < 0:
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def check_count(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return ``value`` as an int if it is an integer >= 1 (numpy integers too); else a ValueError naming it.

    >>> check_count("replicas", np.int64(3))
    3
    >>> check_count("max_batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: max_batch_size must be an integer >= 1, got 0
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an integer >= 1{extra}, got {value!r}")
    return int(value)
