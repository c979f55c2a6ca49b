"""The KV cache's blocks, for the simulated LLM engine (notebook 08; prefix caching, notebook 10).

:class:`BlockManager` is nano-vllm's block manager: the cache is ``num_blocks`` blocks of ``block_size`` tokens, and
a sequence asks for blocks as its tokens arrive (paged attention) or reserves them all on admission (``reserve``,
as systems before paged attention did).  A decoding sequence writes one token a step and needs a new block each
time its cache is a whole number of blocks; the manager counts decoding sequences by that phase, so a step's
need for decode blocks is one lookup whatever the batch holds.
"""

from __future__ import annotations

from infergraph_lite.simulation.llm_sequence import Sequence

__all__ = ["BlockManager"]


class BlockManager:
    """Counts of free and allocated blocks, and the blocks each sequence holds (``Sequence.held``).

    >>> bm = BlockManager(num_blocks=4, block_size=16)
    >>> seq = Sequence(index=0, prompt=40, output=2, ready=0.0, num_tokens=40)
    >>> bm.can_allocate(seq, 40), bm.allocate(seq, 40), bm.num_free, seq.held     # 40 tokens: 3 blocks
    (True, True, 1, 3)
    >>> bm.free(seq, bm.held_by(seq, 40)); bm.num_free
    4
    """

    def __init__(self, num_blocks: float, block_size: int, reserve: list[int] | None = None) -> None:
        self.num_free: float = num_blocks         # math.inf: an unlimited cache
        self.num_used = 0
        self.block_size, self.reserve = block_size, reserve
        self.paged = reserve is None              # blocks allocated as tokens arrive (reserve: all up front)
        # Decoding sequences by phase, (computed - decode_start) % block_size: at decode step d those in phase
        # -d % block_size have a full cache and need a block.
        self.by_phase = [0] * block_size

    def held_by(self, seq: Sequence, computed: int) -> int:
        """The blocks a sequence with ``computed`` tokens in the cache holds (its reservation, if reserving)."""
        return self.reserve[seq.index] if self.reserve is not None else -(-computed // self.block_size)

    def can_allocate(self, seq: Sequence, n: int) -> bool:
        """Whether the free blocks cover ``n`` more prompt tokens of ``seq`` (or its reservation)."""
        return self.held_by(seq, seq.computed + n) - seq.held <= self.num_free

    def allocate(self, seq: Sequence, n: int) -> bool:
        """Give ``seq`` the blocks for ``n`` more prompt tokens (or its reservation); False if the cache is short."""
        want = self.held_by(seq, seq.computed + n)
        need = want - seq.held
        if need > self.num_free:
            return False
        if need > 0:
            self.num_free -= need
            self.num_used += need
            seq.held = want
        return True

    # -- decoding sequences: one token a step each, a block when the last one is full -------------------------
    def append_need(self, decodes: int) -> int:
        """Blocks decode step ``decodes`` (counted from 0) needs for the decoding sequences."""
        return self.by_phase[-decodes % self.block_size] if self.paged else 0

    def can_append(self, decodes: int) -> bool:
        """Whether the free blocks cover decode step ``decodes``."""
        return not self.paged or self.by_phase[-decodes % self.block_size] <= self.num_free

    def append(self, decodes: int) -> None:
        """Allocate decode step ``decodes``'s blocks (check :meth:`can_append` first)."""
        if self.paged:
            need = self.by_phase[-decodes % self.block_size]
            self.num_free -= need
            self.num_used += need

    def append_run(self, decodes: int, steps: int) -> tuple[int, ...]:
        """Allocate the blocks of ``steps`` decode steps from step ``decodes`` on (paged); returns the need of each
        of the first ``block_size`` of them, the pattern that repeats."""
        bs, r = self.block_size, -decodes % self.block_size
        needs = tuple(self.by_phase[r::-1] + self.by_phase[:r:-1])
        total = (steps // bs) * sum(self.by_phase) + sum(needs[: steps % bs])
        self.num_free -= total
        self.num_used += total
        return needs

    def start_decoding(self, seq: Sequence, decodes: int) -> None:
        self.by_phase[(seq.computed - decodes) % self.block_size] += 1

    def stop_decoding(self, seq: Sequence) -> None:
        """``seq`` stops decoding (its ``computed`` still as of its decode start)."""
        self.by_phase[(seq.computed - seq.decode_start) % self.block_size] -= 1

    def free(self, seq: Sequence, held: int) -> None:
        """``seq`` gives back its ``held`` blocks (it finished, or was preempted)."""
        self.num_free += held
        self.num_used -= held
        seq.held = 0
