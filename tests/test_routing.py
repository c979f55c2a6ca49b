"""Routing rules (round robin, prefix affinity), the simulated router and the router stage, without a server.

The real router in front of llama.cpp servers is tested in tests/test_llamacpp.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from infergraph_lite import simulate_llm
from infergraph_lite.core.execute import NodeError
from infergraph_lite.core.routing import PrefixAffinity, RoundRobin, route, stable_hash, system_prompt
from infergraph_lite.frameworks.llamacpp.router import policy_named, router_stages
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.simulation.llm_routing import simulate_routed
from infergraph_lite.simulation.prefix_workloads import shared_prefix_prompts


def test_the_prefix_hash_is_the_same_in_another_interpreter():
    # Python's own hash() of a str changes per process (PYTHONHASHSEED): a router using it would move tenants.
    code = "from infergraph_lite.core.routing import stable_hash; print(stable_hash('tenant 3'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "", "PYTHONPATH": ":".join(sys.path)})
    assert int(other.stdout) == stable_hash("tenant 3")


def test_round_robin_cycles_and_counts_every_request_once_across_threads():
    rr = RoundRobin(3)
    seen: list[int] = []
    lock = threading.Lock()

    def work():
        for _ in range(100):
            s = rr(None)
            with lock:
                seen.append(s)

    threads = [threading.Thread(target=work) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert np.bincount(seen).tolist() == [134, 133, 133]


def test_prefix_affinity_routes_by_the_system_prompt_only():
    affinity = PrefixAffinity(4)
    tenants = [f"system prompt {k}" for k in range(8)]
    for system in tenants:
        servers = {affinity({"system": system, "question": f"q{i}"}) for i in range(5)}
        assert len(servers) == 1, "one tenant, one server"
    assert sum(len(v) for v in affinity.spread(tenants).values()) == 8
    assert affinity(("system prompt 0", "other")) == affinity({"system": "system prompt 0", "question": "x"})


def test_a_request_without_a_system_prompt_is_named():
    with pytest.raises(KeyError, match="system"):
        system_prompt({"prompt": "hello"})
    with pytest.raises(TypeError, match="system"):
        system_prompt("hello")
    with pytest.raises(ValueError, match="policy"):
        policy_named("random", 2)


def test_route_lists_each_requests_server():
    assert route(range(5), RoundRobin(2)) == [0, 1, 0, 1, 0]


# --- the simulated router -------------------------------------------------------------------------------------

COMMON = dict(step_time=0.01, max_num_seqs=1, block_size=8, kv_cache_tokens=56)


def tenants_workload(n=12, n_systems=2):
    prompts = shared_prefix_prompts(n, system_tokens=40, question_tokens=8, n_systems=n_systems)
    return prompts, [float(i) for i in range(n)]


def test_one_server_is_simulate_llm_itself():
    prompts, arrivals = tenants_workload()
    routed = simulate_routed(prompts, [0] * len(prompts), output_tokens=2, arrivals=arrivals, **COMMON)
    alone = simulate_llm(n_requests=len(prompts), prompts=prompts, output_tokens=2, arrivals=arrivals,
                         prefix_caching=True, **COMMON)
    np.testing.assert_array_equal(routed.cached_tokens, alone.cached_tokens)
    np.testing.assert_allclose(routed.ttft, alone.ttft)
    assert routed.prefix_hit_rate == pytest.approx(alone.prefix_hit_rate)


def test_each_server_caches_only_what_was_routed_to_it():
    prompts, arrivals = tenants_workload()
    by_tenant = simulate_routed(prompts, [i % 2 for i in range(12)], output_tokens=2, arrivals=arrivals, **COMMON)
    # each server holds one tenant: every request after its server's first reuses 5 blocks of 8
    assert by_tenant.cached_tokens.tolist() == [0, 0] + [40] * 10
    assert by_tenant.hit_rates == pytest.approx([200 / 288, 200 / 288])
    mixed = simulate_routed(prompts, [(i // 2) % 2 for i in range(12)], output_tokens=2, arrivals=arrivals, **COMMON)
    assert mixed.prefix_hit_rate == 0.0, "each server alternates the two tenants in a cache that holds one"
    assert by_tenant.ttft.tolist() == mixed.ttft.tolist(), "a constant step time: hits save compute, not steps"


def test_requests_come_back_in_the_workloads_order_with_their_own_arrivals():
    prompts, arrivals = tenants_workload(6)
    r = simulate_routed(prompts, [1, 0, 1, 1, 0, 1], output_tokens=[1, 2, 3, 4, 5, 6], arrivals=arrivals,
                        n_servers=3, **COMMON)
    assert r.results[2] is None and np.isnan(r.hit_rates[2])
    np.testing.assert_allclose(r.finish - r.arrival, 0.01 * np.arange(1, 7))
    assert r.throughput == pytest.approx(21 / (5 + 0.06))


def test_bad_routing_is_named():
    prompts, _ = tenants_workload(4)
    with pytest.raises(ValueError, match="one server per prompt"):
        simulate_routed(prompts, [0, 1], output_tokens=1, **COMMON)
    with pytest.raises(ValueError, match=r"0\.\.1"):
        simulate_routed(prompts, [0, 1, 2, 0], output_tokens=1, n_servers=2, **COMMON)
    with pytest.raises(TypeError, match="prefix_caching"):
        simulate_routed(prompts, [0] * 4, output_tokens=1, prefix_caching=False, **COMMON)


# --- the router stage, with stand-in clients -------------------------------------------------------------------

class Echo:
    def __init__(self, name):
        self.name = name

    def complete(self, request):
        return (self.name, request.prompt, request.n_predict)


def test_the_router_stage_sends_each_request_to_the_chosen_client():
    stages = router_stages([Echo("a"), Echo("b")], PrefixAffinity(2), concurrency=2)
    requests = [{"system": f"tenant {k % 3}. ", "question": f"q{k}", "n_predict": k + 1} for k in range(9)]
    with GraphServer(stages) as graph:
        answers = [f.result(timeout=10) for f in [graph.submit({"request": r}) for r in requests]]
    affinity = PrefixAffinity(2)
    for request, answer in zip(requests, answers, strict=True):
        server = affinity(request)
        assert answer["route"] == server
        assert answer["generate"] == ("ab"[server], request["system"] + request["question"], request["n_predict"])


def test_a_policy_that_picks_no_server_fails_the_request_by_name():
    stages = router_stages([Echo("a")], lambda r: 3, concurrency=1)
    with GraphServer(stages) as graph:
        future = graph.submit({"request": {"system": "s", "question": "q"}})
        with pytest.raises(NodeError, match="route") as error:
            future.result(timeout=10)
    assert "not one of 0..0" in str(error.value.__cause__)


def test_the_router_stage_refuses_no_clients_or_a_client_that_cannot_complete():
    with pytest.raises(ValueError, match="at least one"):
        router_stages([], RoundRobin(1))
    with pytest.raises(TypeError, match="complete"):
        router_stages([object()], RoundRobin(1))
