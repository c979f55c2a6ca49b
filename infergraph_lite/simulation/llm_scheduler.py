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

import bisect
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
        n = e.num_tokens[i] - e.computed[i]
        if n > budget:
            if not e.chunked_prefill:
                break                          # a whole prefill waits for a step with room for it
            n = int(budget)
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
    in the cache once the step has written its tokens.  ``wake`` seconds are added to a step that starts after the
    engine has had nothing to do (no request running or waiting) for at least ``idle_after`` seconds, and to the
    first step of all: the cost of waking an idle server (see :class:`~infergraph_lite.frameworks.llamacpp.profile.
    StepTimeModel`); ``wakes`` counts the steps that paid it.

    ``placement`` gives the ``max_num_seqs`` sequence slots identities, as llama.cpp's server has them, and chooses
    one for each request it admits (:meth:`choose_slot`): ``"lru"``, the least recently used idle slot;
    ``"prefix"``, llama.cpp's rule for prompts that are prefixes of one text (as :func:`~infergraph_lite.frameworks.
    llamacpp.model.prompt_of` makes them): the idle slot whose cached prompt shares the longest prefix with the new
    one, if that is over ``slot_prompt_similarity`` of it, else the least recently used.  ``slot_prompts`` is the
    prompt length each slot holds at the start (0: empty).  With slots placed, ``step_time`` gets a fourth
    argument, the micro-batches the step runs beyond its first: each run of neighbouring slots that decode is one,
    and a prefill beside them one more (llama.cpp's per-slot KV cache; see :func:`~infergraph_lite.frameworks.
    llamacpp.profile.slot_runs`).  ``slot[i]`` is the slot request ``i`` last ran in (-1: none placed).

    >>> e = LLMEngine([4, 4], [3, 1], [0.0, 0.0], max_num_seqs=2)
    >>> e.run(lambda p, d, kv: 1.0)
    >>> e.first_token, e.finish_time, sum(run[3] for run in e.runs)
    ([1.0, 1.0], [3.0, 1.0], 3)
    """

    def __init__(self, prompt: list[int], output: list[int], arrival: list[float], *, max_num_seqs: int,
                 max_num_batched_tokens: float = math.inf, num_blocks: float = math.inf, block_size: int = 16,
                 reserve: list[int] | None = None, chunked_prefill: bool = True, prefill_first: bool = False,
                 static: bool = False, wake: float = 0.0, idle_after: float = math.inf,
                 placement: str | None = None, slot_prompt_similarity: float = 0.1,
                 slot_prompts: list[int] | None = None) -> None:
        n = len(prompt)
        self.placement, self.slot_prompt_similarity = placement, slot_prompt_similarity
        self.slot = [-1] * n                  # the slot each request last ran in (placement only)
        self.slot_busy = [False] * max_num_seqs
        self.slot_decoding = [False] * max_num_seqs
        self.slot_cached = list(slot_prompts) if slot_prompts is not None else [0] * max_num_seqs
        # When each slot was last released, as (time, slot): llama.cpp releases the slots a step finishes in slot
        # order, each at its own clock reading, so of two released at one step the lower was released first.
        self.slot_used: list[tuple[float, int]] = [(-math.inf, 0)] * max_num_seqs     # never released: all tie
        self.now = 0.0
        self.wake, self.idle_after = wake, idle_after
        self.wakes = 0                        # steps that paid ``wake`` (they found the engine idle)
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
        self.seg_request: list[int] = []
        self.seg_first: list[float] = []       # the time of the segment's first token (a prefill's end)
        self.seg_from: list[int] = []          # its first and last decode step
        self.seg_to: list[int] = []
        self.open_first = [0.0] * n
        self.last_token = [math.nan] * n
        self.max_gap = [math.nan] * n          # longest gap between segments (a preemption's)
        # The steps, in runs of identical ones: per run (decode steps before it, its start, step duration,
        # steps, prefill tokens and decoding sequences per step, KV tokens and blocks allocated after its first
        # step, and for a run of several decode steps the index of its block-need pattern: the blocks step m
        # of the run allocates are patterns[index][m % block_size]).
        self.runs: list[tuple[int, float, float, int, int, int, int, int, int]] = []
        self.patterns: dict[tuple[int, ...], int] = {}

    # -- what the policy asks ------------------------------------------------------------------------------
    def newest(self) -> int:
        return next(reversed(self.running))

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

    def extra_batches(self, prefill: int) -> int:
        """Micro-batches beyond the first this step runs: one per run of neighbouring decoding slots, one more for
        a prefill beside them (llama.cpp's per-slot cache; :func:`~infergraph_lite.frameworks.llamacpp.profile.
        slot_runs`)."""
        decoding, runs = self.slot_decoding, 0
        if self.decode_step:
            runs = sum(1 for s, d in enumerate(decoding) if d and (s == 0 or not decoding[s - 1]))
        return max(0, runs + (1 if prefill else 0) - 1)

    def _take_slot(self, i: int) -> None:
        if self.placement is not None:
            s = self.slot[i] = self.choose_slot(i)
            self.slot_busy[s] = True

    def _free_slot(self, i: int, cached: int, now: float) -> None:
        if self.placement is not None:
            s = self.slot[i]
            self.slot_busy[s] = self.slot_decoding[s] = False
            self.slot_cached[s] = cached
            self.slot_used[s] = (now, s)

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
                n = int(min(n, budget))
            if n > budget or not self.allocate(i, n):
                break
            self.waiting.popleft()
            self.running[i] = False
            self._take_slot(i)
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
            self._take_slot(i)
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
            last = self.decodes - 1
            self.last_token[i] = self.decode_time(last) if last >= self.decode_start[i] else self.open_first[i]
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
        self._free_slot(i, 0, self.now)        # its cache is dropped
        self.waiting.appendleft(i)
        self.preemptions += 1

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, step_time: Callable[..., float], constant: float | None = None) -> None:
        """Run steps until every request has all its tokens; ``constant``: every step takes that long.

        With a constant step time, a stretch of steps in which only decoding happens — nobody can join, nobody
        finishes before its last step, no block runs short — is taken in one move (:meth:`_steady_steps`).
        """
        n, arrival, now = len(self.prompt), self.arrival, 0.0
        self.done = 0
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
            schedule_step(self)
            decode = self.n_decoding if self.decode_step else 0
            prefill = 0
            for _, c in self.chunks:
                prefill += c
            if not (decode or prefill):
                raise RuntimeError("the scheduler chose an empty step: no request can make progress")
            self.kv_tokens += prefill + decode
            if constant is not None:
                dt = constant
            elif self.placement is not None:     # the micro-batches the placed slots make
                dt = step_time(prefill, decode, self.kv_tokens, self.extra_batches(prefill))
            else:
                dt = step_time(prefill, decode, self.kv_tokens)
            if not 0 < dt < math.inf:
                raise ValueError(f"step_time must return a positive finite number of seconds, got {dt!r}")
            if self.wake and now - idle_since >= self.idle_after:
                dt += self.wake                 # the step wakes an idle engine
                self.wakes += 1
            idle_since = math.inf
            self.runs.append((self.decodes, now, dt, 1, prefill, decode, self.kv_tokens, self.allocated_blocks, -1))
            now += dt
            self.now = now
            if decode:
                self.decodes += 1
                finishes = self.finishes
                while finishes and finishes[0][0] < self.decodes:
                    self._finish_decoding(heapq.heappop(finishes), now)
            for i, c in self.chunks:
                self.computed[i] += c
                if self.computed[i] == self.num_tokens[i]:
                    self._prefilled(i, now)

    def _steady_steps(self, now: float, dt: float) -> int:
        # How many decode-only steps from now on the scheduler would decide alike: every running sequence
        # decodes, none can join before the last, none finishes before the last, no step runs short of blocks.
        if self.prefilling or self.n_decoding != len(self.running) or not self.n_decoding:
            return 0
        joinable = not self.static and len(self.running) < self.max_num_seqs
        if joinable and self.waiting:
            return 0
        finishes = self.finishes
        while finishes[0][2] != self.version[finishes[0][1]]:
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
        if k > 1 and self.paged and self.free_blocks != math.inf:
            k = min(k, self._steps_with_blocks(k))
        return k

    def _steps_with_blocks(self, k: int) -> int:
        # Decode steps (up to k) the free blocks last: every decoding sequence needs one per block_size steps.
        bs, free, n_dec = self.block_size, self.free_blocks, self.n_decoding
        periods = int(free // n_dec)
        if periods * bs >= k:
            return k
        steps, left = periods * bs, free - periods * n_dec
        for m in range(bs):
            need = self.by_phase[-(self.decodes + m) % bs]
            if need > left:
                break
            left -= need
            steps += 1
        return min(steps, k)

    def _decode_run(self, now: float, dt: float, k: int) -> float:
        # k decode steps of the same sequences in one move; returns the time after the last.
        first, n_dec, bs = self.decodes, self.n_decoding, self.block_size
        pattern, first_blocks = -1, self.allocated_blocks
        if self.paged:
            # Step m of the run is decode step first + m: the sequences in phase -(first + m) % bs need a block.
            r = -first % bs
            needs = tuple(self.by_phase[r::-1] + self.by_phase[:r:-1])
            total = (k // bs) * n_dec + sum(needs[: k % bs])
            first_blocks += needs[0]
            self.free_blocks -= total
            self.allocated_blocks += total
            pattern = self.patterns.setdefault(needs, len(self.patterns))
        self.runs.append((first, now, dt, k, 0, n_dec, self.kv_tokens + n_dec, first_blocks, pattern))
        self.kv_tokens += k * n_dec
        now = self.now = now + k * dt
        self.decodes += k
        finishes = self.finishes
        while finishes and finishes[0][0] < self.decodes:
            self._finish_decoding(heapq.heappop(finishes), now)
        return now

    def decode_time(self, d: int) -> float:
        """When decode step ``d`` (counted from 0) ended."""
        first, begin, dt = self.runs[bisect.bisect_right(self.runs, d, key=lambda run: run[0]) - 1][:3]
        return begin + (d - first + 1) * dt

    def _decoding_state(self, i: int) -> tuple[int, int]:
        # (generated, computed) of a decoding sequence now: one more of each per decode step since it started.
        steps = self.decodes - self.decode_start[i]
        return self.generated[i] + steps, self.computed[i] + steps

    def _prefilled(self, i: int, now: float) -> None:
        # The step completed request i's prefill: it emits a token, then decodes (or is done).
        self.prefilling.remove(i)
        self.generated[i] += 1
        self.num_tokens[i] += 1
        if self.generated[i] == 1:
            self.first_token[i] = now
        elif now - self.last_token[i] > self.max_gap[i] or math.isnan(self.max_gap[i]):
            self.max_gap[i] = now - self.last_token[i]     # the gap a preemption left
        self.open_first[i] = now
        if self.generated[i] == self.output[i]:
            if self.version[i]:
                self._close_segment(i, self.decodes, self.decodes - 1)
            self._release(i, self.computed[i], now)
            return
        self.running[i] = True
        if self.placement is not None:
            self.slot_decoding[self.slot[i]] = True
        self.decode_start[i] = self.decodes
        self.by_phase[(self.computed[i] - self.decodes) % self.block_size] += 1
        self.n_decoding += 1
        last = self.decodes + self.output[i] - self.generated[i] - 1
        heapq.heappush(self.finishes, (last, i, self.version[i]))

    def _finish_decoding(self, entry: tuple[int, int, int], now: float) -> None:
        # A finish-heap entry came due: its sequence's last token came at this step (unless preempted since).
        _, i, version = entry
        if version != self.version[i]:
            return
        steps = self.decodes - self.decode_start[i]
        self.generated[i] += steps
        comp = self.computed[i] = self.computed[i] + steps
        self.by_phase[(comp - self.decodes) % self.block_size] -= 1
        self.n_decoding -= 1
        if version:     # preempted before: several segments, recorded one by one (else rebuilt at the end)
            self._close_segment(i, self.decode_start[i], self.decodes - 1)
        self._release(i, comp, now)

    def _release(self, i: int, comp: int, now: float) -> None:
        self.running.pop(i, None)
        self._free_slot(i, self.prompt[i], now)    # the slot keeps the prompt (and answer) in its cache
        held = self.reserve[i] if self.reserve is not None else -(-comp // self.block_size)
        self.free_blocks += held
        self.allocated_blocks -= held
        self.kv_tokens -= comp
        self.finish_time[i] = now
        self.done += 1

    def _close_segment(self, i: int, first: int, last: int) -> None:
        # Request i's tokens ran from a prefill's end (open_first), then one per decode step first..last.
        self.seg_request.append(i)
        self.seg_first.append(self.open_first[i])
        self.seg_from.append(first)
        self.seg_to.append(last)
