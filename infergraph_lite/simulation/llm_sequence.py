"""One request's state inside the simulated LLM engine (notebook 08): vLLM V1's ``Request``, nano-vllm's
``Sequence``.

A sequence holds ``num_tokens`` (prompt + tokens generated so far) and ``computed`` (tokens whose keys and values
are in the KV cache).  A step processes ``num_tokens - computed`` tokens of it (or a chunk of them); when
``computed`` reaches ``num_tokens`` the step's end emits the next token.  A decoding sequence is not touched every
step: its ``num_tokens``, ``computed`` and ``generated`` are kept as of ``decode_start`` (the engine's decode-step
count when it started decoding), and the engine derives them from how many decode steps have passed since.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Sequence"]


@dataclass(slots=True, eq=False)
class Sequence:
    """Request ``index``'s state: its lengths, where it stands, and the times of its tokens.

    >>> s = Sequence(index=0, prompt=8, output=3, ready=0.0, num_tokens=8)
    >>> s.num_tokens, s.computed, s.generated
    (8, 0, 0)
    """

    index: int
    prompt: int                  # prompt tokens
    output: int                  # output tokens it will generate
    ready: float                 # when it may first be scheduled (its arrival + any request overhead)
    num_tokens: int              # prompt + generated (decoding: as of decode_start)
    computed: int = 0            # tokens in the KV cache (decoding: as of decode_start)
    generated: int = 0           # (decoding: as of decode_start)
    held: int = 0                # KV blocks held (decoding, paged: follows from computed)
    decode_start: int = 0        # the decode step it started decoding at
    version: int = 0             # bumped on preemption: finish-heap entries from before are stale
    slot: int = -1               # the slot it last ran in (llama.cpp's placement only)
    cached: int = -1             # prompt tokens the prefix cache gave it at its first admission (-1: not yet)
    blocks: list[int] | None = None   # its KV blocks, in order (prefix caching only)
    first_token: float = math.nan
    finish_time: float = math.nan
    # Token-gap bookkeeping: when its current run of tokens began (a prefill's end), its last token before a
    # preemption, and the longest gap a preemption left.
    open_first: float = 0.0
    last_token: float = math.nan
    max_gap: float = math.nan
