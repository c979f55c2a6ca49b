"""Workloads that share prefixes, for simulated prefix caching (notebook 10): requests behind a few system
prompts, and multi-turn chats whose every turn repeats the conversation so far.

Token ids are drawn from a seeded generator, so distinct prompts share no blocks by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int

__all__ = ["MultiTurn", "multi_turn", "shared_prefix_prompts"]

VOCAB = 32_000      # token ids are drawn from [0, VOCAB): a llama-sized vocabulary


def shared_prefix_prompts(n_requests: int, *, system_tokens: int, question_tokens: int, n_systems: int = 1,
                          seed: int = 0) -> list[list[int]]:
    """``n_requests`` prompts, each a system prompt of ``system_tokens`` ids then a question of its own of
    ``question_tokens``; request ``i`` uses system prompt ``i % n_systems`` (the "tenants" take turns).

    >>> prompts = shared_prefix_prompts(3, system_tokens=4, question_tokens=2, n_systems=2)
    >>> [len(p) for p in prompts], prompts[0][:4] == prompts[2][:4], prompts[0][:4] == prompts[1][:4]
    ([6, 6, 6], True, False)
    """
    n = check_count("n_requests", n_requests)
    systems = check_count("n_systems", n_systems)
    system_len = check_non_negative_int("system_tokens", system_tokens)
    question_len = check_non_negative_int("question_tokens", question_tokens)
    if system_len + question_len < 1:
        raise ValueError("system_tokens + question_tokens must be >= 1: a prompt needs a token")
    rng = np.random.default_rng(check_non_negative_int("seed", seed))
    system = rng.integers(0, VOCAB, (systems, system_len)).tolist()
    questions = rng.integers(0, VOCAB, (n, question_len)).tolist()
    return [system[i % systems] + questions[i] for i in range(n)]


@dataclass(frozen=True)
class MultiTurn:
    """A multi-turn workload: ``prompts`` and ``output_tokens`` per request, in the order they are sent."""

    prompts: list[list[int]]
    output_tokens: list[int]


def multi_turn(n_conversations: int, turns: int, *, system_tokens: int, user_tokens: int, answer_tokens: int,
               seed: int = 0) -> MultiTurn:
    """Chats of ``turns`` turns: turn ``t``'s prompt is the system prompt (shared by all), then every earlier
    user message and answer, then a new user message of ``user_tokens``; its answer is ``answer_tokens`` long.
    Requests are ordered turn by turn (every conversation's first turn, then every second turn, ...), as chats
    running side by side send them.

    >>> w = multi_turn(2, 2, system_tokens=4, user_tokens=2, answer_tokens=3)
    >>> [len(p) for p in w.prompts], w.prompts[2][:6] == w.prompts[0]     # turn 2 repeats turn 1 and its answer
    ([6, 6, 11, 11], True)
    """
    chats = check_count("n_conversations", n_conversations)
    turns = check_count("turns", turns)
    answer = check_count("answer_tokens", answer_tokens)
    user = check_count("user_tokens", user_tokens)
    rng = np.random.default_rng(check_non_negative_int("seed", seed))
    system = rng.integers(0, VOCAB, check_non_negative_int("system_tokens", system_tokens)).tolist()
    history = [list(system) for _ in range(chats)]
    prompts, outputs = [], []
    for _ in range(turns):
        for c in range(chats):
            history[c] += rng.integers(0, VOCAB, user).tolist()
            prompts.append(list(history[c]))
            outputs.append(answer)
            history[c] += rng.integers(0, VOCAB, answer).tolist()   # the answer the next turn repeats
    return MultiTurn(prompts, outputs)
