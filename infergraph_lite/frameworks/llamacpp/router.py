"""Several llama.cpp servers behind a router stage, served as a GraphServer graph (notebook 10).

The router is one more stage of an inference graph (notebook 06): ``route`` picks a server for each request by a
policy (:class:`~infergraph_lite.core.routing.RoundRobin` or
:class:`~infergraph_lite.core.routing.PrefixAffinity`), and ``generate`` sends the request to that server's
client, with llama.cpp's prompt cache on, so a server that still holds the request's system prompt in a slot skips
its prefill.  :func:`router_stages` is the graph; :class:`LlamaCppRouter` starts the servers (127.0.0.1 only, each
stopped by its own PID), their clients and the :class:`~infergraph_lite.serving.graph_server.GraphServer`, and
:meth:`LlamaCppRouter.run` sends a workload on a schedule and returns every answer with the server that gave it.

A request is ``{"system": ..., "question": ..., "n_predict": ...}`` (``n_predict`` optional): its prompt is the
system prompt followed by the question, and prefix affinity routes it by the system prompt alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count
from infergraph_lite.core.routing import PrefixAffinity, RoundRobin
from infergraph_lite.core.stage import Stage
from infergraph_lite.frameworks.llamacpp.client import Completion, CompletionRequest, LlamaCppClient
from infergraph_lite.frameworks.llamacpp.model import ModelInfo, prompt_of
from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
from infergraph_lite.serving.graph_server import GraphServer

__all__ = ["LlamaCppRouter", "Routed", "policy_named", "prompt_text", "router_stages", "tenant_requests",
           "tenant_systems"]

POLICIES: dict[str, Callable[[int], Callable[[Any], int]]] = {"round_robin": RoundRobin, "prefix": PrefixAffinity}


def prompt_text(request: Mapping[str, Any]) -> str:
    """The prompt a request sends: its system prompt, then its question.

    >>> prompt_text({"system": "You are terse.", "question": " Why?"})
    'You are terse. Why?'
    """
    return str(request["system"]) + str(request["question"])


def _words() -> list[str]:
    # the tiny model's word pieces, each one token (prompt_of's words), in a fixed order
    return sorted(set(prompt_of(2000).split()))


def tenant_systems(n_tenants: int, *, words: int = 300, seed: int = 0) -> list[str]:
    """``n_tenants`` system prompts of ``words`` words each (one token each for the tiny model, plus ``<s>``),
    drawn with a seeded generator so that no two share their first word.

    >>> a, b = tenant_systems(2, words=5)
    >>> len(a.split()), a.split()[0] != b.split()[0]
    (5, True)
    """
    vocabulary = _words()
    n = check_count("n_tenants", n_tenants)
    if n > len(vocabulary):
        raise ValueError(f"at most {len(vocabulary)} tenants (one first word each)")
    rng = np.random.default_rng(seed)
    firsts = rng.choice(len(vocabulary), n, replace=False)
    return [" ".join([vocabulary[f]] + [vocabulary[i] for i in rng.integers(0, len(vocabulary),
                                                                            check_count("words", words) - 1)])
            for f in firsts]


def tenant_requests(systems: Sequence[str], n_requests: int, *, question_words: int = 12, n_predict: int = 8,
                    seed: int = 0, balanced: bool = False) -> list[dict[str, Any]]:
    """``n_requests`` requests, each from a tenant drawn at random (seeded) among ``systems``, with a question of
    its own of ``question_words`` words.  ``balanced=True``: every tenant sends the same number of requests
    (``n_requests`` must be a multiple of the tenants), in a random order.

    >>> reqs = tenant_requests(["A B", "C D"], 3, question_words=2, seed=1)
    >>> [r["system"] for r in reqs], reqs[0]["question"].startswith(" "), reqs[0]["n_predict"]
    (['A B', 'C D', 'C D'], True, 8)
    >>> sorted(r["system"] for r in tenant_requests(["A B", "C D"], 4, balanced=True))
    ['A B', 'A B', 'C D', 'C D']
    """
    vocabulary = _words()
    rng = np.random.default_rng(seed)
    n = check_count("n_requests", n_requests)
    if balanced and n % len(systems):
        raise ValueError(f"balanced: n_requests ({n}) must be a multiple of the {len(systems)} tenants")
    tenant = rng.permutation(np.arange(n) % len(systems)) if balanced else rng.integers(0, len(systems), n)
    asked = rng.integers(0, len(vocabulary), (len(tenant), check_count("question_words", question_words)))
    return [{"system": systems[t], "question": " " + " ".join(vocabulary[i] for i in q), "n_predict": n_predict}
            for t, q in zip(tenant.tolist(), asked.tolist(), strict=True)]


def policy_named(policy: str | Callable[[Any], int], n_servers: int) -> Callable[[Any], int]:
    """``"round_robin"`` or ``"prefix"`` (prefix affinity by system prompt) for ``n_servers``; a callable as is.

    >>> policy_named("prefix", 2)
    PrefixAffinity(2)
    """
    if callable(policy):
        return policy
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)} or a callable request -> server, got {policy!r}")
    return POLICIES[policy](n_servers)


def router_stages(clients: Sequence[Any], policy: Callable[[Any], int], *,
                  concurrency: int = 2) -> dict[str, tuple[Stage, list[str]]]:
    """The graph: ``route`` (the policy, per request) then ``generate`` (the chosen client's ``complete``).

    ``clients[s]`` serves the requests routed to server ``s``: anything with ``complete(CompletionRequest)``
    (its ``submit``, where it has one, is used instead, so that a client's own bound on requests in flight holds).
    ``concurrency`` is how many requests are in flight at once, all servers together (``generate``'s replicas:
    each blocks on its answer's stream).  Every request's answer is ``{"route": server, "generate": answer}``.

    >>> class Echo:
    ...     def __init__(self, name):
    ...         self.name = name
    ...     def complete(self, request):
    ...         return f"{self.name}: {request.prompt}"
    >>> stages = router_stages([Echo("a"), Echo("b")], RoundRobin(2), concurrency=1)
    >>> with GraphServer(stages) as graph:
    ...     answers = [graph.submit({"request": {"system": "S.", "question": q}}).result() for q in "xy"]
    >>> [a["generate"] for a in answers]
    ['a: S.x', 'b: S.y']
    """
    if not clients:
        raise ValueError("a router needs at least one server's client")
    for c in clients:
        if not callable(getattr(c, "complete", None)):
            raise TypeError(f"each client needs complete(request), got {c!r}")
    n = len(clients)

    def route(requests: list[Any]) -> list[int]:
        chosen = [int(policy(r)) for r in requests]
        bad = [s for s in chosen if not 0 <= s < n]
        if bad:
            raise ValueError(f"the policy chose server {bad[0]}, not one of 0..{n - 1}")
        return chosen

    def generate(pairs: list[tuple[Mapping[str, Any], int]]) -> list[Any]:
        # through the client's submit where it has one, so that its max_in_flight bounds what its server holds
        out = []
        for request, server in pairs:
            item = CompletionRequest(prompt_text(request), request.get("n_predict"))
            submit = getattr(clients[server], "submit", None)
            out.append(submit(item).result() if submit is not None else clients[server].complete(item))
        return out

    return {"route": (Stage(fn=route, max_batch_size=None), ["request"]),
            "generate": (Stage(fn=generate, max_batch_size=1, replicas=check_count("concurrency", concurrency)),
                         ["request", "route"])}


@dataclass(frozen=True)
class Routed:
    """One answered request: the server it went to and its :class:`Completion`; ``arrival``: its scheduled time
    (seconds from the run's start); ``queued``: from then until its client sent it (waiting in the router)."""

    server: int
    completion: Completion
    arrival: float
    queued: float

    @property
    def ttft(self) -> float:
        """Time to first token from the request's arrival at the router (its wait there included), seconds."""
        return self.queued + self.completion.ttft


class LlamaCppRouter:
    """``n_servers`` llama.cpp servers behind a router stage in a :class:`GraphServer`; stops them all by PID.

    ``model`` is served by every server, each started with ``server_options`` (``n_parallel``, ``n_ctx``,
    ``cache_ram_mib``, ...); the clients get ``client_options`` (``n_predict``, ...) and ``cache_prompt=True``
    unless told otherwise.  ``policy`` is ``"round_robin"``, ``"prefix"`` or a callable request -> server.
    ``concurrency`` bounds the requests in flight (default: every slot of every server); a client's
    ``max_in_flight`` (in ``client_options``; default ``concurrency``) bounds those on its server.

    >>> from infergraph_lite.frameworks.llamacpp.model import write_tiny_llama
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> requests = [{"system": "the model serve batch token cache ", "question": q} for q in ["a", "b", "c"]]
    >>> with LlamaCppRouter(model, policy="prefix", client_options={"n_predict": 2}) as router:
    ...     answers = router.run(requests, arrivals=[0.0, 0.5, 1.0])
    ...     pids = router.pids
    >>> len({a.server for a in answers}), [a.completion.cached_tokens > 0 for a in answers]
    (1, [False, True, True])
    >>> import psutil; any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
    False
    """

    def __init__(self, model: ModelInfo | str, *, n_servers: int = 2, policy: str | Callable[[Any], int] = "prefix",
                 concurrency: int | None = None, server_options: Mapping[str, Any] | None = None,
                 client_options: Mapping[str, Any] | None = None) -> None:
        self.n_servers = check_count("n_servers", n_servers)
        self.policy = policy_named(policy, self.n_servers)
        server_options = dict(server_options or {})
        slots = int(server_options.get("n_parallel", 1))
        self.concurrency = check_count("concurrency", concurrency if concurrency is not None else slots * n_servers)
        client_options = {"cache_prompt": True, "max_in_flight": self.concurrency, **(client_options or {})}
        self.servers: list[LlamaCppServer] = []
        self.clients: list[LlamaCppClient] = []
        self.graph: GraphServer | None = None
        try:
            for _ in range(self.n_servers):
                self.servers.append(LlamaCppServer(model, **server_options))
            self.clients = [s.client(**client_options) for s in self.servers]
            self.graph = GraphServer(router_stages(self.clients, self.policy, concurrency=self.concurrency),
                                     name="llm-router")
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The servers' PIDs, in server order."""
        return [s.pid for s in self.servers if s.pid is not None]

    def submit(self, request: Mapping[str, Any]) -> Future[dict[str, Any]]:
        """Route and send one request; its Future holds ``{"route": server, "generate": Completion}``."""
        if self.graph is None:
            raise RuntimeError("this router is closed")
        return self.graph.submit({"request": request})

    def run(self, requests: Sequence[Mapping[str, Any]], arrivals: Sequence[float] | np.ndarray | None = None, *,
            timeout: float = 120.0) -> list[Routed]:
        """Send request ``i`` at ``arrivals[i]`` seconds from now (open loop; None: all at once) and wait for all.

        Returns one :class:`Routed` per request, in request order; a failed request raises its error.
        """
        times = np.zeros(len(requests)) if arrivals is None else np.asarray(arrivals, dtype=float)
        if times.shape != (len(requests),) or np.any(np.diff(times) < 0):
            raise ValueError("arrivals must be one sorted time per request")
        start = time.perf_counter()
        futures = []
        for request, at in zip(requests, times.tolist(), strict=True):
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(self.submit(request))
        deadline = time.perf_counter() + timeout
        answers = [f.result(timeout=max(deadline - time.perf_counter(), 0.0)) for f in futures]
        return [Routed(int(a["route"]), a["generate"], float(t), a["generate"].sent_at - start - float(t))
                for a, t in zip(answers, times, strict=True)]

    def close(self) -> None:
        """Serve what is inside, then stop the graph, the clients and every server (by PID)."""
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.close()

    def __enter__(self) -> LlamaCppRouter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LlamaCppRouter({self.n_servers} servers, {self.policy!r}, pids {self.pids})"
