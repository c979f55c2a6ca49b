"""llama.cpp's prompt cache, measured and simulated: TTFT with the cache off and on, beside ``simulate_llm``.

One one-slot llama.cpp server on the tiny random model (written locally), one tenant's 300-word system prompt and
``--requests`` short questions sent one after another, first with ``cache_prompt`` off, then on (llama.cpp's host
memory cache, ``--cache-ram``, off, so only the slot caches).  Per round: the prompt tokens the server evaluated and
cached (its own ``timings``), the median TTFT of each run, and the simulator's: the step cost fitted from the same
timings (``lessons.prefix_twin``), each run replayed with ``prefix_caching`` on or off and ``block_size=1``.  Target:
the simulated median TTFT within 25 % of the measured, cache off and on, in every round; and the simulated cached
tokens equal to the server's, request by request.  Notebook 10, section 5 runs one round of it.

    python benchmarks/bench_prefix_cache.py          (or: make bench)
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import psutil
from _timing import machine, table, verdict

from infergraph_lite.frameworks.llamacpp import LlamaCppServer, write_tiny_llama
from infergraph_lite.frameworks.llamacpp.router import tenant_requests, tenant_systems
from infergraph_lite.lessons.prefix_twin import fit_cache_runs, replay_cache_run

TARGET = 0.25   # |simulated / measured median TTFT - 1|


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=13)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    system = tenant_systems(1, words=300, seed=0)[0]
    rows, errors, same = [], [], []
    with LlamaCppServer(write_tiny_llama(), n_parallel=1, cache_ram_mib=0) as server:
        pid = server.pid
        for k in range(args.rounds):
            asks = tenant_requests([system], args.requests, question_words=12, n_predict=8, seed=1 + k)
            runs = {}
            for caching in (False, True):
                with server.client(n_predict=8, cache_prompt=caching) as client:
                    runs[caching] = [client.complete(a["system"] + a["question"]) for a in asks]
                    ids = [[1, *client.tokenize(a["system"] + a["question"])] for a in asks]   # <s> is token 1
            fit = fit_cache_runs(runs[False], runs[True])
            held = ids[-1]   # what the slot holds before each run: the previous run's last prompt (same length)
            one_request = max(map(len, ids)) + 8   # a pool of one request's KV: a slot keeps only its last prompt
            for caching, done in runs.items():
                sim = replay_cache_run(done, ids, fit, caching=caching, held=held, slot_tokens=one_request)
                measured, simulated = np.median([d.ttft for d in done[1:]]), float(np.median(sim.ttft[2:]))
                errors.append(simulated / measured - 1)
                if caching:
                    same.append(sim.cached_tokens[1:].tolist() == [d.cached_tokens for d in done])
                rows.append([k + 1, "on" if caching else "off", float(np.mean([d.prompt_evaluated for d in done])),
                             float(np.mean([d.cached_tokens for d in done])), 1e3 * measured, 1e3 * simulated,
                             f"{100 * errors[-1]:+.0f} %"])
    left = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    print(f"{machine()}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; server left: {left}")
    table("Prompt cache off and on: TTFT measured and simulated (one slot, requests one after another)",
          ["round", "cache", "tokens evaluated", "tokens cached", "TTFT p50 ms", "simulated ms", "error"], rows)
    worst = max(abs(e) for e in errors)
    table("Targets", ["target", "result", "verdict"],
          [[f"simulated median TTFT within {TARGET:.0%}, every run", f"worst {worst:.0%}",
            verdict(worst, TARGET, "lower")],
           ["simulated cached tokens = the server's, every request", f"{sum(same)} of {len(same)} rounds",
            "met" if all(same) else "MISSED"]])
    if left:
        raise SystemExit("the llama.cpp server is still running after its with block")


if __name__ == "__main__":
    main()
