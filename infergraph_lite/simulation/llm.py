"""Simulated LLM serving: iteration-level (continuous) and request-level (static) batching (notebook 08).

An LLM request is not one call but a loop: a prefill step over its prompt emits the first output token, then
one decode step per further token.  The engine schedules per *step*: at every step boundary finished sequences
leave and waiting requests join, bounded by ``max_num_seqs``, a per-step token budget and the KV cache.  The
policy is :func:`~infergraph_lite.simulation.llm_scheduler.schedule_step`; this module checks the arguments,
runs :class:`~infergraph_lite.simulation.llm_scheduler.LLMEngine` and summarises what it recorded (its step log,
:class:`~infergraph_lite.simulation.llm_step.StepLog`, and its sequences).

Knob names beside ours: vLLM ``max_num_seqs``, ``max_num_batched_tokens``, ``block_size``,
``enable_chunked_prefill``; llama.cpp ``--parallel`` (slots), ``--ctx-size`` (the cache, shared by the slots),
``--batch-size``; TGI ``--max-batch-total-tokens``, ``--max-batch-prefill-tokens``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter

import numpy as np

from infergraph_lite.core.arguments import check_count, check_fraction, check_non_negative_int, check_number
from infergraph_lite.core.llm_metrics import LLMMetrics
from infergraph_lite.core.metrics import LatencySummary, latency_percentile
from infergraph_lite.simulation.llm_blocks import block_keys
from infergraph_lite.simulation.llm_scheduler import LLMEngine
from infergraph_lite.simulation.step_time import StepTime, step_costs

__all__ = ["LLMResult", "simulate_llm"]

StepTimeArg = float | StepTime
Lengths = int | Sequence[int] | np.ndarray


@dataclass(frozen=True)
class LLMResult(LatencySummary):
    """Per-request times of a simulated LLM engine run, and their summaries.

    The metrics are vLLM's (``vllm bench serve``): ``ttft``, time to first token; ``tpot``, a request's mean time
    per output token after the first, (last token - first token) / (tokens - 1); ITL, the inter-token latency,
    every gap between two consecutive tokens of a request (:meth:`itl`; TBT, time between tokens, is another
    name for it), and ``max_itl``, each request's longest; ``e2e`` (vLLM's E2EL), arrival to the answer's end.
    A request's TPOT is the mean of its ITLs: a single long gap hides in the mean and shows in the maximum.

    Per-request arrays hold every request, in request order; the summaries (``mean``, ``percentile``,
    ``throughput``) leave out the first ``warmup`` fraction.  ``tpot`` and ``max_itl`` are NaN for a request
    with one output token (it has no gap), and the summaries skip them.  The ``steps_*`` arrays describe every
    engine step: its end time, prefill tokens, decoding sequences, KV tokens held and KV slots allocated.

    >>> r = simulate_llm(n_requests=2, prompt_tokens=[8, 64], output_tokens=[4, 2], arrivals=[0.0, 0.015],
    ...                  step_time=lambda prefill, decode, kv: 0.010 + 0.001 * (prefill + decode), max_num_seqs=2)
    >>> r.token_times(0).round(3), r.itl(0).round(3)     # request 1's 64-token prefill rides in step 2
    (array([0.018, 0.093, 0.105, 0.116]), array([0.075, 0.012, 0.011]))
    >>> round(float(r.tpot[0]), 3), round(float(r.max_itl[0]), 3)     # the mean gap, and the longest
    (0.033, 0.075)
    """

    arrival: np.ndarray
    first_token: np.ndarray     # when each request's first output token came (end of its prefill step)
    finish: np.ndarray          # when its answer was complete: its last token came, + response_overhead
    output_tokens: np.ndarray   # tokens generated
    max_itl: np.ndarray         # the longest gap between two consecutive tokens (inter-token latency)
    throughput: float           # output tokens per second over the measured window
    request_throughput: float   # requests finished per second over the measured window
    makespan: float             # first arrival to last finish
    preemptions: int            # sequences preempted (cache dropped, recomputed later)
    kv_utilization: float       # time-averaged fraction of allocated KV slots holding real tokens (with prefix
                                # caching, a shared block's tokens count once per sequence: may pass 1)
    kv_occupancy: float         # time-averaged fraction of the KV cache allocated (NaN: unlimited cache)
    warmup: int                 # requests left out of the summaries
    steps_end: np.ndarray
    steps_prefill_tokens: np.ndarray
    steps_decode_seqs: np.ndarray
    steps_kv_tokens: np.ndarray
    steps_kv_slots: np.ndarray
    slot: np.ndarray | None = None   # the slot each request last ran in (None: slots not placed; see simulate_llm)
    request_overhead: float = 0.0    # seconds from arrival to the first step that may schedule the request
    response_overhead: float = 0.0   # seconds from the last token to the answer's end
    wake: float = 0.0                # seconds added to a step that found the engine idle (see simulate_llm)
    idle_after: float = math.inf     # how long the engine must have been idle for that
    wakes: int = 0                   # steps that paid ``wake``
    # Each run of a request's tokens at consecutive steps: (request, its first token's time, its first and last
    # decode step); the tokens after the first come at the ends of those decode steps.  See token_times.
    token_runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    prompt_tokens: np.ndarray | None = None   # each request's prompt length
    cached_tokens: np.ndarray | None = None   # prompt tokens its first prefill found in the prefix cache (0: none)

    @property
    def e2e(self) -> np.ndarray:
        """Arrival to the answer's end (last token + ``response_overhead``), per request."""
        return self.finish - self.arrival

    @property
    def ttft(self) -> np.ndarray:
        """Time to first token: arrival to the end of the step that completed the prefill (``request_overhead``
        included)."""
        return self.first_token - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        """Time per output token: a request's mean gap between tokens after the first (vLLM's TPOT)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            decoding = self.finish - self.response_overhead - self.first_token
            return np.where(self.output_tokens > 1, decoding / (self.output_tokens - 1), np.nan)

    @property
    def max_tbt(self) -> np.ndarray:
        """The same as :attr:`max_itl` (TBT, time between tokens, is another name for the inter-token latency)."""
        return self.max_itl

    @cached_property
    def _tokens(self) -> tuple[np.ndarray, np.ndarray]:
        # (request, time) of every output token, sorted by request, then time: each run's first token, then one
        # at the end of each of its decode steps.
        if self.token_runs is None:
            raise ValueError("this result records no token times (token_runs is None)")
        req, first, lo, hi = self.token_runs
        order = np.lexsort((first, req))
        req, first, lo, hi = req[order], first[order], lo[order], hi[order]
        decode_end = self.steps_end[self.steps_decode_seqs > 0]
        decodes = np.maximum(hi - lo + 1, 0)
        start = np.cumsum(decodes + 1) - (decodes + 1)      # where each run's first token goes
        times = np.empty(int(decodes.sum()) + len(req))
        times[start] = first
        within = np.arange(int(decodes.sum())) - np.repeat(np.cumsum(decodes) - decodes, decodes)
        times[np.repeat(start + 1, decodes) + within] = decode_end[np.repeat(lo, decodes) + within]
        return np.repeat(req, decodes + 1), times

    @cached_property
    def _gaps(self) -> tuple[np.ndarray, np.ndarray]:
        # (request, gap) of every gap between two consecutive tokens of a request, in request order.
        req, times = self._tokens
        same = req[1:] == req[:-1]
        return req[1:][same], np.diff(times)[same]

    def token_times(self, request: int) -> np.ndarray:
        """When each output token of ``request`` came, in seconds (its last: ``finish - response_overhead``)."""
        if isinstance(request, bool) or not isinstance(request, (int, np.integer)) or not (
                0 <= request < len(self.arrival)):
            raise ValueError(f"request must be a request number in [0, {len(self.arrival)}), got {request!r}")
        req, times = self._tokens
        lo, hi = np.searchsorted(req, [request, request + 1])
        return times[lo:hi].copy()

    def itl(self, request: int | None = None) -> np.ndarray:
        """Inter-token latencies: every gap between two consecutive tokens of ``request``, in seconds; with no
        ``request``, every gap of every measured request (after the warm-up), in request order, as vLLM pools
        them for its ITL percentiles.  ``tpot`` is a request's mean gap, ``max_itl`` its longest."""
        if request is not None:
            return np.diff(self.token_times(request))
        req, gaps = self._gaps
        return gaps[req >= self.warmup]

    def measured(self, of: str = "e2e") -> np.ndarray:
        """The metric ``of`` after the warm-up, NaNs left out: per request (e2e, ttft, tpot, max_itl), or "itl",
        every gap between tokens of the measured requests (so ``percentile(99, "itl")`` is vLLM's p99 ITL)."""
        if of == "itl":
            return self.itl()
        if of not in ("e2e", "ttft", "tpot", "max_itl", "max_tbt"):
            raise ValueError(f"of must be one of 'e2e', 'ttft', 'tpot', 'max_itl', 'itl', got {of!r}")
        values = getattr(self, of)[self.warmup:]
        return values[~np.isnan(values)]

    def mean(self, of: str = "e2e") -> float:
        """Mean of ``of`` (e2e, ttft, tpot, max_itl, itl) over the measured requests."""
        return float(self.measured(of).mean())

    @property
    def mean_latency(self) -> float:
        return self.mean("e2e")

    def percentile(self, q: float, of: str = "e2e") -> float:
        """The q-th percentile of ``of`` over the measured requests: ``percentile(99, "ttft")`` is p99 TTFT,
        ``percentile(99, "itl")`` the p99 of every gap between tokens."""
        return latency_percentile(self.measured(of), q)

    def metrics(self, slo: Mapping[str, float] | None = None, percentiles: Sequence[float] = (99,)) -> LLMMetrics:
        """vLLM's serving metrics of the measured requests (after the warm-up), the real client's record.

        TTFT, TPOT, ITL and E2EL from each request's token times since its arrival (E2EL: to ``finish``), the
        throughputs over the first measured arrival to the last finish, goodput for ``slo`` (seconds).

        >>> r = simulate_llm(n_requests=4, prompt_tokens=8, output_tokens=3, step_time=0.01, max_num_seqs=2)
        >>> m = r.metrics(slo={"ttft": 0.025})
        >>> round(m.tpot.mean, 3), m.good, m.completed      # the second pair waits a prefill and two decodes
        (0.01, 2, 4)
        """
        measured = range(self.warmup, len(self.arrival))
        return LLMMetrics.from_token_times([self.token_times(i) - self.arrival[i] for i in measured],
                                           sent=self.arrival[self.warmup:], e2el=self.e2e[self.warmup:], slo=slo,
                                           percentiles=percentiles)

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache over prompt tokens, of the measured requests (after the
        warm-up); each request counted at its first admission, as vLLM's usage reports ``cached_tokens``."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            raise ValueError("this result records no prompt or cached tokens")
        return float(self.cached_tokens[self.warmup:].sum() / self.prompt_tokens[self.warmup:].sum())

    @property
    def steps(self) -> int:
        return len(self.steps_end)


def simulate_llm(
    *,
    n_requests: int,
    prompt_tokens: Lengths | None = None,
    output_tokens: Lengths,
    step_time: StepTimeArg,
    max_num_seqs: int,
    arrival_rate: float | None = None,
    arrivals: Sequence[float] | np.ndarray | None = None,
    scheduling: str = "continuous",
    max_num_batched_tokens: int | None = None,
    kv_cache_tokens: int | None = None,
    block_size: int = 16,
    seed: int = 0,
    prefill_first: bool = False,
    chunked_prefill: bool = True,
    kv_allocation: str = "paged",
    max_tokens: int | None = None,
    warmup: float = 0.0,
    request_overhead: float | None = None,
    response_overhead: float | None = None,
    wake: float | None = None,
    idle_after: float | None = None,
    slot_placement: str | None = None,
    slot_prompt_similarity: float | None = None,
    slot_prompts: Sequence[int] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    prefix_caching: bool = False,
) -> LLMResult:
    """Simulate an LLM engine serving ``n_requests`` requests, step by step.

    ``prompt_tokens`` and ``output_tokens`` are an int or one value per request.  Requests arrive as a
    Poisson process at ``arrival_rate`` per second (seeded by ``seed``), or at the given sorted ``arrivals``
    (which override the rate); with neither, all arrive at 0 — an offline batch.  ``step_time`` is the seconds
    one engine step takes: a number, or ``step_time(prefill_tokens, decode_seqs, kv_tokens)`` called with what
    the step holds.

    A request's first token comes at the end of the step that completes its prefill, then one token per
    step it is in, so a request alone takes exactly ``output_tokens`` steps.  ``scheduling="continuous"``:
    sequences join and leave at every step boundary (iteration-level batching, as in Orca and vLLM), up to
    ``max_num_seqs`` and the per-step budget ``max_num_batched_tokens`` (every token a step processes, one
    per decoding sequence; None: no limit); running sequences first, prefills chunked into what is left
    (vLLM V1, Sarathi-Serve), or ``prefill_first=True`` for vLLM V0's steps (new prompts whole, decodes wait);
    ``chunked_prefill=False`` admits a prompt only if it fits the step whole.  ``scheduling="static"``: a batch
    of up to ``max_num_seqs`` forms from what waits and runs until its longest member is done; nothing joins.

    ``kv_cache_tokens`` (None: unlimited) is the KV cache, in blocks of ``block_size`` tokens.
    ``kv_allocation="paged"`` allocates blocks as tokens arrive; a step short of a block preempts the newest
    running sequence (its cache dropped and recomputed later, as vLLM does).  ``"reserve_max"`` reserves
    prompt + ``max_tokens`` (default: the longest ``output_tokens``) for a request when it is admitted, as
    systems before paged attention did.  The first ``warmup`` fraction of requests is left out of summaries.

    Prefix caching (vLLM's automatic prefix caching): ``prompts`` gives each request's token ids (its length is
    the prompt length; ``prompt_tokens`` may then be left out) and ``prefix_caching=True`` turns the cache on
    (``kv_allocation="paged"`` only).  Each time a request's prefill is scheduled from its start (on admission,
    and again after a preemption) it reuses the longest run of its leading full blocks found in the cache, at
    most ``(prompt - 1) // block_size`` of them (one token is always computed); a full block is known by its token
    ids and its parent block's, a reused block is shared and counts once toward ``kv_cache_tokens``, and a block
    whose sequences have left stays cached until an allocation takes it (never-used blocks first, then the free
    queue's head; a sequence's blocks join the queue last block first).  ``step_time`` is called with the prompt
    tokens a step computes, cached ones excluded; ``result.cached_tokens`` holds each request's reused tokens at
    its first admission and ``result.prefix_hit_rate`` their share of the prompt tokens (see
    :class:`~infergraph_lite.simulation.llm_blocks.PrefixCachingBlockManager`).  Two requests with one 40-token
    system prompt, in blocks of 16, the second after the first: it reuses 2 full blocks, and its prefill step
    computes the other 10 tokens:

    >>> from infergraph_lite.simulation.prefix_workloads import shared_prefix_prompts
    >>> prompts = shared_prefix_prompts(2, system_tokens=40, question_tokens=10)
    >>> r = simulate_llm(n_requests=2, prompts=prompts, output_tokens=2, step_time=0.01, max_num_seqs=4,
    ...                  arrivals=[0.0, 1.0], prefix_caching=True)
    >>> r.cached_tokens, r.steps_prefill_tokens.tolist(), r.prefix_hit_rate
    (array([ 0, 32]), [50, 0, 18, 0], 0.32)

    A real server spends time on a request outside its engine's steps: receiving and parsing it, tokenizing,
    setting up its slot, streaming the answer back.  ``request_overhead`` is the seconds from a request's
    arrival to the first step that may schedule it (it overlaps with any wait for a slot, and delays no other
    request's step); ``response_overhead`` is added after its last token (the end of the stream).  None (the
    default) takes each from ``step_time``'s attribute of that name if it has one (the attributes of
    :class:`~infergraph_lite.simulation.step_time.ServerStepTime`) — a
    :class:`~infergraph_lite.frameworks.llamacpp.profile.StepTimeModel` fitted to a server carries what it
    measured — else 0.

    An engine that has been idle is slower to start again (its thread woken, its caches cold): ``wake`` seconds are
    added to a step that starts after the engine had no request running or waiting for at least ``idle_after``
    seconds, and to the very first step (``result.wakes`` counts them).  None takes each from ``step_time``'s
    attribute of that name, as for the overheads; ``wake`` defaults to 0 (no such cost).

    Where the sequences sit matters to llama.cpp: with a KV cache per slot it runs a step as micro-batches over
    neighbouring slots only.  ``slot_placement`` places every admitted request in one of ``max_num_seqs`` slots by
    llama.cpp's server's rule: ``"lru"``, the least recently used idle slot; ``"prefix"``, for prompts that are
    prefixes of one text (as :func:`~infergraph_lite.frameworks.llamacpp.model.prompt_of` makes them), the idle
    slot whose cached prompt shares the longest prefix with the new one if that is over ``slot_prompt_similarity``
    of it (llama.cpp's ``--slot-prompt-similarity``; None: its default, 0.1; 0: no prefix search), else the least
    recently used.  ``slot_prompts``: the prompt
    length each slot holds at the start (0: empty; default all empty, a fresh server).  Then ``step_time`` is
    called with a fourth argument, ``extra_batches``: the step's micro-batches beyond the first (a
    :class:`~infergraph_lite.frameworks.llamacpp.profile.StepTimeModel` takes it), and ``result.slot`` says where
    each request ran (see :meth:`~infergraph_lite.simulation.llm_slots.LlamaCppSlots.choose_slot`).  Three lone
    requests on a fresh 4-slot server go round the never-used slots, highest first (llama.cpp's tie-break); with
    prompts of one text, each finds the slot that holds the last one:

    >>> for placement in ["lru", "prefix"]:
    ...     r = simulate_llm(n_requests=3, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=4,
    ...                      arrivals=[0.0, 1.0, 2.0], slot_placement=placement)
    ...     print(placement, r.slot)
    lru [3 2 1]
    prefix [3 3 3]

    One request alone, 4 output tokens at 10 ms a step, takes 40 ms; eight offline requests of 8, 7, ..., 1
    tokens in static batches of 4 take 8 + 4 steps; continuously batched, 9 (36 tokens, 4 a step):

    >>> simulate_llm(n_requests=1, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=8).e2e
    array([0.04])
    >>> lengths = [8, 7, 6, 5, 4, 3, 2, 1]
    >>> for scheduling in ["static", "continuous"]:
    ...     r = simulate_llm(n_requests=8, prompt_tokens=16, output_tokens=lengths, step_time=1.0,
    ...                      max_num_seqs=4, scheduling=scheduling)
    ...     print(scheduling, r.makespan, r.throughput)
    static 12.0 3.0
    continuous 9.0 4.0

    A 2 ms overhead before and 1 ms after a lone request add exactly that to its TTFT and e2e:

    >>> r = simulate_llm(n_requests=1, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=8,
    ...                  request_overhead=0.002, response_overhead=0.001)
    >>> r.ttft.round(6), r.e2e.round(6), r.tpot.round(6)
    (array([0.012]), array([0.043]), array([0.01]))

    A 3 ms wake-up after 0.2 s idle: of requests at 0, 0.1 and 1.0 s (each alone, 40 ms), the first and the
    third find the engine idle long enough, and their first step takes 13 ms:

    >>> r = simulate_llm(n_requests=3, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=8,
    ...                  arrivals=[0.0, 0.1, 1.0], wake=0.003, idle_after=0.2)
    >>> r.ttft.round(6), r.e2e.round(6), r.wakes
    (array([0.013, 0.01 , 0.013]), array([0.043, 0.04 , 0.043]), 2)
    """
    n = check_count("n_requests", n_requests)
    block_size = check_count("block_size", block_size)
    prompt, keys = _prompts(prompts, prompt_tokens, prefix_caching, n, block_size)
    if prefix_caching and kv_allocation != "paged":
        raise ValueError("prefix_caching needs kv_allocation='paged': cached blocks are shared paged blocks")
    if prefix_caching and slot_placement is not None:
        raise ValueError("prefix_caching and slot_placement: llama.cpp's slots keep one prompt each, not a shared "
                         "block pool; simulate one or the other")
    output = _lengths("output_tokens", output_tokens, n)
    max_num_seqs = check_count("max_num_seqs", max_num_seqs)
    if scheduling not in ("continuous", "static"):
        raise ValueError(f"scheduling must be 'continuous' or 'static', got {scheduling!r}")
    if kv_allocation not in ("paged", "reserve_max"):
        raise ValueError(f"kv_allocation must be 'paged' or 'reserve_max', got {kv_allocation!r}")
    for name, flag in [("prefill_first", prefill_first), ("chunked_prefill", chunked_prefill)]:
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    check_fraction("warmup", warmup, allow_zero=True)
    seed = check_non_negative_int("seed", seed)
    times = _arrivals(arrival_rate, arrivals, n, seed)
    similarity, cached = _placement(slot_placement, slot_prompt_similarity, slot_prompts, max_num_seqs)
    step = _step_time(step_time, placed=slot_placement is not None)
    costs = step_costs(step_time, request_overhead=request_overhead, response_overhead=response_overhead,
                       wake=wake, idle_after=idle_after)
    before, after, wake_s, idle_s = costs.request_overhead, costs.response_overhead, costs.wake, costs.idle_after

    # The most a request ever holds in the cache: prompt + output - 1 (its last token is never fed back).
    footprint = prompt + output - 1
    reserve = None
    if kv_allocation == "reserve_max":
        longest = int(output.max()) if max_tokens is None else check_count("max_tokens", max_tokens)
        if output.max() > longest:
            raise ValueError(f"max_tokens ({longest}) is below the longest output_tokens ({int(output.max())})")
        reserve = -(-(prompt + longest) // block_size)
    num_blocks: float = math.inf
    if kv_cache_tokens is not None:
        cache = check_count("kv_cache_tokens", kv_cache_tokens)
        num_blocks = cache // block_size
        need = reserve if reserve is not None else -(-footprint // block_size)
        worst = int(np.argmax(need))
        if need[worst] > num_blocks:
            what = "prompt + max_tokens" if reserve is not None else "prompt + output - 1 tokens"
            raise ValueError(
                f"kv_cache_tokens={cache} ({num_blocks} blocks of {block_size}) cannot hold request {worst}: "
                f"its {what} need {int(need[worst])} blocks; raise kv_cache_tokens or shorten the request")
    budget: float = math.inf
    if max_num_batched_tokens is not None:
        budget = check_count("max_num_batched_tokens", max_num_batched_tokens)
        if budget < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({budget}) must be >= max_num_seqs ({max_num_seqs}): "
                             "a step of max_num_seqs decoding sequences needs one token each (vLLM's rule too)")
        whole = prefill_first or not chunked_prefill
        # A prefill that may not be chunked must fit one step; after a preemption it is prompt + output so far.
        longest_prefill = int((footprint if kv_cache_tokens is not None and reserve is None else prompt).max())
        if whole and budget < longest_prefill:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) is below the longest prefill ({longest_prefill} tokens), "
                "which must fit one step when prefills are not chunked; raise it or allow chunked_prefill")

    ready = times + before if before else times     # when each request may first be scheduled
    engine = LLMEngine(prompt.tolist(), output.tolist(), ready.tolist(), max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=budget, num_blocks=num_blocks, block_size=block_size,
                       reserve=None if reserve is None else reserve.tolist(), chunked_prefill=bool(chunked_prefill),
                       prefill_first=bool(prefill_first), static=scheduling == "static", wake=wake_s,
                       idle_after=idle_s, placement=slot_placement, slot_prompt_similarity=similarity,
                       slot_prompts=cached, prefix_keys=keys)
    engine.run(step, None if callable(step_time) else float(step_time))
    return replace(_result(engine, times, num_blocks, block_size, int(warmup * n), before, after),
                   wake=wake_s, idle_after=idle_s, wakes=engine.wakes,
                   slot=None if slot_placement is None else np.array([s.slot for s in engine.seqs]),
                   prompt_tokens=prompt,
                   cached_tokens=np.maximum(np.array(list(map(attrgetter("cached"), engine.seqs))), 0))


def _lengths(name: str, value: Lengths, n: int) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim == 0:
        array = np.full(n, array)
    if array.shape != (n,):
        raise ValueError(f"{name} must be an int or one value per request ({n}), got shape {array.shape}")
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu" or np.any(array < 1):
        bad = array if array.dtype.kind not in "iuf" else array[~(array >= 1)][:1]
        raise ValueError(f"{name} must be whole numbers >= 1, got {bad!r}")
    return array.astype(np.int64)


def _prompts(prompts: Sequence[Sequence[int]] | None, prompt_tokens: Lengths | None, prefix_caching: bool,
             n: int, block_size: int) -> tuple[np.ndarray, list[list[int]] | None]:
    # The prompt lengths, and with prefix caching each prompt's full-block keys; bad input named before any run.
    if not isinstance(prefix_caching, (bool, np.bool_)):
        raise ValueError(f"prefix_caching must be True or False, got {prefix_caching!r}")
    if prompts is None:
        if prefix_caching:
            raise ValueError("prefix_caching needs prompts=: one sequence of token ids per request (the cache "
                             "matches token ids, not lengths)")
        if prompt_tokens is None:
            raise ValueError("prompt_tokens (or prompts) is required: one length per request, or an int")
        return _lengths("prompt_tokens", prompt_tokens, n), None
    if isinstance(prompts, (str, bytes)) or len(prompts) != n:
        raise ValueError(f"prompts must hold one sequence of token ids per request ({n}), got {type(prompts).__name__}"
                         f" of length {len(prompts)}")
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, (str, bytes)) or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                                  for t in p):
            raise ValueError(f"prompts[{i}] must be a sequence of integer token ids, got {str(p)[:60]!r}")
        if len(p) < 1:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token id")
        ids.append([int(t) for t in p])
    lengths = np.array([len(p) for p in ids], dtype=np.int64)
    if prompt_tokens is not None:
        given = _lengths("prompt_tokens", prompt_tokens, n)
        if not np.array_equal(given, lengths):
            i = int(np.flatnonzero(given != lengths)[0])
            raise ValueError(f"prompts and prompt_tokens disagree: prompts[{i}] has {lengths[i]} token ids, "
                             f"prompt_tokens says {given[i]} (give prompts alone: its lengths are the prompt lengths)")
    return lengths, block_keys(ids, block_size) if prefix_caching else None


def _arrivals(arrival_rate: float | None, arrivals: Sequence[float] | np.ndarray | None, n: int,
              seed: int) -> np.ndarray:
    if arrivals is not None:
        times = np.asarray(arrivals, dtype=float)
        if times.shape != (n,):
            raise ValueError(f"arrivals must hold one time per request ({n}), got shape {times.shape}")
        if not np.all(np.isfinite(times)) or np.any(times < 0) or np.any(np.diff(times) < 0):
            raise ValueError("arrivals must be finite, non-negative and sorted (requests are served FCFS)")
        return times
    if arrival_rate is None:
        return np.zeros(n)
    rate = check_number("arrival_rate", arrival_rate)
    return np.random.default_rng(seed).exponential(1.0 / rate, n).cumsum()


def _step_time(step_time: StepTimeArg, placed: bool = False) -> Callable[..., float]:
    # Fail before anything runs if step_time cannot be called as documented (with slots placed: four arguments).
    if callable(step_time):
        args = (1, 1, 2, 1) if placed else (1, 0, 1)
        if placed:
            try:
                inspect.signature(step_time).bind(*args)
            except TypeError as error:
                raise ValueError("step_time must take a fourth argument, extra_batches (the step's micro-batches "
                                 f"beyond its first), when slot_placement is set: {error}") from None
            except ValueError:
                pass                          # no signature to read (a builtin): the call below will say
        probe = step_time(*args)
        check_number(f"step_time{args}".replace(",)", ")"), probe)
        return step_time
    seconds = check_number("step_time", step_time)
    return lambda prefill, decode, kv, *extra: seconds


def _placement(placement: str | None, similarity: float | None, slot_prompts: Sequence[int] | None,
               slots: int) -> tuple[float, list[int] | None]:
    # Check the slot-placement arguments; returns the similarity threshold and each slot's cached prompt length.
    if placement is None:
        for name, value in (("slot_prompts", slot_prompts), ("slot_prompt_similarity", similarity)):
            if value is not None:
                raise ValueError(f"{name} needs slot_placement ('lru' or 'prefix'): without it no slot is placed")
        return 0.1, None
    if placement not in ("lru", "prefix"):
        raise ValueError(f"slot_placement must be None, 'lru' or 'prefix', got {placement!r}")
    if similarity is None:
        similarity = 0.1                     # llama.cpp's default --slot-prompt-similarity
    if isinstance(similarity, bool) or not (isinstance(similarity, (int, float)) and 0 <= similarity < 1):
        raise ValueError(f"slot_prompt_similarity must be a fraction in [0, 1), got {similarity!r}")
    cached = [0] * slots
    if slot_prompts is not None:
        cached = list(slot_prompts)
        if len(cached) != slots or not all(isinstance(c, (int, np.integer)) and c >= 0 for c in cached):
            raise ValueError(f"slot_prompts must hold one whole number >= 0 per slot (max_num_seqs = {slots}), "
                             f"got {slot_prompts!r}")
    return float(similarity), [int(c) for c in cached]


def _result(e: LLMEngine, times: np.ndarray, num_blocks: float, block_size: int, skip: int,
            request_overhead: float, response_overhead: float) -> LLMResult:
    seqs = _sequences(e)
    first, generated = seqs["first_token"], seqs["generated"]
    finish = seqs["finish_time"] + response_overhead
    end, dt, prefill, decode, kv_tokens, kv_blocks = _steps(e)
    runs = _token_runs(e, seqs)
    max_itl = _max_token_gaps(seqs["max_gap"], end[decode > 0], runs)
    slots_time = float(np.sum(dt * kv_blocks)) * block_size
    makespan = float(finish.max() - times.min())
    window = float(finish[skip:].max() - times[skip])
    return LLMResult(
        arrival=times, first_token=first, finish=finish, output_tokens=generated, max_itl=max_itl,
        throughput=float(generated[skip:].sum() / window) if window > 0 else math.inf,
        request_throughput=float((len(times) - skip) / window) if window > 0 else math.inf,
        makespan=makespan, preemptions=e.preemptions,
        kv_utilization=float(np.sum(dt * kv_tokens) / slots_time) if slots_time > 0 else math.nan,
        kv_occupancy=(float(slots_time / (num_blocks * block_size * makespan))
                      if num_blocks != math.inf and makespan > 0 else math.nan),
        warmup=skip, steps_end=end, steps_prefill_tokens=prefill, steps_decode_seqs=decode,
        steps_kv_tokens=kv_tokens, steps_kv_slots=kv_blocks * block_size, request_overhead=request_overhead,
        response_overhead=response_overhead, token_runs=runs)


def _steps(e: LLMEngine) -> tuple[np.ndarray, ...]:
    # The engine's runs of identical steps, one entry per step: end, duration, prefill tokens, decoding
    # sequences, KV tokens held and blocks allocated.
    log = e.runs
    k = np.array(log.steps, dtype=np.int64)
    starts = np.cumsum(k) - k
    offset = np.arange(int(k.sum())) - np.repeat(starts, k)     # the step's position in its run
    dt = np.repeat(np.array(log.duration), k)
    end = np.repeat(np.array(log.start), k) + (offset + 1) * dt
    prefill, decode, kv_tokens, blocks, pattern = (
        np.repeat(np.array(getattr(log, name), dtype=np.int64), k)
        for name in ("prefill_tokens", "decode_seqs", "kv_tokens", "kv_blocks", "pattern"))
    kv_tokens += offset * decode
    if e.patterns:
        # In a run of decodes, step m allocates needs[m % block_size] blocks; add them up within each run.
        table = np.array(sorted(e.patterns, key=e.patterns.__getitem__), dtype=np.int64)
        needs = np.zeros(len(offset), dtype=np.int64)
        later = (pattern >= 0) & (offset > 0)
        needs[later] = table[pattern[later], offset[later] % e.block_size]
        total = np.cumsum(needs)
        blocks += total - np.repeat(total[starts], k)
    return end, dt, prefill, decode, kv_tokens, blocks


def _sequences(e: LLMEngine) -> dict[str, np.ndarray]:
    # The sequences' final state, one array per field (attrgetter: the fastest way to read a field of each).
    names = ("first_token", "finish_time", "generated", "output", "version", "decode_start", "max_gap")
    return {name: np.array(list(map(attrgetter(name), e.seqs))) for name in names}


def _token_runs(e: LLMEngine, seqs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    # Each segment (run of a request's tokens): its request, a token at `first` (a prefill's end), then one at
    # each decode step lo..hi (none if hi < lo).  A request never preempted while decoding has one segment: first
    # token, then decode steps from its decode start to its last token; the engine records only the others'.
    output = seqs["output"].astype(np.int64)
    single = np.flatnonzero(seqs["version"] == 0)
    start = seqs["decode_start"].astype(np.int64)[single]
    start[output[single] == 1] = 0                 # a one-token answer: no decode step (hi = lo - 1)
    req = np.concatenate([single, np.array(e.seg_request, dtype=np.int64)])
    first = np.concatenate([seqs["first_token"][single], e.seg_first])
    lo = np.concatenate([start, np.array(e.seg_from, dtype=np.int64)])
    hi = np.concatenate([start + output[single] - 2, np.array(e.seg_to, dtype=np.int64)])
    return req, first, lo, hi


def _max_token_gaps(max_gap: np.ndarray, decode_end: np.ndarray,
                    runs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    # Each segment's longest gap is max(decode_end[lo] - first, the longest decode-step-to-decode-step gap in
    # lo+1..hi); a request's is the longest of its segments' and of the gaps between them (max_gap).
    gaps = np.diff(decode_end)                     # gaps[k] = decode_end[k + 1] - decode_end[k]
    req, first, lo, hi = runs
    has = hi >= lo
    seg_max = np.full(len(req), np.nan)
    seg_max[has] = decode_end[lo[has]] - first[has]
    inner = hi > lo                                # gaps[lo .. hi-1]
    if inner.any():
        seg_max[inner] = np.maximum(seg_max[inner], _range_max(gaps, lo[inner], hi[inner]))
    result = max_gap.copy()
    ok = ~np.isnan(seg_max)
    np.fmax.at(result, req[ok], seg_max[ok])
    return result


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    # max(values[lo:hi]) for many non-empty ranges at once.  reduceat over the interleaved bounds reduces
    # each [lo, hi) and, between them, [hi, next lo): sorted by lo, all of that adds up to about one pass.
    order = np.argsort(lo, kind="stable")
    bounds = np.empty(2 * len(lo), dtype=np.int64)
    bounds[0::2], bounds[1::2] = lo[order], hi[order]
    padded = np.append(values, -np.inf)            # hi may be len(values)
    result = np.empty(len(lo))
    result[order] = np.maximum.reduceat(padded, bounds)[0::2]
    return result
