"""Start each real engine many times in a row, each time in a fresh process: how often does a start fail, and why?

A flaky start (a port taken between its pick and its bind, a server not ready in time on a busy machine, a
process left behind by a close) shows up once in dozens of starts, so one test run rarely catches it.  For
each engine this tool runs ``--runs`` fresh Python processes in a row; each one starts the engine on a small
graph, answers one request, checks the answer, closes the engine and checks that none of the engine's
processes is left.  Not part of ``make test``: 20 starts of Ray take minutes.

    python tools/engine_stress.py                                # ray, triton, dask, llamacpp; 20 runs each
    python tools/engine_stress.py --engines dask llamacpp --runs 5
    python tools/engine_stress.py --engines triton --port-churn  # another process opens and closes ports meanwhile
    python tools/engine_stress.py --engines ray --runs 10 --burner --deadline 400

The engines: ``ray`` (:class:`RayServeGraph`) and ``triton`` (:class:`TritonServer`, its ensemble written by
``to_model_repository``) serve the seed's banana graph as batching stages, ``dask`` (:class:`DaskGraphCluster`,
one worker process) runs it as plain functions; all three must answer ``{"len": 6, "a_count": 3}``.
``llamacpp`` (:class:`LlamaCppServer`) serves the tiny random-weight model ``write_tiny_llama`` writes and must
stream exactly 8 tokens.  ``--burner`` runs a CPU-bound process pinned to core 0 (a busy laptop);
``--port-churn`` a process that keeps opening and closing loopback listeners on port 0 and connections to them
(ports come and go while an engine picks and binds its own).  Both stop by themselves after a bounded time and
are stopped by their PIDs when the tool ends.

Each run's process has ``--deadline`` seconds; past it, it gets SIGTERM (its engine's close still runs), then
it and every process under it are stopped by PID.  Prints one line per run: engine, run, ok/FAIL, seconds to
start (measured inside the run, from the start call until the engine is ready), total seconds (the whole
process, interpreter start included) and, for a failure, the exception type, the phase it ended
(prepare, start, request, check, close, left) and the first line of its message, with the run's log.  Then one
summary per engine: starts, failures grouped by cause, start seconds p50/p90/max.  Exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("ray", "triton", "dask", "llamacpp")
REQUEST_S = 60.0    # seconds one request may take inside a run
N_PREDICT = 8       # tokens the llama.cpp request asks for

# Helpers that stop by themselves after {limit} seconds, even if this tool is killed before it stops them.
PORT_CHURN = """\
import random, socket, time
end = time.monotonic() + {limit}
while time.monotonic() < end:
    held = []
    for _ in range(random.randint(1, 20)):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held.append(listener)
        try:
            held.append(socket.create_connection(listener.getsockname(), timeout=1.0))
        except OSError:
            pass
    time.sleep(random.uniform(0.0, 0.02))
    for sock in held:
        sock.close()
"""


# --- inside a run's process ------------------------------------------------------------------------------------


def tiny_stages() -> dict[str, tuple]:  # no `Any` here: the copy Triton imports has no imports
    """The seed's banana graph as batching stages; self-contained, as Triton copies it into its repository."""
    from infergraph_lite import Stage

    return {
        "pre": (Stage(fn=lambda xs: [x.strip().lower() for x in xs], max_batch_size=4), ["text"]),
        "modelA": (Stage(fn=lambda xs: [len(x) for x in xs], max_batch_size=4), ["pre"]),
        "modelB": (Stage(fn=lambda xs: [x.count("a") for x in xs], max_batch_size=4), ["pre"]),
        "combine": (Stage(fn=lambda xs: [{"len": n, "a_count": a} for n, a in xs], max_batch_size=4),
                    ["modelA", "modelB"]),
    }


@dataclass
class Started:
    """A running engine: one request (its checked value), the answer expected, its processes, and its close."""

    ask: Callable[[], Any]
    expected: Any
    pids: Callable[[], list[int]]
    close: Callable[[], object]


def banana_combine() -> dict[str, int]:
    """What ``combine`` answers for the banana input, from the seed's own executor."""
    from infergraph_lite import run_graph
    from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

    return run_graph(banana_nodes(), BANANA_INPUTS)["combine"]


def prepare_nothing() -> None:
    return None


def start_ray(_: None) -> Started:
    from infergraph_lite.frameworks.ray.serve import RayServeGraph
    from infergraph_lite.lessons.examples import BANANA_INPUTS

    graph = RayServeGraph(tiny_stages(), inputs=("text",)).start()
    return Started(lambda: graph.run(BANANA_INPUTS, timeout=REQUEST_S)["combine"], banana_combine(),
                   graph.started_pids, graph.close)


def prepare_triton() -> Path:
    from infergraph_lite.frameworks.triton import to_model_repository
    from infergraph_lite.lessons.examples import BANANA_INPUTS

    folder = Path(tempfile.mkdtemp(prefix="engine-stress-triton-"))
    return to_model_repository(tiny_stages(), folder, factory=tiny_stages, example=BANANA_INPUTS).path


def start_triton(repository: Path) -> Started:
    from infergraph_lite.frameworks.triton import TritonServer
    from infergraph_lite.lessons.examples import BANANA_INPUTS

    server = TritonServer(repository).start()
    client = server.client()

    def close() -> None:
        client.close()
        server.close()
        shutil.rmtree(repository, ignore_errors=True)

    return Started(lambda: client.infer(BANANA_INPUTS)["combine"], banana_combine(),
                   lambda: [p.pid for p in server.processes()], close)


def start_dask(_: None) -> Started:
    from infergraph_lite.frameworks.dask import DaskGraphCluster
    from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

    cluster = DaskGraphCluster(banana_nodes(), inputs=["text"], n_workers=1).start()
    return Started(lambda: cluster.submit(BANANA_INPUTS).result(timeout=REQUEST_S)["combine"], banana_combine(),
                   cluster.started_pids, cluster.close)


def prepare_llamacpp() -> Any:
    from infergraph_lite.frameworks.llamacpp import write_tiny_llama

    return write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)  # cached after the first


def start_llamacpp(model: Any) -> Started:
    from infergraph_lite.frameworks.llamacpp import LlamaCppServer, prompt_of
    from infergraph_lite.serving.processes import owned_processes

    server = LlamaCppServer(model, n_parallel=1, threads=1)
    client = server.client(n_predict=N_PREDICT, timeout=REQUEST_S)
    pid = server.pid

    def ask() -> tuple[int, str]:
        done = client.complete(prompt_of(4))
        return done.n_tokens, done.stop_type

    def close() -> None:
        client.close()
        server.close()

    return Started(ask, (N_PREDICT, "limit"), lambda: owned_processes([pid] if pid else []), close)


STARTERS: dict[str, tuple[Callable[[], Any], Callable[[Any], Started]]] = {
    "ray": (prepare_nothing, start_ray),
    "triton": (prepare_triton, start_triton),
    "dask": (prepare_nothing, start_dask),
    "llamacpp": (prepare_llamacpp, start_llamacpp),
}


class WrongAnswerError(AssertionError):
    """The engine answered, but not what the graph computes."""


class LeftBehindError(RuntimeError):
    """A process of the engine was still running after its close returned."""


class DeadlineError(BaseException):
    """The run's process got SIGTERM at its deadline (a BaseException, so no ``except Exception`` takes it)."""


def one_run(engine: str) -> dict[str, Any]:
    """Prepare (untimed), start the engine, answer one request, check it, close, check nothing is left."""
    from infergraph_lite.serving.processes import living, process_tree, stop_processes

    result: dict[str, Any] = {"ok": False, "phase": "prepare", "start_s": None}
    prepare, start = STARTERS[engine]
    try:
        prepared = prepare()
        result["phase"], began = "start", time.perf_counter()
        started = start(prepared)
        result["phase"], result["start_s"] = "request", time.perf_counter() - began
        try:
            answer = started.ask()
            result["phase"] = "check"
            if answer != started.expected:
                raise WrongAnswerError(f"answered {answer!r}, expected {started.expected!r}")
            result["phase"] = "close"
        finally:  # the engine's own record of its processes, and every process under this one
            owned = list(dict.fromkeys([*started.pids(), *process_tree()]))
            started.close()
        result["phase"] = "left"
        left = [pid for pid in living(owned) if "resource_tracker" not in command_of(pid)]
        if left:
            raise LeftBehindError(f"still running after close: {', '.join(f'{p} {command_of(p)}' for p in left)}")
        result["ok"], result["phase"] = True, "done"
    except BaseException as error:  # noqa: BLE001 - every way a run can end is reported, by name
        result["error"] = type(error).__name__
        result["message"] = (str(error).strip().splitlines() or [""])[0][:300]
        traceback.print_exc()  # into the run's log
        # A failed start or close may leave processes: name them, and stop them by PID before the next run.
        if stray := [pid for pid in living(process_tree()) if "resource_tracker" not in command_of(pid)]:
            result["message"] += f" [still running, now stopped: {', '.join(map(str, stray))}]"
            stop_processes(stray, timeout=5.0)
    return result


def command_of(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return "?"


def child_main(engine: str, result_path: Path) -> int:
    def deadline(signum: int, frame: object) -> None:
        raise DeadlineError("SIGTERM at the run's deadline")

    signal.signal(signal.SIGTERM, deadline)
    result = one_run(engine)
    result_path.write_text(json.dumps(result))
    return 0 if result["ok"] else 1


# --- the tool ----------------------------------------------------------------------------------------------------


@dataclass
class Run:
    engine: str
    number: int
    ok: bool
    start_s: float | None
    total_s: float
    cause: str = ""     # "ErrorType (phase)"
    message: str = ""
    log: Path | None = None


def stop_run(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM ``proc`` (its engine's close runs), wait ``grace_s``; then stop it and its descendants by PID."""
    from infergraph_lite.serving.processes import process_tree, stop_processes

    tree = process_tree(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    if proc.poll() is None:
        tree += process_tree(proc.pid)
    stop_processes([proc.pid, *tree], timeout=0.0)
    proc.wait()


def run_once(engine: str, number: int, deadline_s: float, logs: Path) -> Run:
    """One fresh process that starts ``engine`` once; its output goes to a log kept only if the run fails."""
    log, result_path = logs / f"{engine}-{number:02d}.log", logs / f"{engine}-{number:02d}.json"
    began, overran = time.perf_counter(), False
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, __file__, "--child", engine, "--result", str(result_path)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            overran = True
        finally:
            stop_run(proc, grace_s=60.0)
    total = time.perf_counter() - began
    if not result_path.exists():
        return Run(engine, number, False, None, total, f"no result (exit status {proc.returncode})", "", log)
    result = json.loads(result_path.read_text())
    result_path.unlink()
    if result["ok"] and overran:  # the run passed, then its process did not end: a thread or child kept it alive
        return Run(engine, number, False, result["start_s"], total, "no exit by the deadline (exit)",
                   f"the run passed, but its process was still running after {deadline_s:.0f} s", log)
    if result["ok"]:
        log.unlink()
        return Run(engine, number, True, result["start_s"], total)
    return Run(engine, number, False, result["start_s"], total, f"{result['error']} ({result['phase']})",
               result["message"], log)


def missing(engine: str) -> str | None:
    """Why ``engine`` cannot run here, or None."""
    module = {"ray": "ray", "triton": "tritonclient", "dask": "distributed", "llamacpp": "xllamacpp"}[engine]
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    if engine == "triton":
        from infergraph_lite.frameworks.triton import triton_available

        return triton_available()
    return None


def line(run: Run, runs: int) -> str:
    start = f"{run.start_s:6.1f} s" if run.start_s is not None else "     - s"
    text = f"{run.engine:<8} run {run.number:>2}/{runs}  {'ok  ' if run.ok else 'FAIL'}  start {start}  " \
           f"total {run.total_s:6.1f} s"
    return text if run.ok else f"{text}  {run.cause}: {run.message}  [log: {run.log}]"


def summary(engine: str, runs: list[Run]) -> str:
    import numpy as np

    failures = Counter(run.cause for run in runs if not run.ok)
    starts = [run.start_s for run in runs if run.ok and run.start_s is not None]
    text = f"{engine}: {len(runs)} starts, {len(runs) - sum(failures.values())} ok"
    if failures:
        text += "; failures: " + ", ".join(f"{n} x {cause}" for cause, n in failures.most_common())
    if starts:
        p50, p90 = np.percentile(starts, [50, 90])
        text += f"; start s p50 {p50:.1f}, p90 {p90:.1f}, max {max(starts):.1f}"
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--runs", type=int, default=20, help="fresh processes per engine, one after another")
    parser.add_argument("--burner", action="store_true", help="a CPU-bound process pinned to core 0 meanwhile")
    parser.add_argument("--port-churn", action="store_true",
                        help="a process opening and closing loopback listeners and connections meanwhile")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds per run's process")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child, args.result)
    if args.runs < 1 or args.deadline <= 0:
        parser.error(f"--runs must be >= 1 and --deadline > 0, got {args.runs} and {args.deadline}")

    engines = []
    for engine in dict.fromkeys(args.engines):
        reason = missing(engine)
        print(f"{engine}: skipped, {reason}" if reason else f"{engine}: {args.runs} runs", flush=True)
        engines += [] if reason else [engine]
    limit = 60.0 + len(engines) * args.runs * (args.deadline + 70.0)
    helpers: list[subprocess.Popen] = []
    logs = Path(tempfile.mkdtemp(prefix="engine-stress-"))
    results: dict[str, list[Run]] = {}
    # The burner and the helper-process plumbing are make stress's own (a sibling script; imported here, not at the
    # top, so that each run's fresh process does not import nbclient for nothing).
    from stress_check import BURNER, spawn_bounded
    from stress_check import stop as stop_helper

    try:
        if args.burner:
            helpers.append(spawn_bounded(BURNER, limit, core=0))
        if args.port_churn:
            helpers.append(spawn_bounded(PORT_CHURN, limit))
        if helpers:
            print(f"helpers running: {', '.join(f'PID {h.pid}' for h in helpers)} (at most {limit:.0f} s)")
        for engine in engines:
            for number in range(1, args.runs + 1):
                run = run_once(engine, number, args.deadline, logs)
                results.setdefault(engine, []).append(run)
                print(line(run, args.runs), flush=True)
    finally:
        for helper in helpers:
            stop_helper(helper)
    for engine, runs in results.items():
        print(summary(engine, runs))
    failed = sum(not run.ok for runs in results.values() for run in runs)
    if failed:
        print(f"{failed} run(s) failed; their logs are in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
