"""The one home of argument checks: each names the offending argument and its value.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import numpy as np

__all__ = ["check_count", "check_fraction", "check_int", "check_non_negative_int", "check_number"]


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


@overload
def check_int(name: str, value: object, *, minimum: int = ..., allow_none: Literal[False] = ...) -> int: ...
@overload
def check_int(name: str, value: object, *, minimum: int = ..., allow_none: bool) -> int | None: ...
def check_int(name: str, value: object, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """Return ``value`` as an int if it is an integer >= ``minimum`` (numpy integers too, bools not);
    else a ValueError naming it.

    >>> check_int("n_requests", np.int64(5), minimum=2)
    5
    >>> check_int("n_batches", 1, minimum=2)
    Traceback (most recent call last):
    ...
    ValueError: n_batches must be an integer >= 2, got 1
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{extra}, got {value!r}")
    return int(value)


@overload
def check_count(name: str, value: object, *, allow_none: Literal[False] = ...) -> int: ...
@overload
def check_count(name: str, value: object, *, allow_none: bool) -> int | None: ...
def check_count(name: str, value: object, *, allow_none: bool = False) -> int | None:
    """Return ``value`` as an int if it is an integer >= 1 (numpy integers too); else a ValueError naming it.

    >>> check_count("replicas", np.int64(3))
    3
    >>> check_count("max_batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: max_batch_size must be an integer >= 1, got 0
    """
    return check_int(name, value, minimum=1, allow_none=allow_none)


def check_non_negative_int(name: str, value: object) -> int:
    """Return ``value`` as an int if it is an integer >= 0; else a ValueError naming it.

    >>> check_non_negative_int("min_replicas", 0)
    0
    >>> check_non_negative_int("min_replicas", -1)
    Traceback (most recent call last):
    ...
    ValueError: min_replicas must be an integer >= 0, got -1
    """
    return check_int(name, value, minimum=0)


def check_fraction(name: str, value: object, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float if it is a number in (0, 1), or [0, 1) with ``allow_zero``; else a ValueError.

    >>> check_fraction("warmup", 0, allow_zero=True)
    0.0
    >>> check_fraction("max_load", 1.5)
    Traceback (most recent call last):
    ...
    ValueError: max_load must be a fraction in (0, 1), got 1.5
    """
    low = "[0" if allow_zero else "(0"
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
            or not (0 <= value < 1 if allow_zero else 0 < value < 1)):
        raise ValueError(f"{name} must be a fraction in {low}, 1), got {value!r}")
    return float(value)
