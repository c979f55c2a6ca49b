"""What one engine step does (:class:`Step`, the scheduler's answer) and the engine's log of the steps it ran
(:class:`StepLog`, whose entries read as :class:`StepRun` records), for the simulated LLM engine (notebook 08)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Step", "StepLog", "StepRun"]


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


@dataclass(slots=True)
class StepLog:
    """The steps an engine ran, one list per :class:`StepRun` field; ``log[i]`` is entry ``i`` as a ``StepRun``.

    Columns, not a record per entry: a run logs some 10^5 entries, and as many long-lived objects would have
    Python's garbage collector scan them again and again (lists of numbers it does not scan).

    >>> log = StepLog()
    >>> log.append(0, 0.0, 0.01, 1, 16, 0, 16, 1, -1); len(log), log[0].prefill_tokens, log.steps
    (1, 16, [1])
    """

    first_decode: list[int] = field(default_factory=list)
    start: list[float] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    kv_blocks: list[int] = field(default_factory=list)
    pattern: list[int] = field(default_factory=list)

    def append(self, first_decode: int, start: float, duration: float, steps: int, prefill_tokens: int,
               decode_seqs: int, kv_tokens: int, kv_blocks: int, pattern: int) -> None:
        """Log a run of ``steps`` identical steps (the fields of :class:`StepRun`)."""
        self.first_decode.append(first_decode)
        self.start.append(start)
        self.duration.append(duration)
        self.steps.append(steps)
        self.prefill_tokens.append(prefill_tokens)
        self.decode_seqs.append(decode_seqs)
        self.kv_tokens.append(kv_tokens)
        self.kv_blocks.append(kv_blocks)
        self.pattern.append(pattern)

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> StepRun:
        return StepRun(*(getattr(self, name)[i] for name in StepRun._fields))
