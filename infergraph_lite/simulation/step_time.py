"""What one engine step costs: the :class:`StepTime` protocol ``simulate_llm`` calls, and the per-request and
wake-up costs a fitted model may carry (:class:`ServerStepTime`, read into a checked :class:`StepCosts`).

``step_time(prefill_tokens, decode_seqs, kv_tokens)`` returns a step's seconds: ``prefill_tokens`` the prompt
tokens it computes (tokens found in the prefix cache excluded), ``decode_seqs`` the sequences decoding one token
each, ``kv_tokens`` the KV tokens the running sequences hold once it has written its own.  With llama.cpp's slots
placed it takes a fourth argument, ``extra_batches``, the micro-batches it runs beyond its first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from infergraph_lite.core.arguments import check_number

__all__ = ["ServerStepTime", "StepCosts", "StepTime", "step_costs"]


class StepTime(Protocol):
    """A step's cost in seconds (see the module docstring); any such callable, a plain function included."""

    def __call__(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, /) -> float: ...


@runtime_checkable
class ServerStepTime(Protocol):
    """A step cost fitted to a real server, carrying what that server spends outside its steps: ``request_overhead``
    (arrival to the first step that may schedule the request), ``response_overhead`` (after its last token),
    ``wake`` (more for a step that finds the engine idle for ``idle_after`` seconds; None: not measured).
    :class:`~infergraph_lite.frameworks.llamacpp.profile.StepTimeModel` is one."""

    request_overhead: float
    response_overhead: float
    wake: float
    idle_after: float | None

    def __call__(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int, /) -> float: ...


@dataclass(frozen=True)
class StepCosts:
    """The costs outside the steps, checked: seconds before a request's first step, after its last token, and
    added to a step that finds the engine idle for ``idle_after`` seconds (``math.inf``: never)."""

    request_overhead: float = 0.0
    response_overhead: float = 0.0
    wake: float = 0.0
    idle_after: float = math.inf


def step_costs(step_time: object, *, request_overhead: float | None = None, response_overhead: float | None = None,
               wake: float | None = None, idle_after: float | None = None) -> StepCosts:
    """The costs an argument gives, else what ``step_time`` declares (:class:`ServerStepTime`'s attributes), else 0.

    An object carrying only some of the attributes is read for those it has.  A bad value is named: as the
    argument, or as ``step_time.<attribute>`` when it came from the model.

    >>> class Fitted:
    ...     request_overhead, response_overhead, wake, idle_after = 0.002, 0.001, 0.003, 0.25
    ...     def __call__(self, p, d, kv): return 0.01
    >>> step_costs(Fitted())
    StepCosts(request_overhead=0.002, response_overhead=0.001, wake=0.003, idle_after=0.25)
    >>> step_costs(Fitted(), wake=0.0).idle_after        # no wake cost: no step pays it
    inf
    """
    before = _cost("request_overhead", request_overhead, step_time)
    after = _cost("response_overhead", response_overhead, step_time)
    seconds = _cost("wake", wake, step_time)
    if idle_after is not None:
        return StepCosts(before, after, seconds, check_number("idle_after", idle_after))
    if not seconds:
        return StepCosts(before, after, 0.0, math.inf)
    declared = getattr(step_time, "idle_after", None)
    if declared is None:
        raise ValueError("idle_after: a wake cost needs the idle time (seconds > 0) after which a step pays it, "
                         "given as idle_after= or as step_time.idle_after")
    return StepCosts(before, after, seconds, check_number("step_time.idle_after", declared))


def _cost(name: str, value: float | None, step_time: object) -> float:
    if value is None:
        value = getattr(step_time, name, 0.0)     # a model's declared attribute (ServerStepTime), if it has it
        if value is None:
            return 0.0
        name = f"step_time.{name}"
    return check_number(name, value, positive=False)
