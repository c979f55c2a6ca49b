"""GraphServer, Triton and Ray Serve on the same graph, the same requests and the same loads, measured in one run.

The graph is notebook 07's: notebook 01's text pipeline with the two classifiers made accelerator-like (each call
first waits 12 ms + 0.2 ms per item, as a GPU launch would) and batching up to 16 requests without waiting.  Each
engine takes the same open-loop sweep: seeded Poisson arrivals at 25, 50, 100, 200, 400 and 800 requests/s (about 0.8 s
of arrivals each, at least 30 requests), the same request texts, stopping after the first rate whose p99 misses
100 ms.  Reported as ratios to the in-process GraphServer: each engine's highest load served with p99 under the
target, and its median latency at the highest load all three served.

Servers listen on 127.0.0.1 only and are stopped by their own PIDs (``TritonServer`` and ``RayServeGraph`` do it,
also on failure); the script checks that no process it started is left, and that every listener was on loopback.

    python benchmarks/bench_frameworks.py      (or: make bench)
"""

from __future__ import annotations

# Imported before anything imports Ray: it keeps every Ray listener on 127.0.0.1.
from infergraph_lite.frameworks.ray_serve import RayServeGraph, is_loopback, listening_sockets  # isort: skip

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _timing import machine, table, verdict

from infergraph_lite.frameworks.triton import TritonServer, to_model_repository, triton_available
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import LoadReport, run_closed_loop, run_open_loop

RATES = [25, 50, 100, 200, 400, 800]  # requests per second, open loop
P99_TARGET = 0.100  # seconds
TEXTS = ["the match was great", "awful hotel, never again", "my new laptop is fast", "the pasta was cold"]
REQUESTS = [{"text": f"{TEXTS[i % 4]} ({i})"} for i in range(800)]


def accelerator_stages() -> dict:
    """Notebook 07's graph: the text pipeline, topic and sentiment accelerator-like and batching (16, no wait).

    Copied into Triton's model repository as source, so it imports what it needs in its body.
    """
    import dataclasses
    import time
    from typing import Any  # noqa: F401 - the copy in the repository has no `from __future__ import annotations`

    from infergraph_lite.lessons.examples import text_pipeline_stages

    def on_accelerator(batch_fn: Any, alpha: float = 0.012, beta: float = 0.0002) -> Any:
        def call(batch: list[Any]) -> Any:
            time.sleep(alpha + beta * len(batch))
            return batch_fn(batch)
        return call

    stages = text_pipeline_stages()
    for name in ("topic", "sentiment"):
        stage, deps = stages[name]
        stages[name] = (dataclasses.replace(stage, fn=on_accelerator(stage.fn), max_batch_size=16, max_wait=0.0),
                        deps)
    return stages


def arrivals_at(rate: int) -> np.ndarray:
    gaps = np.random.default_rng(rate).exponential(1 / rate, max(30, int(0.8 * rate)))
    return np.cumsum(gaps) - gaps[0]


def sweep(target: Any) -> dict[int, LoadReport]:
    """The bounded open-loop sweep: stops after the first rate whose p99 misses the target (or that fails)."""
    run_closed_loop(target, n_clients=4, n_requests=40, make_item=lambda i: REQUESTS[i], max_seconds=10)  # warm-up
    reports = {}
    for rate in RATES:
        reports[rate] = report = run_open_loop(target, arrivals_at(rate), make_item=lambda i: REQUESTS[i], timeout=20)
        if report.failed or report.percentile(99) > P99_TARGET:
            break
    return reports


def left_running(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def main() -> None:
    stages = accelerator_stages()
    results: dict[str, dict[int, LoadReport]] = {}
    started: dict[str, float] = {}

    t = time.perf_counter()
    with GraphServer(stages, inputs=["text"], name="bench-frameworks") as server:
        started["GraphServer"] = time.perf_counter() - t
        results["GraphServer"] = sweep(server)

    if triton_available() is not None:
        raise SystemExit(f"Triton cannot run here: {triton_available()}")
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as workdir:
        repo = to_model_repository(stages, Path(workdir) / "models", factory=accelerator_stages,
                                   example={"text": TEXTS[0]}, outputs=["format", "topic", "sentiment"])
        t = time.perf_counter()
        with TritonServer(repo) as triton, triton.client() as client:
            started["Triton"] = time.perf_counter() - t
            triton_pids = [p.pid for p in triton.processes()]
            triton_listeners = listening_sockets(triton_pids)
            results["Triton"] = sweep(client)
    triton_left = left_running(triton_pids)

    t = time.perf_counter()
    with RayServeGraph(stages, inputs=("text",)) as served:
        started["Ray Serve"] = time.perf_counter() - t
        ray_pids = served.started_pids()
        ray_listeners = served.check_loopback()
        results["Ray Serve"] = sweep(served)
    ray_left = left_running(ray_pids)

    rows = []
    for engine, reports in results.items():
        for rate, r in reports.items():
            rows.append([engine, rate, r.throughput, r.mean * 1e3, r.percentile(50) * 1e3, r.percentile(99) * 1e3,
                         r.failed])
    best = {e: max((rate for rate, r in reports.items() if not r.failed and r.percentile(99) <= P99_TARGET),
                   default=0) for e, reports in results.items()}
    table(f"The same graph, requests and open-loop loads on three engines ({machine()})",
          ["engine", "offered req/s", "served req/s", "mean ms", "p50 ms", "p99 ms", "failed"], rows)

    def served_within(engine: str) -> float:
        return results[engine][best[engine]].throughput if best[engine] else 0.0

    light = RATES[0]  # every sweep starts here, so every engine has it
    base = results["GraphServer"][light]
    targets: list[list[Any]] = []
    for engine in ("Triton", "Ray Serve"):
        targets.append([f"{engine}: served req/s at its highest load with p99 <= 100 ms / GraphServer's",
                        served_within(engine) / served_within("GraphServer") if best["GraphServer"] else float("nan"),
                        "(recorded)", ""])
        for q in (50, 99):
            targets.append([f"{engine}: p{q} at {light} req/s / GraphServer's",
                            results[engine][light].percentile(q) / base.percentile(q), "(recorded)", ""])
    listeners = triton_listeners + ray_listeners
    targets.append(["listeners not on 127.0.0.1 (Triton, Ray)", sum(not is_loopback(x.ip) for x in listeners), "0",
                    verdict(sum(not is_loopback(x.ip) for x in listeners), 0, "lower")])
    targets.append(["processes left after stopping (Triton, Ray)", len(triton_left) + len(ray_left), "0",
                    verdict(len(triton_left) + len(ray_left), 0, "lower")])
    table("Targets", ["measure", "value", "target", "verdict"], targets)
    for engine, reports in results.items():
        print(f"info: {engine}: started in {started[engine]:.1f} s; highest load within the p99 target "
              f"{f'{best[engine]} req/s' if best[engine] else 'none'}; the sweep stopped at {max(reports)} req/s")


if __name__ == "__main__":
    main()
