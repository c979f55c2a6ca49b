"""An LLM engine's scheduler, one step (iteration) at a time, and the state it decides on (notebook 08).

:func:`schedule_step` is the whole policy, readable on one screen: which sequences a step processes and how
many tokens each.  :class:`LLMEngine` holds the state it reads and changes — waiting and running requests,
the KV cache's free blocks — and runs steps until every request has its tokens.

A sequence's state follows vLLM V1: ``num_tokens`` (prompt + tokens generated so far) and ``computed`` (tokens
whose keys and values are in the KV cache).  A step processes ``num_tokens - computed`` tokens of a sequence
(or a chunk of them); when ``computed`` reaches ``num_tokens`` the step's end emits the next token.  A decoding
sequence processes one token per step (its last output); a prefill processes its prompt; a sequence preempted
by recomputation drops its cache and prefills prompt + output so far again, emitting its next token at the end.

Speed comes from how the engine does its bookkeeping, not from the policy: a decoding sequence's state is not
touched every step.  It is kept as of the step it started decoding, and the engine counts decode steps; its
tokens, cache size and block needs follow from that count, and it is visited again only when something happens
to it (it finishes, or is preempted).  Each step costs a few operations whatever the batch holds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

__all__ = ["LLMEngine", "schedule_step"]


def schedule_step(e: LLMEngine) -> None:
    """Decide one engine step: fill ``e.chunks`` with (request, prefill tokens) and set ``e.decode_step``.

    The default is vLLM V1's (and Sarathi-Serve's) order: running sequences first — every decoding sequence
    takes one token of the budget — then partly prefilled sequences continue, then waiting requests join
    first-come first-served while there is a free sequence slot, token budget and KV-cache room.  A prefill
    larger than what is left of the budget is cut into chunks (chunked prefill).  When a step cannot get the
    KV blocks it needs, the newest running sequence is preempted (its cache dropped, to be recomputed), as
    vLLM does.  ``prefill_first`` is vLLM V0's order: a step admits whole new prompts if it can, and then
    nothing decodes.  ``static`` is request-level batching: a batch forms only when the last one has left.
    """
    e.chunks.clear()
    e.decode_step = False
    budget = e.max_num_batched_tokens
    preempted = False
    if e.static:
        if not e.running:
            e.admit_batch()                    # the batch: up to max_num_seqs waiting requests that fit the cache
    elif e.prefill_first and e.admit(budget, whole=True):
        return                                 # vLLM V0: a step of new prompts; running sequences wait
    # 1. Decodes: one token per decoding sequence, and a new KV block for each that has filled its last one.
    while e.decode_blocks_needed() > e.free_blocks:
        e.preempt(e.newest())
        preempted = True
    if e.n_decoding:
        e.decode_step = True
        e.allocate_decode_blocks()
        budget -= e.n_decoding
    # 2. Running sequences still prefilling continue with a chunk of what is left of the budget.
    k = 0
    while k < len(e.prefilling) and budget > 0:
        i = e.prefilling[k]
        n = min(e.num_tokens[i] - e.computed[i], budget)
        while not e.allocate(i, n):            # short of blocks: preempt the newest running sequence
            victim = e.newest()
            e.preempt(victim)
            preempted = True
            if victim == i:
                break
        if i in e.running:
            e.chunks.append((i, n))
            budget -= n
            k += 1
    # 3. Waiting requests join, FCFS, unless this step had to preempt (vLLM V1 admits nothing then).
    if not (e.static or e.prefill_first or preempted):
        e.admit(budget, whole=not e.chunked_prefill)


class LLMEngine:
    """The state :func:`schedule_step` decides on, and the loop that runs steps (see the module docstring).

    Lengths and arrivals are per request, in request order (arrivals sorted).  ``num_blocks`` is the KV cache
    in blocks of ``block_size`` tokens (``math.inf``: unlimited); ``reserve``, if given, is how many blocks each
    request reserves when it is admitted (prompt + the longest output it may produce, as systems before paged
    attention did); otherwise blocks are allocated as the tokens arrive (paged).  ``step_time`` is called as
    ``step_time(prefill_tokens, decode_seqs, kv_tokens)``, ``kv_tokens`` being what the running sequences hold
    in the cache once the step has written its tokens.

    >>> e = LLMEngine([4, 4], [3, 1], [0.0, 0.0], max_num_seqs=2)
    >>> e.run(lambda p, d, kv: 1.0)
    >>> e.first_token, e.finish_time, e.n_steps
    ([1.0, 1.0], [3.0, 1.0], 3)
    """

    def __init__(self, prompt: list[int], output: list[int], arrival: list[float], *, max_num_seqs: int,
                 max_num_batched_tokens: float = math.inf, num_blocks: float = math.inf, block_size: int = 16,
                 reserve: list[int] | None = None, chunked_prefill: bool = True, prefill_first: bool = False,
                 static: bool = False) -> None:
        n = len(prompt)
        self.prompt, self.output, self.arrival = prompt, output, arrival
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.block_size, self.reserve = block_size, reserve
        self.chunked_prefill, self.prefill_first, self.static = chunked_prefill, prefill_first, static
        self.paged = reserve is None          # blocks allocated as tokens arrive (reserve: all up front)
        self.free_blocks: float = num_blocks
        self.allocated_blocks = 0
        self.num_tokens = list(prompt)    # prompt + generated (decoding sequences: as of their decode start)
        self.computed = [0] * n           # tokens in the KV cache (decoding sequences: as of their decode start)
        self.generated = [0] * n          # (decoding sequences: as of their decode start)
        self.held = [0] * n               # KV blocks held (decoding, paged: follows from computed)
        self.decode_start = [0] * n       # the decode step a decoding sequence started at
        self.version = [0] * n            # bumped on preemption: finish-heap entries from before are stale
        self.running: dict[int, bool] = {}    # admission order; True while decoding
        self.prefilling: list[int] = []       # running and still prefilling, admission order
        self.waiting: deque[int] = deque()    # arrived, not running; the preempted go back to its front
        self.next_arrival = 0
        self.n_decoding = 0
        self.decodes = 0                      # decode steps so far
        self.by_phase = [0] * block_size      # decoding sequences by (computed - decode_start) % block_size
        self.finishes: list[tuple[int, int, int]] = []   # (decode step of last token, request, version)
        self.kv_tokens = 0
        self.chunks: list[tuple[int, int]] = []
        self.decode_step = False
        self.preemptions = 0
        self.first_token = [math.nan] * n
        self.finish_time = [math.nan] * n
        # Token-gap bookkeeping: each request's runs of tokens at consecutive decode steps ("segments").
        self.decode_end: list[float] = []      # end time of each decode step
        self.seg_request: list[int] = []
        self.seg_first: list[float] = []       # the time of the segment's first token (a prefill's end)
        self.seg_from: list[int] = []          # its first and last decode step
        self.seg_to: list[int] = []
        self.open_first = [0.0] * n
        self.last_token = [math.nan] * n
        self.max_gap = [math.nan] * n          # longest gap between segments
        self.step_begin: list[float] = []
        self.step_end: list[float] = []
        self.step_prefill: list[int] = []
        self.step_decode: list[int] = []
        self.step_kv_tokens: list[int] = []
        self.step_kv_slots: list[int] = []
        self.n_steps = 0

    # -- what the policy asks ------------------------------------------------------------------------------
    def newest(self) -> int:
        return next(reversed(self.running))

    def decode_blocks_needed(self) -> int:
        # A decoding sequence writes one token a step; it needs a block when its cache is a whole number of blocks.
        return self.by_phase[-self.decodes % self.block_size] if self.paged else 0

    def allocate_decode_blocks(self) -> None:
        need = self.decode_blocks_needed()
        self.free_blocks -= need
        self.allocated_blocks += need

    def allocate(self, i: int, n: int) -> bool:
        """Give request ``i`` the blocks for ``n`` more tokens (or its reservation); False if the cache is short."""
        want = self.reserve[i] if self.reserve is not None else -(-(self.computed[i] + n) // self.block_size)
        need = want - self.held[i]
        if need > self.free_blocks:
            return False
        if need > 0:
            self.free_blocks -= need
            self.allocated_blocks += need
            self.held[i] = want
        return True

    def admit(self, budget: float, whole: bool) -> int:
        """Waiting requests join FCFS while a slot, budget and blocks allow; a prefill is chunked unless ``whole``."""
        admitted = 0
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            i = self.waiting[0]
            n = self.num_tokens[i]
            if not whole:
                n = min(n, budget)
            if n > budget or not self.allocate(i, n):
                break
            self.waiting.popleft()
            self.running[i] = False
            self.prefilling.append(i)
            self.chunks.append((i, n))
            budget -= n
            admitted += 1
        return admitted

    def admit_batch(self) -> None:
        # Static batching: whole prompts (or reservations) allocated up front; chunks are scheduled as running.
        while self.waiting and len(self.running) < self.max_num_seqs:
            i = self.waiting[0]
            if not self.allocate(i, self.num_tokens[i]):
                break
            self.waiting.popleft()
            self.running[i] = False
            self.prefilling.append(i)

    def preempt(self, i: int) -> None:
        """Drop request ``i``'s cache (to recompute it later) and put it back at the front of the queue."""
        if self.running.pop(i):
            gen, comp = self._decoding_state(i)
            held = self.reserve[i] if self.reserve is not None else -(-comp // self.block_size)
            if self.decode_step and self.paged and comp % self.block_size == 0:
                held += 1                      # the block this step allocated for it
            self.by_phase[(self.computed[i] - self.decode_start[i]) % self.block_size] -= 1
            self.n_decoding -= 1
            self.version[i] += 1
            self._close_segment(i, self.decode_start[i], self.decodes - 1)
            self.generated[i] = gen
            self.num_tokens[i] = self.prompt[i] + gen
        else:
            self.prefilling.remove(i)
            held, comp = self.held[i], self.computed[i]
        self.free_blocks += held
        self.allocated_blocks -= held
        self.kv_tokens -= comp
        self.computed[i] = 0
        self.held[i] = 0
        self.waiting.appendleft(i)
        self.preemptions += 1

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, step_time: Callable[[int, int, int], float]) -> None:
        """Run steps until every request has all its tokens."""
        n, arrival, now, done = len(self.prompt), self.arrival, 0.0, 0
        while done < n:
            if not self.running and not self.waiting:
                now = max(now, arrival[self.next_arrival])      # idle: jump to the next arrival
            while self.next_arrival < n and arrival[self.next_arrival] <= now:
                self.waiting.append(self.next_arrival)
                self.next_arrival += 1
            schedule_step(self)
            decode = self.n_decoding if self.decode_step else 0
            prefill = 0
            for _, c in self.chunks:
                prefill += c
            if not (decode or prefill):
                raise RuntimeError("the scheduler chose an empty step: no request can make progress")
            self.kv_tokens += prefill + decode
            dt = step_time(prefill, decode, self.kv_tokens)
            if not 0 < dt < math.inf:
                raise ValueError(f"step_time must return a positive finite number of seconds, got {dt!r}")
            self.step_begin.append(now)
            now += dt
            self.n_steps += 1
            self.step_end.append(now)
            self.step_prefill.append(prefill)
            self.step_decode.append(decode)
            self.step_kv_tokens.append(self.kv_tokens)
            self.step_kv_slots.append(self.allocated_blocks * self.block_size)
            if decode:
                self.decode_end.append(now)
                step = self.decodes
                self.decodes += 1
                finishes = self.finishes
                while finishes and finishes[0][0] == step:
                    _, i, version = heapq.heappop(finishes)
                    if version == self.version[i]:
                        self._finish_decoding(i, now)
                        done += 1
            for i, c in self.chunks:
                self.computed[i] += c
                if self.computed[i] == self.num_tokens[i]:
                    done += self._prefilled(i, now)

    def _decoding_state(self, i: int) -> tuple[int, int]:
        # (generated, computed) of a decoding sequence now: one more of each per decode step since it started.
        steps = self.decodes - self.decode_start[i]
        return self.generated[i] + steps, self.computed[i] + steps

    def _prefilled(self, i: int, now: float) -> int:
        # The step completed request i's prefill: it emits a token, then decodes (or is done).  Returns 1 if done.
        self.prefilling.remove(i)
        self.generated[i] += 1
        self.num_tokens[i] += 1
        if self.generated[i] == 1:
            self.first_token[i] = now
        elif now - self.last_token[i] > self.max_gap[i] or math.isnan(self.max_gap[i]):
            self.max_gap[i] = now - self.last_token[i]     # the gap a preemption left
        self.open_first[i] = now
        if self.generated[i] == self.output[i]:
            self._close_segment(i, self.decodes, self.decodes - 1)
            self._release(i, self.computed[i], now)
            return 1
        self.running[i] = True
        self.decode_start[i] = self.decodes
        self.by_phase[(self.computed[i] - self.decodes) % self.block_size] += 1
        self.n_decoding += 1
        last = self.decodes + self.output[i] - self.generated[i] - 1
        heapq.heappush(self.finishes, (last, i, self.version[i]))
        return 0

    def _finish_decoding(self, i: int, now: float) -> None:
        gen, comp = self._decoding_state(i)
        self.generated[i], self.computed[i] = gen, comp
        self.by_phase[(comp - self.decodes) % self.block_size] -= 1
        self.n_decoding -= 1
        self._close_segment(i, self.decode_start[i], self.decodes - 1)
        self._release(i, comp, now)

    def _release(self, i: int, comp: int, now: float) -> None:
        self.running.pop(i, None)
        held = self.reserve[i] if self.reserve is not None else -(-comp // self.block_size)
        self.free_blocks += held
        self.allocated_blocks -= held
        self.kv_tokens -= comp
        self.finish_time[i] = now

    def _close_segment(self, i: int, first: int, last: int) -> None:
        # Request i's tokens ran from a prefill's end (open_first), then one per decode step first..last.
        self.seg_request.append(i)
        self.seg_first.append(self.open_first[i])
        self.seg_from.append(first)
        self.seg_to.append(last)
        self.last_token[i] = self.decode_end[last] if last >= first else self.open_first[i]
