"""LLM simulator speed: simulate_llm against a token-by-token SimPy model of the same scheduler.

Targets (issue 18): 100,000 requests with mean 128 output tokens (exponential, capped) at max_num_seqs=64 in
at most 5 s on 2 cores, and at least 10x faster than the SimPy model, after the two agree request by request.
The machine may be shared: the load average is printed with the figures, and CPU time beside wall time.

    python benchmarks/bench_llm_simulator.py      (or: make bench)
"""

from __future__ import annotations

import math
import os
import time
from collections import deque

import numpy as np
import simpy
from _timing import machine, table, verdict

from infergraph_lite import simulate_llm


def simpy_llm(arrivals: np.ndarray, prompt: np.ndarray, output: np.ndarray, step_time: float, max_num_seqs: int,
              budget: float = math.inf, num_blocks: float = math.inf, block_size: int = 16
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The default scheduler (vLLM V1's order) as a SimPy model, one token at a time.

    At every step boundary: every decoding sequence takes a token of the budget and, when its cache fills a
    block, a new block (short of one, the newest running sequence is preempted and recomputed later); running
    prefills continue with a chunk; then waiting requests join FCFS while a slot, budget and blocks allow.
    Returns first-token and finish times, each request's longest gap between tokens, and the preemptions."""
    env = simpy.Environment()
    n = len(arrivals)
    waiting: deque[list] = deque()
    first, finish, max_gap = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    state = {"arrived": env.event(), "free": num_blocks, "preemptions": 0}

    def source():
        for i, t in enumerate(arrivals):
            yield env.timeout(t - env.now)
            waiting.append([i, int(prompt[i]), 0, 0, 0, False, 0.0])  # id, tokens, computed, generated, blocks
            if not state["arrived"].triggered:
                state["arrived"].succeed()

    def alloc(seq, k):
        need = -(-(seq[2] + k) // block_size) - seq[4]
        if need > state["free"]:
            return False
        if need > 0:
            state["free"] -= need
            seq[4] += need
        return True

    def preempt(seq, running, scheduled):
        running.remove(seq)
        scheduled[:] = [(s, k) for s, k in scheduled if s is not seq]
        state["free"] += seq[4]
        seq[2] = seq[4] = 0
        seq[5] = False
        waiting.appendleft(seq)
        state["preemptions"] += 1

    def engine():
        running: list[list] = []
        done = 0
        while done < n:
            if not running and not waiting:
                state["arrived"] = env.event()
                yield state["arrived"]
            scheduled: list[tuple[list, int]] = []
            left, preempted = budget, False
            for decoding in (True, False):
                k = 0
                while k < len(running):
                    seq = running[k]
                    if seq[5] != decoding or (not decoding and left <= 0):
                        k += 1
                        continue
                    take = 1 if decoding else min(seq[1] - seq[2], left)
                    while not alloc(seq, take):
                        victim = running[-1]
                        preempt(victim, running, scheduled)
                        preempted = True
                        if victim is seq:
                            break
                    if seq in running:
                        scheduled.append((seq, take))
                        left -= take
                        k += 1
            while not preempted and waiting and len(running) < max_num_seqs and left > 0:
                seq = waiting[0]
                take = min(seq[1] - seq[2], left)
                if not alloc(seq, take):
                    break
                running.append(waiting.popleft())
                scheduled.append((seq, take))
                left -= take
            yield env.timeout(step_time)
            now = env.now
            for seq, take in scheduled:
                seq[2] += take
                if seq[2] < seq[1]:
                    continue
                i = seq[0]
                seq[1] += 1       # its new token, to be fed next step
                seq[3] += 1
                seq[5] = True
                if seq[3] == 1:
                    first[i] = now
                elif not now - seq[6] <= max_gap[i]:
                    max_gap[i] = now - seq[6]
                seq[6] = now
                if seq[3] == output[i]:
                    finish[i] = now
                    running.remove(seq)
                    state["free"] += seq[4]
                    done += 1

    env.process(source())
    env.process(engine())
    env.run()
    return first, finish, max_gap, state["preemptions"]


def workload(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(seed)
    output = np.minimum(np.ceil(rng.exponential(128, n)), 1024).astype(np.int64)   # mean ~128, capped
    prompt = rng.integers(16, 512, n)
    step_time = 0.02
    rate = 0.85 * 64 / (step_time * output.mean())      # 85% of what 64 slots can decode
    arrivals = rng.exponential(1 / rate, n).cumsum()
    return arrivals, prompt, output, step_time


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    load_before = os.getloadavg()
    configs = [("no KV limit, no token budget", {}),
               ("KV cache 25,600 tokens in blocks of 16, budget 2048 (chunked prefill, preemption)",
                dict(kv_cache_tokens=64 * 400, max_num_batched_tokens=2048))]

    def simpy_for(arrivals, prompt, output, step, kw):
        return simpy_llm(arrivals, prompt, output, step, 64, kw.get("max_num_batched_tokens", math.inf),
                         kw.get("kv_cache_tokens", math.inf) // 16)

    # 1. Agreement, request by request, on a small workload.
    arrivals, prompt, output, step = workload(3000, seed=1)
    for _, kw in configs:
        ours = simulate_llm(n_requests=len(arrivals), prompt_tokens=prompt, output_tokens=output, step_time=step,
                            max_num_seqs=64, arrivals=arrivals, **kw)
        first, finish, gap, preemptions = simpy_for(arrivals, prompt, output, step, kw)
        assert np.allclose(ours.first_token, first, rtol=1e-9), "first tokens disagree"
        assert np.allclose(ours.finish, finish, rtol=1e-9), "finish times disagree"
        assert np.allclose(ours.max_tbt, gap, rtol=1e-9, equal_nan=True), "token gaps disagree"
        assert ours.preemptions == preemptions, "preemption counts disagree"

    # 2. Speed on the target workload: ours best of 3, SimPy once; they must agree there too.
    n = 100_000
    arrivals, prompt, output, step = workload(n)
    tokens = int(output.sum())
    rows, targets = [], []
    for label, kw in configs:
        args = dict(n_requests=n, prompt_tokens=prompt, output_tokens=output, max_num_seqs=64, arrivals=arrivals,
                    step_time=step, **kw)
        wall, cpu, result = min((timed(lambda a=args: simulate_llm(**a)) for _ in range(3)), key=lambda r: r[0])
        simpy_wall, simpy_cpu, (_, finish, _, _) = timed(lambda k=kw: simpy_for(arrivals, prompt, output, step, k))
        assert np.allclose(result.finish, finish, rtol=1e-9), "the two disagree on the full workload"
        rows.append([f"ours, {label}", n, tokens, result.steps, result.preemptions, wall, cpu])
        rows.append([f"SimPy, {label}", n, tokens, result.steps, result.preemptions, simpy_wall, simpy_cpu])
        targets.append([f"ours, wall s, {label}", wall, "<= 5", verdict(wall, 5, "lower")])
        targets.append([f"ours, CPU s, {label}", cpu, "<= 5", verdict(cpu, 5, "lower")])
        targets.append([f"SimPy / ours, wall, {label}", simpy_wall / wall, ">= 10",
                        verdict(simpy_wall / wall, 10, "higher")])
        targets.append([f"SimPy / ours, CPU, {label}", simpy_cpu / cpu, ">= 10",
                        verdict(simpy_cpu / cpu, 10, "higher")])
    fitted = lambda p, d, kv: 0.01 + 2e-5 * p + 1e-4 * d + 2e-8 * kv   # noqa: E731 - a fitted cost model's shape
    wall, cpu, called = timed(lambda: simulate_llm(n_requests=n, prompt_tokens=prompt, output_tokens=output,
                                                   max_num_seqs=64, arrivals=arrivals, step_time=fitted))
    rows.append(["ours, step_time(prefill, decode, kv) callable, no limits", n, tokens, called.steps, 0, wall, cpu])
    load_after = os.getloadavg()
    table(f"LLM simulator speed ({machine()}); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after",
          ["model", "requests", "tokens", "steps", "preemptions", "wall s", "CPU s"], rows)
    table("Targets", ["measure", "value", "target", "verdict"], targets)


if __name__ == "__main__":
    main()
