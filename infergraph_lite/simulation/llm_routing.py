"""Several simulated LLM servers behind a router, each with its own prefix cache (notebook 10).

:func:`simulate_routed` splits a workload by a routing rule's choices (:mod:`~infergraph_lite.core.routing`:
round robin, prefix affinity) and runs one :func:`~infergraph_lite.simulation.llm.simulate_llm` with
``prefix_caching=True`` per server on the requests routed there, at their own arrival times: the servers share
nothing, so each one's cache sees only its own share.  The result puts the requests back in their order, so a
hit rate, a TTFT or a throughput reads as for one server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count
from infergraph_lite.simulation.llm import LLMResult, simulate_llm

__all__ = ["RoutedResult", "simulate_routed"]


@dataclass(frozen=True)
class RoutedResult:
    """What :func:`simulate_routed` predicts, per request in the workload's order, and per server.

    ``server`` is where each request went, ``results`` each server's :class:`~infergraph_lite.simulation.llm.LLMResult`
    (None for a server that got no request); ``arrival``, ``first_token``, ``finish``, ``prompt_tokens``,
    ``cached_tokens`` and ``output_tokens`` are per request.
    """

    server: np.ndarray
    results: list[LLMResult | None]
    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray

    @property
    def ttft(self) -> np.ndarray:
        """Each request's time to first token, seconds (its server's request overhead included)."""
        return self.first_token - self.arrival

    @property
    def prefix_hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens, every server together."""
        return float(self.cached_tokens.sum() / self.prompt_tokens.sum())

    @property
    def hit_rates(self) -> list[float]:
        """Each server's own hit rate (nan for a server that got no request)."""
        return [float("nan") if r is None else r.prefix_hit_rate for r in self.results]

    @property
    def makespan(self) -> float:
        """First arrival to last finish, seconds."""
        return float(self.finish.max() - self.arrival.min())

    @property
    def throughput(self) -> float:
        """Output tokens per second over the makespan, every server together."""
        return float(self.output_tokens.sum() / self.makespan)


def simulate_routed(prompts: Sequence[Sequence[int]], servers: Sequence[int], *, output_tokens: int | Sequence[int],
                    n_servers: int | None = None, arrivals: Sequence[float] | np.ndarray | None = None,
                    **options: Any) -> RoutedResult:
    """Simulate ``n_servers`` LLM servers, each with its own prefix cache, serving ``prompts`` as routed.

    ``servers[i]`` is the server request ``i`` goes to (what a routing rule chose: ``route(requests, policy)``),
    ``prompts[i]`` its token ids, ``output_tokens`` its answer's length (one int for all, or one per request),
    ``arrivals`` when it arrives (sorted; None: all at 0).  ``options`` go to every server's ``simulate_llm``
    (``step_time``, ``max_num_seqs``, ``kv_cache_tokens``, ``block_size``, ...); ``prefix_caching`` is on.

    Two tenants' prompts alternating, 40 tokens of system prompt each, in blocks of 8: behind round robin each
    server sees both tenants, and a cache of 56 tokens holds one prompt; behind prefix affinity each server keeps
    one tenant:

    >>> from infergraph_lite.simulation.prefix_workloads import shared_prefix_prompts
    >>> prompts = shared_prefix_prompts(8, system_tokens=40, question_tokens=8, n_systems=2)
    >>> common = dict(output_tokens=2, arrivals=[float(i) for i in range(8)], step_time=0.01, max_num_seqs=1,
    ...               kv_cache_tokens=56, block_size=8)
    >>> simulate_routed(prompts, [0, 0, 1, 1, 0, 0, 1, 1], **common).prefix_hit_rate    # round robin, by pairs
    0.0
    >>> simulate_routed(prompts, [0, 1, 0, 1, 0, 1, 0, 1], **common).cached_tokens.tolist()    # by tenant
    [0, 0, 40, 40, 40, 40, 40, 40]
    """
    n = len(prompts)
    where = np.asarray(servers, dtype=int)
    if where.shape != (n,):
        raise ValueError(f"servers must give one server per prompt ({n}), got {where.shape[0] if where.ndim else 0}")
    k = check_count("n_servers", n_servers) if n_servers is not None else int(where.max()) + 1 if n else 1
    if n and (where.min() < 0 or where.max() >= k):
        raise ValueError(f"servers must be in 0..{k - 1}, got {sorted(set(where.tolist()))}")
    if "prefix_caching" in options or "prompts" in options or "n_requests" in options:
        raise TypeError("simulate_routed sets prompts, n_requests and prefix_caching itself")
    out = np.broadcast_to(np.asarray(output_tokens, dtype=int), (n,)).copy()
    arrive = np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=float)
    if arrive.shape != (n,):
        raise ValueError(f"arrivals must give one time per prompt ({n})")
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    prompt_len, cached = np.array([len(p) for p in prompts]), np.zeros(n, dtype=int)
    results: list[LLMResult | None] = []
    for s in range(k):
        mine = np.flatnonzero(where == s)
        if not len(mine):
            results.append(None)
            continue
        r = simulate_llm(n_requests=len(mine), prompts=[prompts[i] for i in mine], output_tokens=out[mine],
                         arrivals=arrive[mine], prefix_caching=True, **options)
        results.append(r)
        first[mine], finish[mine] = r.first_token, r.finish
        assert r.cached_tokens is not None
        cached[mine] = r.cached_tokens
    return RoutedResult(server=where, results=results, arrival=arrive, first_token=first, finish=finish,
                        prompt_tokens=prompt_len, cached_tokens=cached, output_tokens=out)
