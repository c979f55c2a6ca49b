"""Checkers for the exercises of notebook 10, *Reusing work*: reused tokens, a workload's hit rate, a router.

>>> check_reused_tokens(lambda prompt, earlier, block_size: 0)
Not right yet: reused_tokens(prompt, earlier, block_size=4) for two prompts sharing their first 8 tokens gave 0, expected 8: count the full blocks the two prompts share, from the start
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from infergraph_lite.core.routing import PrefixAffinity, RoundRobin, route
from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.simulation.llm import simulate_llm
from infergraph_lite.simulation.llm_routing import simulate_routed
from infergraph_lite.simulation.prefix_workloads import multi_turn, shared_prefix_prompts

__all__ = ["ROUTING_SETUP", "check_prefix_hit_rate", "check_reused_tokens", "check_router", "routing_workload",
           "simulated_hit_rate"]


def _reused(prompt: Sequence[int], earlier: Sequence[int], block_size: int) -> int:
    full = 0
    for b in range((len(prompt) - 1) // block_size):
        lo, hi = b * block_size, (b + 1) * block_size
        if list(prompt[lo:hi]) != list(earlier[lo:hi]) or len(earlier) < hi:
            break
        full += 1
    return full * block_size


def _common(prompt: Sequence[int], earlier: Sequence[int]) -> int:
    n = 0
    for a, b in zip(prompt, earlier):
        if a != b:
            break
        n += 1
    return n


# (what the case is, prompt, earlier, block_size)
_CASES: list[tuple[str, list[int], list[int], int]] = [
    ("two prompts sharing their first 8 tokens", list(range(8)) + [90, 91, 92], list(range(8)) + [50, 51], 4),
    ("two prompts sharing their first 10 tokens (two full blocks and half of a third)",
     list(range(10)) + [90, 91, 92, 93], list(range(10)) + [50, 51, 52, 53], 4),
    ("two prompts that differ in their first token", [7] + list(range(1, 12)), list(range(12)), 4),
    ("a prompt of 12 tokens identical to the earlier one", list(range(12)), list(range(12)), 4),
    ("a prompt of 13 tokens identical to the earlier one", list(range(13)), list(range(13)), 4),
    ("a prompt that is the earlier one plus 5 tokens", list(range(16)) + [70, 71, 72, 73, 74], list(range(16)), 16),
    ("a prompt of 3 tokens after a longer one it begins", [0, 1, 2], list(range(20)), 2),
    ("blocks of one token, 6 tokens in common", list(range(6)) + [99], list(range(6)) + [98], 1),
]


@checker
def check_reused_tokens(reused_tokens: Callable[[Sequence[int], Sequence[int], int], int]) -> str:
    """Exercise 10.1: the tokens ``prompt`` reuses when ``earlier`` is in a block-hash prefix cache."""
    for what, prompt, earlier, block_size in _CASES:
        got = reused_tokens(list(prompt), list(earlier), block_size)
        want = _reused(prompt, earlier, block_size)
        if got == want:
            continue
        common = _common(prompt, earlier)
        uncapped = min(common, len(earlier)) // block_size * block_size
        hint = "count the full blocks the two prompts share, from the start"
        if got == common and common % block_size:
            hint = ("that counts the tokens in common, but only full blocks are cached: a block that is only "
                    "partly the same has another name")
        elif got == uncapped and uncapped > want:
            hint = ("one token must always be computed (the model needs the last prompt token's output): at most "
                    "(len(prompt) - 1) // block_size blocks are reused")
        elif got == want + block_size or got >= len(prompt) - 1 > want:
            hint = "at most (len(prompt) - 1) // block_size blocks: one token is always computed"
        raise WrongAnswer(f"reused_tokens(prompt, earlier, block_size={block_size}) for {what} gave {got!r}, "
                          f"expected {want}: {hint}")
    return "full blocks in common from the start, and never the block holding the last prompt token."


def simulated_hit_rate(prompts: Sequence[Sequence[int]], block_size: int) -> float:
    """The module's answer to exercise 10.2: requests one at a time, a cache that never evicts."""
    r = simulate_llm(n_requests=len(prompts), prompts=prompts, output_tokens=1, step_time=0.001, max_num_seqs=1,
                     arrivals=np.arange(len(prompts), dtype=float), block_size=block_size, prefix_caching=True)
    return r.prefix_hit_rate


def _workloads() -> list[tuple[str, list[list[int]], int]]:
    tenants = shared_prefix_prompts(40, system_tokens=100, question_tokens=20, n_systems=3, seed=11)
    chats = multi_turn(4, 4, system_tokens=50, user_tokens=10, answer_tokens=20, seed=12).prompts
    same = [list(range(64))] * 5
    return [("three tenants' requests", tenants, 16), ("three tenants' requests", tenants, 8),
            ("multi-turn chats", chats, 16), ("five identical 64-token prompts", same, 16)]


@checker
def check_prefix_hit_rate(prefix_hit_rate: Callable[[Sequence[Sequence[int]], int], float]) -> str:
    """Exercise 10.2: a workload's prefix hit rate, requests one at a time, nothing evicted."""
    for what, prompts, block_size in _workloads():
        got = prefix_hit_rate([list(p) for p in prompts], block_size)
        want = simulated_hit_rate(prompts, block_size)
        if isinstance(got, (int, float, np.floating)) and abs(float(got) - want) < 1e-9:
            continue
        hint = "cached tokens of every request over the prompt tokens of every request"
        if isinstance(got, (int, float, np.floating)) and float(got) > 1:
            hint = "a rate is a fraction: cached prompt tokens over all prompt tokens"
        elif isinstance(got, (int, float, np.floating)) and float(got) < want:
            hint = ("lower than the module: does each request look for its blocks among *every* earlier request's, "
                    "not only the previous one's?")
        elif isinstance(got, (int, float, np.floating)):
            hint = "higher than the module: only full blocks hit, and one token is always computed"
        raise WrongAnswer(f"for {what} in blocks of {block_size} you said {got!r}, expected {want:.4f}: {hint}")
    return "the hit rate of each workload, as simulate_llm counts it."


def _step_time(prefill: int, decode: int, kv: int) -> float:
    return 0.005 + 0.0001 * prefill       # seconds: a step costs more the more prompt tokens it computes


# Exercise 10.3: two sequences per server, a KV cache that holds two of these requests (140 tokens, 4 answered)
ROUTING_SETUP: dict[str, Any] = {"step_time": _step_time, "max_num_seqs": 2, "block_size": 16,
                                 "kv_cache_tokens": 2 * 144}


def routing_workload(n_tenants: int = 6, n_requests: int = 120, seed: int = 0) -> list[dict[str, tuple[int, ...]]]:
    """Requests ``{"system": token ids, "question": token ids}``, tenants in a random order (seeded)."""
    rng = np.random.default_rng(seed)
    systems = [tuple(int(t) for t in rng.integers(0, 32_000, 128)) for _ in range(n_tenants)]
    tenant = rng.integers(0, n_tenants, n_requests)
    return [{"system": systems[t], "question": tuple(int(x) for x in rng.integers(0, 32_000, 12))} for t in tenant]


def _hit_rate(requests: list[dict[str, tuple[int, ...]]], servers: list[int], n_servers: int) -> float:
    prompts = [list(r["system"]) + list(r["question"]) for r in requests]
    return simulate_routed(prompts, servers, n_servers=n_servers, output_tokens=4,
                           arrivals=0.05 * np.arange(len(prompts)), **ROUTING_SETUP).prefix_hit_rate


@checker
def check_router(make_router: Callable[[int], Callable[[dict[str, Any]], int]]) -> str:
    """Exercise 10.3: a prefix-affinity router that also balances tenants: ``make_router(n_servers)`` -> a rule."""
    for n_servers, n_tenants in ((2, 6), (3, 6), (3, 7)):
        requests = routing_workload(n_tenants, seed=n_servers + n_tenants)
        rule = make_router(n_servers)
        servers = [rule(dict(r)) for r in requests]
        require(all(isinstance(s, (int, np.integer)) and 0 <= s < n_servers for s in servers),
                f"with {n_servers} servers the rule must return a server index in 0..{n_servers - 1}, got "
                f"{sorted({repr(s) for s in servers})[:4]}")
        by_tenant: dict[tuple[int, ...], set[int]] = {}
        for r, s in zip(requests, servers, strict=True):
            by_tenant.setdefault(r["system"], set()).add(int(s))
        scattered = sum(len(v) > 1 for v in by_tenant.values())
        require(scattered == 0, f"{scattered} of {n_tenants} tenants were sent to more than one server: that routes "
                "by request (its whole prompt, or a counter), not by prefix; route by the system prompt alone")
        tenants_per_server = np.bincount([next(iter(v)) for v in by_tenant.values()], minlength=n_servers)
        require(tenants_per_server.max() - tenants_per_server.min() <= 1,
                f"{n_tenants} tenants on {n_servers} servers fell {tenants_per_server.tolist()}: keep the counts "
                "within one (give a new tenant the server with the fewest tenants so far)")
        ours = _hit_rate(requests, [int(s) for s in servers], n_servers)
        rr = _hit_rate(requests, route(requests, RoundRobin(n_servers)), n_servers)
        require(ours > rr, f"hit rate {ours:.2f} against round robin's {rr:.2f}")
    hashed = route(routing_workload(6, seed=8), PrefixAffinity(2))
    return (f"every tenant on one server, tenants balanced (a plain hash of six put "
            f"{np.bincount(hashed, minlength=2).tolist()} requests on the two servers), and more hits than round robin.")
