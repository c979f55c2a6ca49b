"""An LLM engine's scheduler, one step (iteration) at a time, and the engine that runs it (notebook 08).

The parts are nano-vllm's: the sequences' state (:class:`~infergraph_lite.simulation.llm_sequence.Sequence`), the
block manager (:class:`~infergraph_lite.simulation.llm_blocks.BlockManager`), the scheduler
(:func:`schedule_step`, the whole policy on one screen: it returns a :class:`~infergraph_lite.simulation.
llm_step.Step`), the step log (:class:`~infergraph_lite.simulation.llm_step.StepRun`), and, optionally, llama.cpp's
slot placement (:class:`~infergraph_lite.simulation.llm_slots.LlamaCppSlots`).  :class:`LLMEngine` holds the
waiting and running requests and runs steps until every request has its tokens.

Speed comes from how the engine does its bookkeeping, not from the policy: a decoding sequence's state is not
touched every step.  It is kept as of the step it started decoding, and the engine counts decode steps; its
tokens, cache size and block needs follow from that count, and it is visited again only when something happens
to it (it finishes, or is preempted).  Each step costs a few operations whatever the batch holds.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable

from infergraph_lite.simulation.llm_blocks import BlockManager, PrefixCachingBlockManager
from infergraph_lite.simulation.llm_sequence import Sequence
from infergraph_lite.simulation.llm_slots import LlamaCppSlots
from infergraph_lite.simulation.llm_step import Step, StepLog

__all__ = ["LLMEngine", "schedule_step"]


def schedule_step(e: LLMEngine) -> Step:
    """Decide one engine step: which sequences prefill how many tokens, whether the decoding ones decode, and
    which were preempted for it.

    The default is vLLM V1's (and Sarathi-Serve's) order: running sequences first — every decoding sequence
    takes one token of the budget — then partly prefilled sequences continue, then waiting requests join
    first-come first-served while there is a free sequence slot, token budget and KV-cache room.  A prefill
    larger than what is left of the budget is cut into chunks (chunked prefill).  When a step cannot get the
    KV blocks it needs, the newest running sequence is preempted (its cache dropped, to be recomputed), as
    vLLM does.  ``prefill_first`` is vLLM V0's order: a step admits whole new prompts if it can, and then
    nothing decodes.  ``static`` is request-level batching: a batch forms only when the last one has left.
    """
    step, blocks = Step([], False, []), e.blocks
    e.step = step
    budget = e.max_num_batched_tokens
    if e.static:
        if not e.running:
            e.admit_batch()                    # the batch: up to max_num_seqs waiting requests that fit the cache
    elif e.prefill_first and e.admit(step, budget, whole=True):
        return step                            # vLLM V0: a step of new prompts; running sequences wait
    # 1. Decodes: one token per decoding sequence, and a new KV block for each that has filled its last one.
    while not blocks.can_append(e.decodes):
        e.preempt(e.newest())
    if e.n_decoding:
        step.decode = True
        blocks.append(e.decodes)
        budget -= e.n_decoding
    # 2. Running sequences still prefilling continue with a chunk of what is left of the budget.
    k = 0
    while k < len(e.prefilling) and budget > 0:
        seq = e.seqs[e.prefilling[k]]
        n = seq.num_tokens - seq.computed
        if n > budget:
            if not e.chunked_prefill:
                break                          # a whole prefill waits for a step with room for it
            n = int(budget)
        while not blocks.allocate(seq, n):     # short of blocks: preempt the newest running sequence
            victim = e.newest()
            e.preempt(victim)
            if victim == seq.index:
                break
        if seq.index in e.running:
            step.prefill.append((seq.index, n))
            budget -= n
            k += 1
    # 3. Waiting requests join, FCFS, unless this step had to preempt (vLLM V1 admits nothing then).
    if not (e.static or e.prefill_first or step.preempted):
        e.admit(step, budget, whole=not e.chunked_prefill)
    return step


class LLMEngine:
    """The state :func:`schedule_step` decides on, and the loop that runs steps (see the module docstring).

    Lengths and arrivals are per request, in request order (arrivals sorted).  ``num_blocks`` is the KV cache
    in blocks of ``block_size`` tokens (``math.inf``: unlimited); ``reserve``, if given, is how many blocks each
    request reserves when it is admitted (prompt + the longest output it may produce, as systems before paged
    attention did); otherwise blocks are allocated as the tokens arrive (paged).  ``step_time`` is called as
    ``step_time(prefill_tokens, decode_seqs, kv_tokens)``, ``kv_tokens`` being what the running sequences hold
    in the cache once the step has written its tokens.  ``wake`` seconds are added to a step that starts after the
    engine has had nothing to do (no request running or waiting) for at least ``idle_after`` seconds, and to the
    first step of all: the cost of waking an idle server (see :class:`~infergraph_lite.frameworks.llamacpp.profile.
    StepTimeModel`); ``wakes`` counts the steps that paid it.

    ``placement`` (``"lru"`` or ``"prefix"``) places the sequences in ``max_num_seqs`` slots as llama.cpp's server
    does (:class:`~infergraph_lite.simulation.llm_slots.LlamaCppSlots`, given ``slot_prompt_similarity`` and
    ``slot_prompts``); then ``step_time`` gets a fourth argument, the micro-batches the step runs beyond its first.
    ``prefix_keys`` (each request's :func:`~infergraph_lite.simulation.llm_blocks.block_keys`) turns prefix caching
    on (:class:`~infergraph_lite.simulation.llm_blocks.PrefixCachingBlockManager`).

    >>> e = LLMEngine([4, 4], [3, 1], [0.0, 0.0], max_num_seqs=2)
    >>> e.run(lambda p, d, kv: 1.0)
    >>> [s.first_token for s in e.seqs], [s.finish_time for s in e.seqs], sum(e.runs.steps)
    ([1.0, 1.0], [3.0, 1.0], 3)
    """

    def __init__(self, prompt: list[int], output: list[int], arrival: list[float], *, max_num_seqs: int,
                 max_num_batched_tokens: float = math.inf, num_blocks: float = math.inf, block_size: int = 16,
                 reserve: list[int] | None = None, chunked_prefill: bool = True, prefill_first: bool = False,
                 static: bool = False, wake: float = 0.0, idle_after: float = math.inf,
                 placement: str | None = None, slot_prompt_similarity: float = 0.1,
                 slot_prompts: list[int] | None = None, prefix_keys: list[list[int]] | None = None) -> None:
        self.seqs = [Sequence(i, p, o, a, p) for i, (p, o, a) in enumerate(zip(prompt, output, arrival))]
        self.arrival = arrival
        self.blocks = (BlockManager(num_blocks, block_size, reserve) if prefix_keys is None
                       else PrefixCachingBlockManager(num_blocks, block_size, prefix_keys))
        self.cached_tokens = 0                # prompt tokens prefills found in the prefix cache, re-admissions too
        self.slots = None if placement is None else LlamaCppSlots(
            placement, prompt, max_num_seqs=max_num_seqs, slot_prompt_similarity=slot_prompt_similarity,
            slot_prompts=slot_prompts)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.block_size = block_size
        self.chunked_prefill, self.prefill_first, self.static = chunked_prefill, prefill_first, static
        self.wake, self.idle_after = wake, idle_after
        self.wakes = 0                        # steps that paid ``wake`` (they found the engine idle)
        self.now = 0.0
        self.running: dict[int, bool] = {}    # admission order; True while decoding
        self.prefilling: list[int] = []       # running and still prefilling, admission order
        self.waiting: deque[int] = deque()    # arrived, not running; the preempted go back to its front
        self.next_arrival = 0
        self.n_decoding = 0
        self.decodes = 0                      # decode steps so far
        self.finishes: list[tuple[int, int, int]] = []   # (decode step of last token, request, version)
        self.kv_tokens = 0
        self.step = Step()                    # the step being scheduled or run
        self.preemptions = 0
        self.done = 0
        # Token-gap bookkeeping: each preempted request's runs of tokens at consecutive decode steps ("segments").
        self.seg_request: list[int] = []
        self.seg_first: list[float] = []       # the time of the segment's first token (a prefill's end)
        self.seg_from: list[int] = []          # its first and last decode step
        self.seg_to: list[int] = []
        # The step log, in runs of identical steps; a run of decode steps refers to its block-need pattern.
        self.runs = StepLog()
        self.patterns: dict[tuple[int, ...], int] = {}

    # -- read by tests and notebooks -----------------------------------------------------------------------
    @property
    def decode_step(self) -> bool:
        """Whether the step being run decodes."""
        return self.step.decode

    @property
    def generated(self) -> list[int]:
        return [s.generated for s in self.seqs]

    @property
    def slot(self) -> list[int]:
        """The slot each request last ran in (-1: none placed)."""
        return [s.slot for s in self.seqs]

    @property
    def slot_busy(self) -> list[bool]:
        return self.slots.slot_busy if self.slots is not None else []

    @property
    def slot_decoding(self) -> list[bool]:
        return self.slots.slot_decoding if self.slots is not None else []

    # -- what the scheduler asks and does ------------------------------------------------------------------
    def newest(self) -> int:
        return next(reversed(self.running))

    def admit(self, step: Step, budget: float, whole: bool) -> int:
        """Waiting requests join FCFS while a slot, budget and blocks allow; a prefill is chunked unless ``whole``."""
        admitted = 0
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.seqs[self.waiting[0]]
            hits = self.blocks.lookup(seq)     # a prefill from the start reuses the cached leading blocks
            n = seq.num_tokens - len(hits) * self.block_size
            if not whole:
                n = int(min(n, budget))
            if n > budget or not self.blocks.allocate(seq, n, hits):
                break
            self._join(seq, len(hits) * self.block_size)
            step.prefill.append((seq.index, n))
            budget -= n
            admitted += 1
        return admitted

    def admit_batch(self) -> None:
        # Static batching: whole prompts (or reservations) allocated up front; chunks are scheduled as running.
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.seqs[self.waiting[0]]
            hits = self.blocks.lookup(seq)
            if not self.blocks.allocate(seq, seq.num_tokens - len(hits) * self.block_size, hits):
                break
            self._join(seq, len(hits) * self.block_size)

    def _join(self, seq: Sequence, cached: int) -> None:
        # The first waiting request starts running, ``cached`` of its tokens found in the prefix cache.
        self.waiting.popleft()
        if seq.cached < 0:
            seq.cached = cached                # what its first admission reused (vLLM's usage reports that)
        if cached:
            self.kv_tokens += cached           # the reused tokens are in its cache from now on
            self.cached_tokens += cached
        self.running[seq.index] = False
        if self.slots is not None:
            seq.slot = self.slots.take(seq.index)
        self.prefilling.append(seq.index)

    def preempt(self, i: int) -> None:
        """Drop request ``i``'s cache (to recompute it later) and put it back at the front of the queue."""
        seq, blocks = self.seqs[i], self.blocks
        if self.running.pop(i):
            gen, comp = self._decoding_state(seq)
            held = blocks.held_by(seq, comp)
            if self.step.decode and blocks.paged and comp % self.block_size == 0:
                held += 1                      # the block this step allocated for it
            blocks.stop_decoding(seq)
            self.n_decoding -= 1
            seq.version += 1
            self._close_segment(seq, seq.decode_start, self.decodes - 1)
            last = self.decodes - 1
            seq.last_token = self.decode_time(last) if last >= seq.decode_start else seq.open_first
            seq.generated = gen
            seq.num_tokens = seq.prompt + gen
        else:
            self.prefilling.remove(i)
            held, comp = seq.held, seq.computed
        blocks.free(seq, held)
        self.kv_tokens -= comp
        seq.computed = 0
        if self.slots is not None:
            self.slots.release(seq.slot, 0, self.now)      # its cache is dropped
        self.waiting.appendleft(i)
        self.preemptions += 1
        self.step.preempted.append(i)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, step_time: Callable[..., float], constant: float | None = None) -> None:
        """Run steps until every request has all its tokens; ``constant``: every step takes that long.

        With a constant step time, a stretch of steps in which only decoding happens — nobody can join, nobody
        finishes before its last step, no block runs short — is taken in one move (:meth:`_steady_steps`).
        """
        n, arrival, now = len(self.seqs), self.arrival, 0.0
        idle_since = -math.inf          # when the engine last ran out of work (inf: it has work)
        while self.done < n:
            if not self.running and not self.waiting:
                idle_since = now if self.runs else -math.inf
                now = max(now, arrival[self.next_arrival])      # idle: jump to the next arrival
            while self.next_arrival < n and arrival[self.next_arrival] <= now:
                self.waiting.append(self.next_arrival)
                self.next_arrival += 1
            if constant is not None:
                k = self._steady_steps(now, constant)
                if k > 1:
                    now = self._decode_run(now, constant, k)
                    continue
            self.now = now
            step = schedule_step(self)
            decode = self.n_decoding if step.decode else 0
            prefill = 0
            for _, c in step.prefill:
                prefill += c
            if not (decode or prefill):
                raise RuntimeError("the scheduler chose an empty step: no request can make progress")
            self.kv_tokens += prefill + decode
            if constant is not None:
                dt = constant
            elif self.slots is not None:     # the micro-batches the placed slots make
                dt = step_time(prefill, decode, self.kv_tokens, self.slots.extra_batches(step.decode, prefill))
            else:
                dt = step_time(prefill, decode, self.kv_tokens)
            if not 0 < dt < math.inf:
                raise ValueError(f"step_time must return a positive finite number of seconds, got {dt!r}")
            if self.wake and now - idle_since >= self.idle_after:
                dt += self.wake                 # the step wakes an idle engine
                self.wakes += 1
            idle_since = math.inf
            self.runs.append(self.decodes, now, dt, 1, prefill, decode, self.kv_tokens, self.blocks.num_used, -1)
            now += dt
            self.now = now
            if decode:
                self.decodes += 1
                finishes = self.finishes
                while finishes and finishes[0][0] < self.decodes:
                    self._finish_decoding(heapq.heappop(finishes), now)
            seqs = self.seqs
            for i, c in step.prefill:
                seq = seqs[i]
                seq.computed += c
                if seq.computed == seq.num_tokens:
                    self._prefilled(seq, now)

    def _steady_steps(self, now: float, dt: float) -> int:
        # How many decode-only steps from now on the scheduler would decide alike: every running sequence
        # decodes, none can join before the last, none finishes before the last, no step runs short of blocks.
        if self.prefilling or self.n_decoding != len(self.running) or not self.n_decoding:
            return 0
        joinable = not self.static and len(self.running) < self.max_num_seqs
        if joinable and self.waiting:
            return 0
        finishes, seqs = self.finishes, self.seqs
        while finishes[0][2] != seqs[finishes[0][1]].version:
            heapq.heappop(finishes)
        k = finishes[0][0] - self.decodes + 1
        if joinable and self.next_arrival < len(self.arrival):
            # Steps start at now + j * dt; the first start at or after the next arrival lets it join.
            a = self.arrival[self.next_arrival]
            j = max(1, math.ceil((a - now) / dt))
            while j > 1 and now + (j - 1) * dt >= a:
                j -= 1
            while now + j * dt < a:
                j += 1
            k = min(k, j)
        if k > 1 and self.blocks.paged and self.blocks.num_free != math.inf:
            k = min(k, self._steps_with_blocks(k))
        return k

    def _steps_with_blocks(self, k: int) -> int:
        # Decode steps (up to k) the free blocks last: every decoding sequence needs one per block_size steps.
        bs, free, n_dec, by_phase = self.block_size, self.blocks.num_free, self.n_decoding, self.blocks.by_phase
        periods = int(free // n_dec)
        if periods * bs >= k:
            return k
        steps, left = periods * bs, free - periods * n_dec
        for m in range(bs):
            need = by_phase[-(self.decodes + m) % bs]
            if need > left:
                break
            left -= need
            steps += 1
        return min(steps, k)

    def _decode_run(self, now: float, dt: float, k: int) -> float:
        # k decode steps of the same sequences in one move; returns the time after the last.
        first, n_dec = self.decodes, self.n_decoding
        pattern, first_blocks = -1, self.blocks.num_used
        if self.blocks.paged:
            # Step m of the run is decode step first + m: the sequences in phase -(first + m) % bs need a block.
            needs = self.blocks.append_run(first, k)
            first_blocks += needs[0]
            pattern = self.patterns.setdefault(needs, len(self.patterns))
        self.runs.append(first, now, dt, k, 0, n_dec, self.kv_tokens + n_dec, first_blocks, pattern)
        self.kv_tokens += k * n_dec
        now = self.now = now + k * dt
        self.decodes += k
        finishes = self.finishes
        while finishes and finishes[0][0] < self.decodes:
            self._finish_decoding(heapq.heappop(finishes), now)
        return now

    def decode_time(self, d: int) -> float:
        """When decode step ``d`` (counted from 0) ended."""
        log = self.runs
        i = bisect.bisect_right(log.first_decode, d) - 1
        return log.start[i] + (d - log.first_decode[i] + 1) * log.duration[i]

    def _decoding_state(self, seq: Sequence) -> tuple[int, int]:
        # (generated, computed) of a decoding sequence now: one more of each per decode step since it started.
        steps = self.decodes - seq.decode_start
        return seq.generated + steps, seq.computed + steps

    def _prefilled(self, seq: Sequence, now: float) -> None:
        # The step completed the sequence's prefill: it emits a token, then decodes (or is done).
        self.prefilling.remove(seq.index)
        seq.generated += 1
        seq.num_tokens += 1
        if seq.generated == 1:
            seq.first_token = now
        elif now - seq.last_token > seq.max_gap or math.isnan(seq.max_gap):
            seq.max_gap = now - seq.last_token     # the gap a preemption left
        seq.open_first = now
        if seq.generated == seq.output:
            if seq.version:
                self._close_segment(seq, self.decodes, self.decodes - 1)
            self._release(seq, seq.computed, now)
            return
        self.running[seq.index] = True
        if self.slots is not None:
            self.slots.decoding(seq.slot)
        seq.decode_start = self.decodes
        self.blocks.start_decoding(seq, self.decodes)
        self.n_decoding += 1
        last = self.decodes + seq.output - seq.generated - 1
        heapq.heappush(self.finishes, (last, seq.index, seq.version))

    def _finish_decoding(self, entry: tuple[int, int, int], now: float) -> None:
        # A finish-heap entry came due: its sequence's last token came at this step (unless preempted since).
        _, i, version = entry
        seq = self.seqs[i]
        if version != seq.version:
            return
        self.blocks.stop_decoding(seq)
        steps = self.decodes - seq.decode_start
        seq.generated += steps
        comp = seq.computed = seq.computed + steps
        self.n_decoding -= 1
        if version:     # preempted before: several segments, recorded one by one (else rebuilt at the end)
            self._close_segment(seq, seq.decode_start, self.decodes - 1)
        self._release(seq, comp, now)

    def _release(self, seq: Sequence, comp: int, now: float) -> None:
        self.running.pop(seq.index, None)
        if self.slots is not None:
            self.slots.release(seq.slot, seq.prompt, now)    # the slot keeps the prompt (and answer) in its cache
        self.blocks.free(seq, self.blocks.held_by(seq, comp))
        self.kv_tokens -= comp
        seq.finish_time = now
        self.done += 1

    def _close_segment(self, seq: Sequence, first: int, last: int) -> None:
        # The sequence's tokens ran from a prefill's end (open_first), then one per decode step first..last.
        self.seg_request.append(seq.index)
        self.seg_first.append(seq.open_first)
        self.seg_from.append(first)
        self.seg_to.append(last)
