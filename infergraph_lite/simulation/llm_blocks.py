"""The KV cache's blocks, for the simulated LLM engine (notebook 08; prefix caching, notebook 10).

:class:`BlockManager` is nano-vllm's block manager: the cache is ``num_blocks`` blocks of ``block_size`` tokens, and
a sequence asks for blocks as its tokens arrive (paged attention) or reserves them all on admission (``reserve``,
as systems before paged attention did).  A decoding sequence writes one token a step and needs a new block each
time its cache is a whole number of blocks; the manager counts decoding sequences by that phase, so a step's
need for decode blocks is one lookup whatever the batch holds.

:class:`PrefixCachingBlockManager` adds vLLM V1's automatic prefix caching: blocks get identities, a full block of
prompt tokens is known by its key (:func:`block_keys`: its parent block's key and its token ids), and a block
whose sequence has left stays in the cache, free, until an allocation takes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from infergraph_lite.simulation.llm_sequence import Sequence

__all__ = ["BlockManager", "PrefixCachingBlockManager", "block_keys"]


def block_keys(prompts: Seq[Seq[int]], block_size: int) -> list[list[int]]:
    """Each prompt's full blocks as keys: equal keys mean equal token ids in that block and in every block
    before it (vLLM hashes the parent block's hash with the block's ids; numbering each distinct (parent,
    ids) pair instead cannot collide).  A prompt's last, partial block has no key: only full blocks are cached.

    >>> block_keys([[1, 2, 3, 4, 5], [1, 2, 3, 4], [9, 2, 3, 4]], block_size=2)    # [3, 4] after another parent
    [[0, 1], [0, 1], [2, 3]]
    """
    table: dict[tuple[int, tuple[int, ...]], int] = {}
    keys = []
    for prompt in prompts:
        parent, own = -1, []
        for start in range(0, len(prompt) - block_size + 1, block_size):
            parent = table.setdefault((parent, tuple(prompt[start:start + block_size])), len(table))
            own.append(parent)
        keys.append(own)
    return keys


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

    def lookup(self, seq: Sequence) -> Seq[int]:
        """The cached blocks ``seq``'s prefill may reuse: none without prefix caching."""
        return ()

    def can_allocate(self, seq: Sequence, n: int, hits: Seq[int] = ()) -> bool:
        """Whether the free blocks cover ``n`` more prompt tokens of ``seq`` (or its reservation)."""
        return self.held_by(seq, seq.computed + n) - seq.held <= self.num_free

    def allocate(self, seq: Sequence, n: int, hits: Seq[int] = ()) -> bool:
        """Give ``seq`` the blocks for ``n`` more prompt tokens (or its reservation); False if the cache is short.
        (``hits``: cached blocks it reuses, always none here.)"""
        # held_by, inlined: this runs for every prefill chunk
        want = self.reserve[seq.index] if self.reserve is not None else -(-(seq.computed + n) // self.block_size)
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


class PrefixCachingBlockManager(BlockManager):
    """Paged blocks with vLLM V1's automatic prefix caching; ``keys[i]`` are request ``i``'s :func:`block_keys`.

    Each time a sequence's prefill is scheduled from its start (on admission, again after a preemption),
    :meth:`lookup` finds the longest run of its leading full blocks in the cache, at most ``(prompt - 1) //
    block_size`` so that at least one prompt token is computed; :meth:`allocate` shares them (reference counts:
    a shared block counts once toward the cache) and caches each full prompt block as soon as a step is
    scheduled to compute it (so a request admitted later in the same step already reuses it, as vLLM's
    ``allocate_slots`` does; a block two sequences computed is cached twice, and a lookup takes the older copy).
    Free blocks form one queue: a leaving sequence's blocks join its tail, last block first (its first blocks,
    the likeliest shared, are evicted last), and an allocation takes a never-used block if one is left, else the
    queue's head, evicting the key it held.  A block is never freed while in use.

    Blocks a sequence fills while decoding hold generated tokens, whose ids the simulator does not know: they
    are never cached (they are interchangeable, so the manager keeps them in one pool, :attr:`decode_pool`).

    >>> bm = PrefixCachingBlockManager(num_blocks=8, block_size=4, keys=block_keys([[1] * 10, [1] * 10], 4))
    >>> a, b = (Sequence(index=i, prompt=10, output=1, ready=0.0, num_tokens=10) for i in range(2))
    >>> bm.allocate(a, 10, bm.lookup(a)), a.blocks           # a miss: 3 never-used blocks, 2 full ones cached
    (True, [0, 1, 2])
    >>> bm.free(a, 3); list(bm.queue)                        # last block first
    [2, 1, 0]
    >>> hits = bm.lookup(b); bm.allocate(b, 10 - 4 * len(hits), hits), b.blocks, b.computed
    (True, [0, 1, 3], 8)
    """

    def __init__(self, num_blocks: float, block_size: int, keys: list[list[int]]) -> None:
        super().__init__(num_blocks, block_size)
        self.num_blocks, self.keys = num_blocks, keys
        self.never_used = 0                      # blocks 0 .. never_used - 1 have been allocated at least once
        self.queue: OrderedDict[int, None] = OrderedDict()   # free blocks that were used, head first
        self.ref: dict[int, int] = {}            # sequences holding each block
        # key -> the blocks caching it, oldest first: two sequences that computed the same block both keep it
        # cached, and a lookup takes the oldest (vLLM's BlockHashToBlockMap)
        self.block_of: dict[int, dict[int, None]] = {}
        self.key_of: dict[int, int] = {}         # block -> its key
        self.decode_pool: list[int] = []         # blocks decoding sequences filled (never cached)

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks of ``seq``'s longest run of leading full prompt blocks, one token left to compute."""
        hits = []
        for key in self.keys[seq.index][: (seq.prompt - 1) // self.block_size]:
            copies = self.block_of.get(key)
            if copies is None:
                break
            hits.append(next(iter(copies)))
        return hits

    def can_allocate(self, seq: Sequence, n: int, hits: Seq[int] = ()) -> bool:
        # Reused blocks that sit free in the queue leave it: they count as taken (vLLM counts them too).
        computed = len(hits) * self.block_size if hits else seq.computed
        new = -(-(computed + n) // self.block_size) - len(hits) - len(seq.blocks or ())
        return new + sum(1 for b in hits if not self.ref[b]) <= self.num_free

    def allocate(self, seq: Sequence, n: int, hits: Seq[int] = ()) -> bool:
        """Give ``seq`` the blocks for ``n`` more prompt tokens after ``hits`` (from :meth:`lookup`, on a prefill
        from the start: then ``seq.computed`` becomes the cached tokens); False, changing nothing, if short."""
        if not self.can_allocate(seq, n, hits):
            return False
        if seq.blocks is None:
            seq.blocks = []
        for block in hits:                       # reuse first, so that the new blocks cannot evict them
            if not self.ref[block]:
                del self.queue[block]
                self.num_free -= 1
                self.num_used += 1
            self.ref[block] += 1
            seq.blocks.append(block)
        if hits:
            seq.computed = len(hits) * self.block_size
        start = seq.computed // self.block_size
        for _ in range(-(-(seq.computed + n) // self.block_size) - len(seq.blocks)):
            seq.blocks.append(self._take())
        keys = self.keys[seq.index]
        for j in range(start, min((seq.computed + n) // self.block_size, len(keys))):
            self.block_of.setdefault(keys[j], {})[seq.blocks[j]] = None
            self.key_of[seq.blocks[j]] = keys[j]
        seq.held = len(seq.blocks)
        return True

    def _take(self) -> int:
        # A never-used block if any is left, else the free queue's head, its key evicted.
        if self.never_used < self.num_blocks:
            block = self.never_used
            self.never_used += 1
        else:
            block, _ = self.queue.popitem(last=False)
            key = self.key_of.pop(block, None)
            if key is not None:
                copies = self.block_of[key]
                del copies[block]
                if not copies:
                    del self.block_of[key]
        self.ref[block] = 1
        self.num_free -= 1
        self.num_used += 1
        return block

    def append(self, decodes: int) -> None:
        for _ in range(self.by_phase[-decodes % self.block_size]):
            self.decode_pool.append(self._take())

    def append_run(self, decodes: int, steps: int) -> tuple[int, ...]:
        used = self.num_used
        needs = super().append_run(decodes, steps)          # counts the blocks; then take them, one by one
        total = self.num_used - used
        self.num_used, self.num_free = used, self.num_free + total
        for _ in range(total):                   # no block is freed during the run: all taken in a row
            self.decode_pool.append(self._take())
        return needs

    def free(self, seq: Sequence, held: int) -> None:
        own = seq.blocks or []
        joining = [self.decode_pool.pop() for _ in range(held - len(own))]    # its last blocks: decoded ones
        for block in reversed(own):
            self.ref[block] -= 1
            if not self.ref[block]:
                joining.append(block)
        for block in joining:
            self.ref[block] = 0
            self.queue[block] = None
        self.num_free += len(joining)
        self.num_used -= len(joining)
        seq.blocks, seq.held = [], 0
