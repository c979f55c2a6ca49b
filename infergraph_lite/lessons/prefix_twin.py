"""llama.cpp's prompt cache beside the simulator (notebook 10, section 5; benchmarks/bench_prefix_cache.py).

Two runs of the same requests, one after another on a one-slot server, with the prompt cache off and on.  The
step cost is fitted from the server's own ``timings``: a line through the two runs' median prefill steps against
the tokens each evaluated, the median decode step, and the rest of a request's TTFT as a fixed overhead.  Each run
is then replayed through ``simulate_llm`` with ``block_size=1`` (llama.cpp reuses token by token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.simulation.llm import LLMResult, simulate_llm

__all__ = ["CacheFit", "fit_cache_runs", "replay_cache_run"]


@dataclass(frozen=True)
class CacheFit:
    """A step cost fitted from a cache-off and a cache-on run (seconds).

    >>> fit = CacheFit(base=0.002, per_token=0.0001, decode=0.0008, overhead=0.003)
    >>> round(fit.step(100, 0, 0), 4), fit.step(0, 1, 50)
    (0.012, 0.0008)
    """

    base: float        # a prefill step's fixed part
    per_token: float   # and its part per prompt token evaluated
    decode: float      # a decode step
    overhead: float    # a request's time outside the steps (HTTP, tokenizing, the stream)

    def step(self, prefill: float, decoding: float, kv: float) -> float:
        """``step_time(prefill_tokens, decode_seqs, kv_tokens)`` for ``simulate_llm`` (one slot)."""
        return self.base + self.per_token * prefill if prefill else self.decode


def fit_cache_runs(off: Sequence[Any], on: Sequence[Any]) -> CacheFit:
    """Fit :class:`CacheFit` from the completions of the cache-off and cache-on runs (their first requests left out).

    >>> from types import SimpleNamespace as R
    >>> def done(evaluated, prompt_ms, ttft): return R(prompt_evaluated=evaluated, ttft=ttft,
    ...     server_timings={"prompt_ms": prompt_ms, "predicted_per_token_ms": 0.8})
    >>> fit = fit_cache_runs([done(300, 32.0, 0.035)] * 3, [done(12, 3.2, 0.0062)] * 3)
    >>> round(1e3 * fit.base, 2), round(1e3 * fit.per_token, 3), round(1e3 * fit.overhead, 1)
    (2.0, 0.1, 3.0)
    """
    runs = (list(off)[1:], list(on)[1:])
    if not all(runs):
        raise ValueError("fit_cache_runs: each run needs at least two completions (its first is left out)")
    tokens, prefill = ([float(np.median([f(d) for d in run])) for run in runs]
                       for f in (lambda d: d.prompt_evaluated, lambda d: d.server_timings["prompt_ms"] / 1000))
    if tokens[0] == tokens[1]:
        raise ValueError("fit_cache_runs: both runs evaluated as many tokens; the cache-on run hit nothing")
    per_token = (prefill[0] - prefill[1]) / (tokens[0] - tokens[1])
    base = prefill[1] - per_token * tokens[1]
    decode = float(np.median([d.server_timings["predicted_per_token_ms"] for d in runs[1]])) / 1000
    partial = CacheFit(base, per_token, decode, 0.0)
    overhead = max(0.0, float(np.median([d.ttft - partial.step(d.prompt_evaluated, 0, 0) for d in runs[0] + runs[1]])))
    return CacheFit(base, per_token, decode, overhead)


def replay_cache_run(done: Sequence[Any], prompts: Sequence[Sequence[int]], fit: CacheFit, *, caching: bool,
                     held: Sequence[int] | None = None, output_tokens: int = 8, slot_tokens: int = 512) -> LLMResult:
    """One run's requests (their token ids ``prompts``, their send times) through a one-slot ``simulate_llm``.

    ``held``: the prompt the slot holds before the run (replayed first, a second ahead); ``slot_tokens``: a KV pool
    of the slot's size, so that the simulated cache remembers about as much as the slot does.  The result's first
    request is ``held``'s when given.
    """
    sent = np.array([d.sent_at for d in done])
    before = [list(held)] if held is not None else []
    arrivals = [0.0] * len(before) + list(len(before) * 1.0 + sent - sent[0])
    return simulate_llm(n_requests=len(before) + len(prompts), prompts=[*before, *map(list, prompts)],
                        output_tokens=output_tokens, step_time=fit.step, max_num_seqs=1, arrivals=arrivals,
                        block_size=1, kv_cache_tokens=slot_tokens, request_overhead=fit.overhead,
                        prefix_caching=caching)
