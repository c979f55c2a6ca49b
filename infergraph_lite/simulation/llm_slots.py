"""llama.cpp's slot placement, an optional strategy of the simulated LLM engine (notebook 08).

llama.cpp's server gives its ``--parallel`` sequence slots identities, each with a KV cache of its own, and picks
one for every request it admits (``get_available_slot``).  Where the sequences sit matters to its speed: a step
runs as micro-batches over neighbouring slots only.  :class:`LlamaCppSlots` keeps which slot is busy, decoding,
what prompt it has cached and when it was last released; the engine asks it for a slot on admission, tells it
when a sequence starts decoding or leaves, and asks it for a step's micro-batches.  vLLM and SGLang have no slots:
the engine runs without this strategy.
"""

from __future__ import annotations

import math

__all__ = ["LlamaCppSlots"]


class LlamaCppSlots:
    """``max_num_seqs`` slots placed by llama.cpp's rule ``placement`` (``"lru"`` or ``"prefix"``).

    ``prompt`` is every request's prompt length (the ``"prefix"`` rule compares them); ``slot_prompts`` the prompt
    length each slot holds at the start (None: all empty, a fresh server).

    >>> slots = LlamaCppSlots("lru", [16, 16], max_num_seqs=4)
    >>> slots.take(0), slots.take(1)        # never-used slots tie: the highest-numbered goes first
    (3, 2)
    >>> slots.release(3, cached=16, now=1.0); slots.take(1)
    1
    """

    def __init__(self, placement: str, prompt: list[int], *, max_num_seqs: int,
                 slot_prompt_similarity: float = 0.1, slot_prompts: list[int] | None = None) -> None:
        self.placement, self.prompt, self.slot_prompt_similarity = placement, prompt, slot_prompt_similarity
        self.slot_busy = [False] * max_num_seqs
        self.slot_decoding = [False] * max_num_seqs
        self.slot_cached = list(slot_prompts) if slot_prompts is not None else [0] * max_num_seqs
        # When each slot was last released, as (time, slot): llama.cpp releases the slots a step finishes in slot
        # order, each at its own clock reading, so of two released at one step the lower was released first.
        self.slot_used: list[tuple[float, int]] = [(-math.inf, 0)] * max_num_seqs     # never released: all tie

    def choose_slot(self, i: int) -> int:
        """The idle slot request ``i`` joins in, by llama.cpp's server's rule (``get_available_slot``).

        ``"prefix"``: of the idle slots holding a cached prompt, the one sharing the longest prefix with request
        ``i``'s (prompts of one text share ``min`` of their lengths), if that is over ``slot_prompt_similarity`` of
        the new prompt; ties go to the lowest-numbered.  Otherwise (and always for ``"lru"``) the least recently
        released (of slots released at the same step, the lowest-numbered: llama.cpp releases them in slot order);
        among slots never released, the highest-numbered, as llama.cpp's ``t_last_used <= t_last`` comparison picks.
        A ``slot_prompt_similarity`` of 0 turns the prefix search off, as in llama.cpp.
        """
        idle = [s for s, busy in enumerate(self.slot_busy) if not busy]
        if self.placement == "prefix" and self.slot_prompt_similarity:
            length, best, pick = self.prompt[i], 0.0, -1
            for s in idle:
                similarity = min(length, self.slot_cached[s]) / length
                if similarity > best and similarity > self.slot_prompt_similarity:
                    best, pick = similarity, s
            if pick >= 0:
                return pick
        pick = idle[0]
        for s in idle[1:]:
            if self.slot_used[s] <= self.slot_used[pick]:
                pick = s
        return pick

    def take(self, i: int) -> int:
        """Place request ``i`` (being admitted) in a slot; returns the slot."""
        s = self.choose_slot(i)
        self.slot_busy[s] = True
        return s

    def decoding(self, s: int) -> None:
        """The sequence in slot ``s`` has finished its prefill and decodes."""
        self.slot_decoding[s] = True

    def release(self, s: int, cached: int, now: float) -> None:
        """Slot ``s``'s sequence left at ``now``, its slot keeping ``cached`` prompt tokens (0: cache dropped)."""
        self.slot_busy[s] = self.slot_decoding[s] = False
        self.slot_cached[s] = cached
        self.slot_used[s] = (now, s)

    def extra_batches(self, decode_step: bool, prefill: int) -> int:
        """Micro-batches beyond the first a step runs: one per run of neighbouring decoding slots, one more for
        a prefill beside them (llama.cpp's per-slot cache; :func:`~infergraph_lite.frameworks.llamacpp.profile.
        slot_runs`)."""
        decoding, runs = self.slot_decoding, 0
        if decode_step:
            runs = sum(1 for s, d in enumerate(decoding) if d and (s == 0 or not decoding[s - 1]))
        return max(0, runs + (1 if prefill else 0) - 1)
