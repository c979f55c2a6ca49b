"""GraphServer (threads and processes), Triton and Ray Serve on the same graphs and loads, measured in one run.

Two graphs, said plainly:

- *text pipeline (sleep/numpy)*: notebook 07's graph, notebook 01's text pipeline with ``topic`` and ``sentiment``
  accelerator-like (each call waits 12 ms + 0.2 ms per item, as a GPU launch would, batching up to 16 without
  waiting).  Its stages sleep or call numpy, which release the interpreter lock, so one process serves it well.
- *CPU-bound pure Python*: ``cpu_bound_stages()``, two stages of pure-Python arithmetic that hold the lock the
  whole time, so threads of one process take turns and processes run at once (notebook 06 section 10).  Each
  stage is sized to about 2 ms per item on the machine that runs it (``rounds_for``, as notebook 07 does): fixed
  rounds took four times longer on one host than on another, which moves the graph's capacity, and with it the
  share of each batch that is fixed hand-off cost, from regime to regime.  Every engine serves the same rounds:
  Triton's stubs rebuild the graph from a factory written with them, and before any load Triton's answer to
  one request is checked against this process's.

The procedure is :mod:`infergraph_lite.serving.benchmark`'s: per rate a warm-up, then three repetitions of
``DURATION`` seconds of seeded Poisson arrivals (at least ``MIN_REQUESTS``), the rate actually sent measured,
a Student-t 95 % interval on the mean and the p99 range across repetitions; a rate meets the target when no
request failed or was refused and the worst repetition's p99 is under 100 ms.  The highest rate meeting it is
found by a bracket grown from 10 req/s (x2 up to the first miss, capped at 2560: "≥" if the cap still meets)
and bisection down to 15 %.  At that rate one more run is measured with every process of the engine watched
(CPU seconds per request, its share of the cores, the batch sizes its batchers formed), which is what says
*why* an engine stops where it does.  Per-hop cost: the same chain of 1, 3 and 6 no-op stages on every engine,
one request at a time (light load), latency fitted against chain length; the slope is the cost of one hop.
For Triton the client's latency minus Triton's own clock (its statistics) isolates the gRPC hop.

Verdicts follow the lessons' direction: in-process at least Triton on the text pipeline; on the CPU-bound graph,
processes / threads at least 0.8 on any run and at least 1.4 when a probe of what two busy processes get (taken
before and after those runs) found two cores free, as notebook 06 judges it; Ray's capacity at
least half the ceiling its measured CPU per request allows on the free cores (CPU explains it).  On a busy
machine the load average printed at the end says how far to trust the rest.

``--quick`` runs the same procedure shorter (1 s runs, 2 chain lengths), for a smoke test on a busy machine.

Servers listen on 127.0.0.1 only and are stopped by their own PIDs; the script checks that no process it
started is left, and that every listener was on loopback.

    python benchmarks/bench_frameworks.py [--quick]     (or: make bench)
"""

from __future__ import annotations

# Imported before anything imports Ray: it keeps every Ray listener on 127.0.0.1.
from infergraph_lite.frameworks.ray.serve import RayServeGraph, is_loopback, listening_sockets  # isort: skip

import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _graphs import CHAIN_FACTORIES, accelerator_stages, write_cpu_bound_factory
from _timing import machine, table, verdict

from infergraph_lite.frameworks.triton import TritonServer, to_model_repository, triton_available
from infergraph_lite.frameworks.triton.runner import run_stages_once
from infergraph_lite.lessons.examples import cpu_bound_stages, rounds_for
from infergraph_lite.serving.benchmark import (
    ROW_HEADER,
    Capacity,
    HopCost,
    RateResult,
    find_capacity,
    frozen_heap,
    in_worker_processes,
    measure_rate,
    noop_chain_stages,
    per_hop_cost,
)
from infergraph_lite.serving.graph_server import GraphServer
from infergraph_lite.serving.loadtest import run_closed_loop
from infergraph_lite.serving.stage_workers import cores_available
from infergraph_lite.serving.watch import Watched, batch_counts, watch_rate

QUICK = "--quick" in sys.argv[1:]
P99_TARGET = 0.100  # seconds
LOW, HIGH, GROWTH, RESOLUTION = 10, 2560, 2.0, 0.15  # req/s; the bracket grows x2 from LOW, capped at HIGH
PROCEDURE = (dict(duration=1.0, min_requests=30, warmup=0.3, repetitions=3) if QUICK
             else dict(duration=5.0, min_requests=50, warmup=1.0, repetitions=3))
HOPS = (1, 4) if QUICK else (1, 3, 6)
HOP_REQUESTS, HOP_WARMUP = (60, 10) if QUICK else (200, 20)
ENGINES = ["GraphServer threads", "GraphServer processes", "Triton", "Ray Serve"]
BASE = ENGINES[0]
CPU_OPTIONS = {"parse": {"max_batch_size": 4}, "score": {"max_batch_size": 4}}  # as notebook 06 and bench_graph_server
CPU_SECONDS_PER_ITEM = 0.002  # each CPU-bound stage's work per item, as notebook 07's engine comparison sizes it
TEXTS = ["the match was great", "awful hotel, never again", "my new laptop is fast", "the pasta was cold"]


@dataclass
class Graph:
    label: str
    stages: dict
    inputs: tuple[str, ...]
    factory: Callable[[Path], Any]  # given Triton's repository folder: what its stubs rebuild the graph with
    example: dict
    make_item: Callable[[int], dict]
    outputs: list[str] | None = None
    process_factory: str | None = None  # 'module:function' rebuilding the graph in worker processes, if its fns
    #                                     do not pickle (closures); None: its fns pickle as they are


def make_graphs(cpu_rounds: int) -> list[Graph]:
    """The two graphs every engine serves; the CPU-bound one at ``cpu_rounds`` rounds per item and stage."""
    rounds = {"parse": cpu_rounds, "score": cpu_rounds}
    return [
        Graph("text pipeline (sleep/numpy)", accelerator_stages(), ("text",), lambda folder: accelerator_stages,
              {"text": TEXTS[0]}, lambda i: {"text": f"{TEXTS[i % 4]} ({i})"}, ["format", "topic", "sentiment"],
              "_graphs:accelerator_stages"),
        Graph("CPU-bound pure Python", cpu_bound_stages(rounds, options=CPU_OPTIONS), ("request",),
              lambda folder: write_cpu_bound_factory(folder, cpu_rounds), {"request": 1}, lambda i: {"request": i}),
    ]


@dataclass
class Served:
    """A running engine: what load tests drive, the PIDs doing its work, its batchers' counts so far."""

    target: Any
    pids: Callable[[], list[int]]
    batch_counts: Callable[[], dict[str, dict[int, int]]]
    server_latency: Callable[[], tuple[int, float]] | None = None  # Triton: (requests, seconds) on its own clock
    listeners: list[Any] = field(default_factory=list)
    started_in: float = 0.0


@contextlib.contextmanager
def serve(engine: str, graph: Graph, left: list[int]) -> Iterator[Served]:
    """Start ``engine`` on ``graph``; on exit stop it and add any process still alive to ``left``."""
    t = time.perf_counter()
    pids: list[int] = []
    if engine.startswith("GraphServer"):
        workers = "processes" if engine.endswith("processes") else "threads"
        stages = (in_worker_processes(graph.stages, graph.process_factory)
                  if workers == "processes" and graph.process_factory else graph.stages)
        with GraphServer(stages, inputs=graph.inputs, name="bench-frameworks", workers=workers) as server:
            def own() -> list[int]:
                return [os.getpid()] + [p for pool in server.stage_workers.values() for p in pool.pids]

            pids = own()
            yield Served(server, own, lambda: batch_counts(server), started_in=time.perf_counter() - t)
    elif engine == "Triton":
        with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as workdir:
            folder = Path(workdir) / "models"
            repo = to_model_repository(graph.stages, folder, factory=graph.factory(folder),
                                       example=graph.example, outputs=graph.outputs)
            with TritonServer(repo) as triton, triton.client() as client:
                pids = [p.pid for p in triton.processes()]
                check_same_answer(graph, list(repo.outputs), client.infer(graph.example))

                def latency() -> tuple[int, float]:
                    s = client.statistics()[repo.ensemble]
                    return s.requests, s.request_time
                yield Served(client, lambda: [os.getpid()] + [p.pid for p in triton.processes()],
                             lambda: {n: dict(s.batch_sizes) for n, s in client.statistics().items()
                                      if n != repo.ensemble},
                             latency, listening_sockets(pids), time.perf_counter() - t)
    else:
        with RayServeGraph(graph.stages, inputs=graph.inputs) as served:
            pids = served.started_pids()
            yield Served(served, lambda: [os.getpid(), *served.started_pids()], served.batch_sizes,
                         listeners=served.check_loopback(), started_in=time.perf_counter() - t)
    left.extend(p for p in pids if p != os.getpid() and psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE)


@dataclass
class Run:
    engine: str
    graph: str
    capacity: Capacity
    edge: Watched  # one more run at the capacity (or at LOW), every process of the engine watched


def measure_engine(engine: str, graph: Graph, served: Served, seed: int) -> Run:
    def at(rate: float) -> RateResult:
        return measure_rate(served.target, rate, graph.make_item, seed=seed, p99_target=P99_TARGET, timeout=60,
                            **PROCEDURE)

    capacity = find_capacity(at, LOW, HIGH, P99_TARGET, growth=GROWTH, resolution=RESOLUTION)
    edge = watch_rate(served.target, capacity.meets or LOW, graph.make_item, served.pids(),
                      counts=served.batch_counts, seed=seed + 100, timeout=60, **PROCEDURE)
    return Run(engine, graph.label, capacity, edge)


def hop_latencies(engine: str, hops: int, left: list[int], listeners: list[Any]) -> tuple[np.ndarray, float]:
    """One request at a time on a chain of ``hops`` no-op stages: latencies, and Triton's own mean (else nan)."""
    chain = Graph(f"{hops} no-op hops", noop_chain_stages(hops), ("request",), lambda folder: CHAIN_FACTORIES[hops],
                  {"request": "ping"}, lambda i: {"request": f"ping {i}"})
    with serve(engine, chain, left) as served:
        listeners.extend(served.listeners)
        run_closed_loop(served.target, 1, HOP_WARMUP, chain.make_item, max_seconds=60)
        before = served.server_latency() if served.server_latency else (0, 0.0)
        with frozen_heap():  # as measure_rate: no ~100 ms collection of Ray's heap inside a hop's latency
            report = run_closed_loop(served.target, 1, HOP_REQUESTS, chain.make_item, max_seconds=120)
        inside = float("nan")
        if served.server_latency:
            after = served.server_latency()
            inside = (after[1] - before[1]) / max(after[0] - before[0], 1)
    return report.latencies, inside


def check_same_answer(graph: Graph, names: Sequence[str], answer: dict[str, Any]) -> None:
    """Raise unless an engine's answer to the graph's example is the in-process graph's (the same work served).

    ``names`` are the outputs the engine exposes (a Triton repository's ``outputs``: the nodes nobody reads when
    the graph names none), so the check compares what the engine was asked to answer.
    """
    expected = run_stages_once(graph.stages, graph.example)
    wrong = {n: (answer.get(n), expected[n]) for n in names if str(answer.get(n)) != str(expected[n])}
    if wrong:
        raise RuntimeError(f"{graph.label}: the engine answers {graph.example} otherwise than the graph in this "
                           f"process (output: (engine, here)): {wrong}")


def judged(value: float, target: float, better: str) -> str:
    """verdict(), or 'unconfirmed' when the value could not be measured (an engine that did not start, a nan)."""
    return "unconfirmed" if not math.isfinite(value) else verdict(value, target, better)


def main() -> None:
    if triton_available() is not None:
        raise SystemExit(f"Triton cannot run here: {triton_available()}")
    for hops, factory in CHAIN_FACTORIES.items():  # Triton's chains are the chains every other engine serves
        built, reference = factory(), noop_chain_stages(hops)
        assert {n: d for n, (_, d) in built.items()} == {n: d for n, (_, d) in reference.items()}, hops
    load_before = os.getloadavg()
    cpu_rounds = rounds_for(CPU_SECONDS_PER_ITEM)
    graphs = make_graphs(cpu_rounds)
    print(f"info: CPU-bound stages: {cpu_rounds:,} rounds per item each (about {1e3 * CPU_SECONDS_PER_ITEM:g} ms "
          "on this machine, by rounds_for)", flush=True)
    started = time.perf_counter()
    left: list[int] = []
    listeners: list[Any] = []
    runs: dict[tuple[str, str], Run] = {}
    failures: dict[str, str] = {}  # what could not be measured, and why (a server that did not start on a busy box)
    starts: dict[tuple[str, str], float] = {}
    cores_free: list[float] = []  # what two busy processes get, probed around the CPU-bound graph's runs
    for g, graph in enumerate(graphs):
        if graph is graphs[1]:
            cores_free.append(cores_available(2))
        for engine in ENGINES:
            try:
                with serve(engine, graph, left) as served:
                    starts[(engine, graph.label)] = served.started_in
                    listeners.extend(served.listeners)
                    runs[engine, graph.label] = measure_engine(engine, graph, served, seed=1000 * g)
                print(f"info: {graph.label}, {engine}: capacity {runs[engine, graph.label].capacity} "
                      f"({time.perf_counter() - started:.0f} s so far)", flush=True)
            except Exception as error:  # noqa: BLE001 - reported, and its verdicts marked unconfirmed
                failures[f"{graph.label}, {engine}"] = f"{type(error).__name__}: {str(error)[:160]}"
                print(f"info: {graph.label}, {engine}: NOT MEASURED: {failures[f'{graph.label}, {engine}']}")
        if graph is graphs[1]:
            cores_free.append(cores_available(2))

    hop_costs: dict[str, HopCost] = {}
    grpc_hop = math.nan
    for engine in ENGINES:
        samples, inside = {}, {}
        try:
            for hops in HOPS:
                samples[hops], inside[hops] = hop_latencies(engine, hops, left, listeners)
        except Exception as error:  # noqa: BLE001 - as above
            failures[f"no-op chains, {engine}"] = f"{type(error).__name__}: {str(error)[:160]}"
            print(f"info: no-op chains, {engine}: NOT MEASURED: {failures[f'no-op chains, {engine}']}")
            continue
        hop_costs[engine] = per_hop_cost(samples)
        if engine == "Triton":
            grpc_hop = float(np.mean(samples[HOPS[0]])) - inside[HOPS[0]]  # client's latency - Triton's own clock
        print(f"info: per-hop cost, {engine}: {hop_costs[engine]}", flush=True)
    load_after = os.getloadavg()

    for graph in graphs:
        rows = [[run.engine, *run.capacity.results[rate].row()] for run in runs.values() if run.graph == graph.label
                for rate in sorted(run.capacity.results)]
        table(f"{graph.label}: every rate the bracket and bisection measured (p99 target 100 ms; {machine()})",
              ["engine", *ROW_HEADER], rows)

    def meets(engine: str, graph: str) -> float:
        """The highest rate that met the target; 0 if even LOW missed; nan if the engine was not measured."""
        run = runs.get((engine, graph))
        return math.nan if run is None else (run.capacity.meets or 0.0)

    def ratio(a: str, b: str, graph: str) -> float:
        x, y = meets(a, graph), meets(b, graph)
        return x / y if y else math.nan

    rows = []
    for (engine, graph), run in runs.items():
        w = run.edge
        rows.append([graph.split(" (")[0], engine, str(run.capacity), ratio(engine, BASE, graph), w.result.sent_ratio,
                     w.cpu_ms_engine, w.cpu_ms_here, w.share_engine, w.share_here, w.machine_busy,
                     ", ".join(f"{k} {v:.1f}" for k, v in w.batches.items())])
    table("Highest load with p99 <= 100 ms, as ratios to GraphServer threads; at that load: sent/scheduled, CPU ms "
          "per request (the engine's processes, this process), their shares of all cores, the machine's busy share, "
          "mean batch sizes",
          ["graph", "engine", "capacity", "x threads", "sent/sched", "CPU ms eng", "CPU ms here", "eng share",
           "here share", "busy", "mean batch"], rows)
    base_hop = hop_costs[BASE].per_hop if BASE in hop_costs else math.nan
    table(f"Per-hop cost: chains of {', '.join(map(str, HOPS))} no-op stages, one request at a time "
          f"({HOP_REQUESTS} per chain), latency fitted against chain length",
          ["engine", "ms per hop", "95% CI ms", "x threads", "base ms"],
          [[e, 1e3 * h.per_hop, f"{1e3 * h.interval[0]:.3g}-{1e3 * h.interval[1]:.3g}",
            h.per_hop / base_hop, 1e3 * h.base] for e, h in hop_costs.items()])

    text, cpu = graphs[0].label, graphs[1].label
    cores = psutil.cpu_count() or 1
    ray_vs_ceiling: dict[str, float] = {}
    for graph_label in (text, cpu):
        ray, threads = runs.get(("Ray Serve", graph_label)), runs.get((BASE, graph_label))
        if ray is None:
            ray_vs_ceiling[graph_label] = math.nan
            continue
        # The most requests per second Ray's measured CPU cost per request allows on the cores no other work was
        # using, and its capacity as a share of that: near 1, CPU is what stops it.
        ray_ceiling = ray.edge.free_cores_ceiling()
        ray_vs_ceiling[graph_label] = (ray.capacity.meets or math.nan) / ray_ceiling
        print(f"\ninfo: Ray Serve on the {graph_label} at {ray.edge.result.rate:g} req/s: its processes used "
              f"{100 * ray.edge.share_engine:.0f} % of the {cores} cores and this process "
              f"{100 * ray.edge.share_here:.0f} %, the machine {100 * ray.edge.machine_busy:.0f} % busy in all; "
              f"{ray.edge.cpu_ms_per_request:.1f} CPU ms per request (GraphServer threads: "
              f"{threads.edge.cpu_ms_here if threads else math.nan:.1f}); CPU ceiling {ray_ceiling:.0f} req/s "
              f"on the free cores; mean batch sizes {ray.edge.batches}")
        top = sorted(ray.edge.by_name.items(), key=lambda kv: -kv[1])[:6]
        print("info: Ray CPU seconds at that load by process: " + ", ".join(f"{k[:40]} {v:.2f}" for k, v in top))
    print(f"info: Triton's gRPC hop (client latency - Triton's own clock, 1 no-op hop): {1e3 * grpc_hop:.2f} ms")

    measured = [res for run in runs.values() for res in run.capacity.results.values()]
    fewest = min((r.latencies.size + r.failed + r.refused for res in measured for r in res.reports), default=0)
    free = min(cores_free) if cores_free else math.nan  # the fewer cores the probes found, before or after
    bracketed = [run for run in runs.values() if run.capacity.fails is not None and run.capacity.meets is not None]
    worst_sent = min((res.sent_ratio for res in measured), default=math.nan)
    targets: list[list[Any]] = [
        ["a measured run: seconds of arrivals, at least", PROCEDURE["duration"],
         ">= 5 s", verdict(float(PROCEDURE["duration"]), 5.0, "higher") + (" (--quick)" if QUICK else "")],
        ["repetitions per rate that met the target", PROCEDURE["repetitions"], "3",
         verdict(PROCEDURE["repetitions"], 3, "higher")],
        ["fewest requests in one measured run", fewest, "(recorded)", ""],
        ["capacities bracketed to 15 % (the rest are '>=' or '<', said so)",
         f"{len(bracketed)} of {len(runs)}", "(recorded)", ""],
        ["worst sent/scheduled, any measured run", worst_sent, "(recorded)", ""],
        [f"{text}: GraphServer threads / Triton capacity", ratio(BASE, "Triton", text), ">= 1 (in-process wins)",
         judged(ratio(BASE, "Triton", text), 1.0, "higher")],
        [f"{cpu}: processes / threads capacity", ratio("GraphServer processes", BASE, cpu), ">= 0.8 on any run",
         judged(ratio("GraphServer processes", BASE, cpu), 0.8, "higher")],
        [f"{cpu}: processes / threads capacity, two cores free ({free:.2f} were)",
         ratio("GraphServer processes", BASE, cpu), ">= 1.4",
         judged(ratio("GraphServer processes", BASE, cpu), 1.4, "higher") if free >= 1.8 else "unconfirmed"],
        *[[f"Ray Serve ({g.split(' (')[0]}): capacity / its CPU ceiling on the free cores", v,
           ">= 0.5 (CPU explains it)", judged(v, 0.5, "higher")] for g, v in ray_vs_ceiling.items()],
        ["Ray Serve / GraphServer threads, cost per no-op hop", hop_costs["Ray Serve"].per_hop / base_hop
         if "Ray Serve" in hop_costs else math.nan, "(recorded)", ""],
        ["Triton's gRPC hop, ms (light load)", 1e3 * grpc_hop, "> 0", judged(-grpc_hop, 0.0, "lower")],
        ["listeners not on 127.0.0.1 (Triton, Ray)", sum(not is_loopback(x.ip) for x in listeners), "0",
         verdict(sum(not is_loopback(x.ip) for x in listeners), 0, "lower")],
        ["processes left after stopping", len(left), "0", verdict(len(left), 0, "lower")],
        ["engine x graph runs not measured", len(failures), "0", verdict(len(failures), 0, "lower")],
    ]
    table("Targets", ["measure", "value", "target", "verdict"], targets)
    for what, why in failures.items():
        print(f"info: not measured: {what}: {why}")
    for (engine, graph), seconds in starts.items():
        print(f"info: {graph}, {engine}: started in {seconds:.1f} s")
    print(f"info: load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({cores} CPUs); "
          f"whole run {time.perf_counter() - started:.0f} s{' (--quick)' if QUICK else ''}")


if __name__ == "__main__":
    main()
