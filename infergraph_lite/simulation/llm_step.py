"""What one engine step does (:class:`Step`, the scheduler's answer) and the engine's log of the steps it ran
(:class:`StepRun`), for the simulated LLM engine (notebook 08)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Step", "StepRun"]


@dataclass(slots=True)
class Step:
    """One step as the scheduler decided it (nano-vllm's ``schedule()`` returns the same three things).

    ``prefill``: (request, tokens) for every sequence whose prompt (or a chunk of it) the step computes, cached
    prompt tokens excluded; ``decode``: whether the decoding sequences decode (then every one of them does, one
    token each, so their count, the engine's ``n_decoding``, is all the step needs); ``preempted``: the requests it
    preempted to find KV blocks, newest first.

    >>> step = Step()
    >>> step.prefill.append((3, 128)); step
    Step(prefill=[(3, 128)], decode=False, preempted=[])
    """

    prefill: list[tuple[int, int]] = field(default_factory=list)
    decode: bool = False
    preempted: list[int] = field(default_factory=list)


class StepRun(NamedTuple):
    """A run of ``steps`` identical steps in the engine's log (one entry per step, except a stretch of decode-only
    steps taken in one move, where step ``m`` of the run allocates ``patterns[pattern][m % block_size]`` blocks).

    >>> StepRun(0, 0.0, 0.01, 1, 16, 0, 16, 1, -1).prefill_tokens
    16
    """

    first_decode: int       # decode steps before the run
    start: float            # when its first step began (seconds)
    duration: float         # each step's duration (seconds)
    steps: int
    prefill_tokens: int     # per step: prompt tokens computed (cached ones excluded)
    decode_seqs: int        # per step: sequences decoding
    kv_tokens: int          # after its first step: KV tokens the running sequences hold
    kv_blocks: int          # after its first step: KV blocks allocated
    pattern: int            # a decode run's block-need pattern (-1: none)
