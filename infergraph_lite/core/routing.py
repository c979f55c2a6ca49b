"""Which server a request goes to: round robin, or prefix affinity (notebook 10).

A router in front of several LLM servers decides, per request, where it runs.  Round robin spreads requests evenly
and ignores what each server has cached.  **Prefix affinity** sends every request that starts with the same prefix
(a tenant's system prompt) to the same server, so that server's prompt cache holds it: the idea behind cache-aware
routing in SGLang's router, llm-d's and NVIDIA Dynamo's (which go further: they track what each server caches,
and weigh it against load).  Both are plain callables ``policy(request) -> server index``, used alike by the real
router (:mod:`~infergraph_lite.frameworks.llamacpp.router`) and the simulated one
(:func:`~infergraph_lite.simulation.llm_routing.simulate_routed`).

The prefix's hash is a stable one (BLAKE2b of its text or token ids), not Python's ``hash``, which changes from
one interpreter to the next for strings: the same tenant lands on the same server in every run and every process.

>>> requests = [{"system": s, "question": q} for s, q in [("A", "1"), ("B", "2"), ("A", "3"), ("A", "4")]]
>>> route(requests, RoundRobin(2))
[0, 1, 0, 1]
>>> affinity = route(requests, PrefixAffinity(2))
>>> affinity[0] == affinity[2] == affinity[3]        # every request of tenant A on one server
True
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from infergraph_lite.core.arguments import check_count

__all__ = ["PrefixAffinity", "RoundRobin", "route", "stable_hash", "system_prompt"]


def stable_hash(key: str | Sequence[int]) -> int:
    """A 64-bit hash of a text or a sequence of token ids, the same in every process and run.

    >>> stable_hash("You are a helpful assistant.") == stable_hash("You are a helpful assistant.")
    True
    >>> stable_hash([1, 2, 3]) == stable_hash((1, 2, 3)), stable_hash("a") == stable_hash("b")
    (True, False)
    """
    data = key.encode() if isinstance(key, str) else b"".join(int(t).to_bytes(8, "little", signed=True)
                                                                for t in key)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def system_prompt(request: Any) -> Any:
    """The prefix a request is routed by: its ``"system"`` entry (a mapping's) or its first element (a pair's).

    >>> system_prompt({"system": "You are terse.", "question": "Why?"}), system_prompt(("You are terse.", "Why?"))
    ('You are terse.', 'You are terse.')
    """
    if isinstance(request, Mapping):
        if "system" not in request:
            raise KeyError(f"a request routed by prefix needs a 'system' entry, got keys {sorted(request)}")
        return request["system"]
    if isinstance(request, (tuple, list)) and len(request) == 2:
        return request[0]
    raise TypeError(f"a request is {{'system': ..., 'question': ...}} or (system, question), got {request!r}")


class RoundRobin:
    """Server 0, 1, ..., n - 1, 0, ... in the order requests come, whatever they hold (thread-safe).

    >>> rr = RoundRobin(3)
    >>> [rr("anything") for _ in range(5)]
    [0, 1, 2, 0, 1]
    """

    def __init__(self, n_servers: int) -> None:
        self.n_servers = check_count("n_servers", n_servers)
        self._next = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, request: Any) -> int:
        with self._lock:
            return next(self._next) % self.n_servers

    def __repr__(self) -> str:
        return f"RoundRobin({self.n_servers})"


class PrefixAffinity:
    """The server a request's prefix hashes to: ``stable_hash(prefix(request)) % n_servers``.

    ``prefix`` reads the routing key from a request (default :func:`system_prompt`); requests with equal keys go to
    one server, whatever else they hold.  Plain hashing balances tenants only on average: with few of them one
    server may get more (``spread`` says how they fall); routers in production (SGLang's, llm-d's) also weigh each
    server's load.

    >>> affinity = PrefixAffinity(2)
    >>> affinity({"system": "tenant 7", "question": "a"}) == affinity({"system": "tenant 7", "question": "b"})
    True
    >>> affinity.spread(["tenant 0", "tenant 1", "tenant 2", "tenant 3"])     # four tenants fall 1 : 3
    {0: ['tenant 0'], 1: ['tenant 1', 'tenant 2', 'tenant 3']}
    """

    def __init__(self, n_servers: int, prefix: Callable[[Any], str | Sequence[int]] = system_prompt) -> None:
        self.n_servers = check_count("n_servers", n_servers)
        if not callable(prefix):
            raise TypeError(f"prefix must be a function request -> its routing key, got {prefix!r}")
        self.prefix = prefix

    def server_of(self, key: str | Sequence[int]) -> int:
        """The server a routing key (a system prompt) goes to."""
        return stable_hash(key) % self.n_servers

    def __call__(self, request: Any) -> int:
        return self.server_of(self.prefix(request))

    def spread(self, keys: Iterable[str | Sequence[int]]) -> dict[int, list[Any]]:
        """Which keys each server gets, servers in order (a server that gets none is left out)."""
        out: dict[int, list[Any]] = {}
        for key in keys:
            out.setdefault(self.server_of(key), []).append(key)
        return dict(sorted(out.items()))

    def __repr__(self) -> str:
        return f"PrefixAffinity({self.n_servers})"


def route(requests: Iterable[Any], policy: Callable[[Any], int]) -> list[int]:
    """The server ``policy`` picks for each request, in order (a policy with state, round robin's, advances).

    >>> route(["a", "b", "c"], RoundRobin(2))
    [0, 1, 0]
    """
    return [int(policy(r)) for r in requests]
