"""Simulator speed: requests simulated per second, against the same server written in SimPy.

Targets (issue 5): at least 10x faster than an equivalent SimPy model, and notebook 05's sweeps fast
enough to feel instant.  Both simulators get the *same* arrival times, and their mean latencies must
agree before any time is compared.

    python benchmarks/bench_simulator.py      (or: make bench)
"""

from __future__ import annotations

import time

import numpy as np
import simpy
from _timing import best_of, machine, table, verdict

from infergraph_lite import capacity, simulate_batching


def simpy_batching(arrivals: np.ndarray, service, max_batch_size: int, max_wait: float) -> np.ndarray:
    """The dynamic-batching policy as a SimPy process model; returns each request's latency."""
    env = simpy.Environment()
    queue: list[int] = []
    finish = np.zeros(len(arrivals))
    state = {"arrived": env.event()}

    def source():
        for i, t in enumerate(arrivals):
            yield env.timeout(t - env.now)
            queue.append(i)
            state["arrived"].succeed()
            state["arrived"] = env.event()

    def server():
        done = 0
        while done < len(arrivals):
            if not queue:
                yield state["arrived"]
            deadline = arrivals[queue[0]] + max_wait
            while len(queue) < max_batch_size and env.now < deadline:
                yield env.any_of([state["arrived"], env.timeout(deadline - env.now)])
            batch = queue[:max_batch_size]
            del queue[:max_batch_size]
            yield env.timeout(service(len(batch)))
            finish[batch] = env.now
            done += len(batch)

    env.process(source())
    env.process(server())
    env.run()
    return finish - arrivals


def main() -> None:
    alpha_beta = (2.0, 0.15)  # the GPU-like profile of notebook 05, in ms
    rows, targets = [], []
    for label, b, wait, load in [("FIFO (M/D/1), load 0.8", 1, 0.0, 0.8),
                                 ("batching, cap 32, window 2 ms, load 0.7", 32, 2.0, 0.7)]:
        rate = load * capacity(alpha_beta, b)
        n = 100_000
        arrivals = np.random.default_rng(0).exponential(1 / rate, n).cumsum()
        ours = simulate_batching(None, alpha_beta, b, wait, arrivals=arrivals, warmup=0.0)
        theirs = simpy_batching(arrivals, lambda k: alpha_beta[0] + alpha_beta[1] * k, b, wait)
        assert np.allclose(ours.latencies, theirs, atol=1e-6), "the two simulators disagree"
        t_ours = best_of(lambda a=arrivals, b=b, w=wait: simulate_batching(None, alpha_beta, b, w, arrivals=a), 3)
        t_simpy = best_of(lambda a=arrivals, b=b, w=wait: simpy_batching(a, lambda k: 2.0 + 0.15 * k, b, w), 1)
        rows.append([label, n, n / t_ours, n / t_simpy, t_simpy / t_ours])
        speedup = t_simpy / t_ours
        targets.append([f"SimPy time / ours, {label}", speedup, ">= 10", verdict(speedup, 10, "higher")])

    million = best_of(lambda: simulate_batching(0.9, 1.0, n_requests=1_000_000), 3)
    rows.append(["FIFO, 1,000,000 requests (Poisson arrivals drawn too)", 1_000_000, 1e6 / million, "-", "-"])
    table(f"Simulator speed ({machine()})",
          ["model", "requests", "ours: requests/s", "SimPy: requests/s", "SimPy time / ours"], rows)

    # Notebook 05's sections 3-4: the window curves, the no-batching curve and the best-configuration grid.
    started = time.perf_counter()
    fractions = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    for b, windows, fracs, n in [(32, [0.0, 1.0, 2.0, 5.0, 10.0], fractions, 30_000), (1, [0.0], fractions, 30_000)]:
        for w in windows:
            for k, f in enumerate(fracs):
                simulate_batching(f * capacity(alpha_beta, b), alpha_beta, b, w, n_requests=n, seed=k)
    for b in [4, 8, 16, 32, 64]:
        for w in [0.0, 1.0, 2.0, 5.0]:
            for k, f in enumerate(np.linspace(0.3, 0.97, 12)):
                simulate_batching(f * capacity(alpha_beta, b), alpha_beta, b, w, n_requests=15_000, seed=k)
    sweep = time.perf_counter() - started
    targets.append(["notebook 05 sweeps (4.6 M simulated requests), seconds", sweep, "instant (< 10 s)",
                    verdict(sweep, 10, "lower")])
    table("Targets", ["measure", "value", "target", "verdict"], targets)


if __name__ == "__main__":
    main()
