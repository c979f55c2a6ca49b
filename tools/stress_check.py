"""Run notebooks while a CPU-bound process competes for a core: do their claim checks still hold?

A learner's laptop is rarely idle.  This script starts one bounded busy-loop
process (pinned to core 0 where the OS allows), runs the given notebooks top to
bottom ``--runs`` times in fresh kernels (outputs are not saved), and stops the
burner by its own PID, also when a run fails or is interrupted.  A notebook
passes a run when every cell ran, i.e. every ``expect(...)`` claim held.

    python tools/stress_check.py notebooks/03_parallel_execution.ipynb           # 3 runs, 1 burner
    python tools/stress_check.py --runs 3 --burners 1 notebooks/0[123]*.ipynb

Prints one line per notebook and run, and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

# The burner stops by itself after this many seconds, even if this script is killed before it can stop it.
BURNER = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def start_burner(limit_s: float, core: int | None) -> subprocess.Popen:
    """A CPU-bound process that spins for at most ``limit_s`` seconds, optionally pinned to one core."""
    proc = subprocess.Popen([sys.executable, "-c", BURNER.format(limit=limit_s)])
    if core is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # if not allowed, it still competes, just not for one particular core
            os.sched_setaffinity(proc.pid, {core})
    return proc


def stop(proc: subprocess.Popen) -> None:
    """Stop one process we started, by its PID, and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def run_notebook(path: Path, timeout: int) -> tuple[bool, float, str]:
    """Run one notebook in a fresh kernel, in its own folder, without saving; (passed, seconds, first error)."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    started = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as err:
        lines = [line for line in str(err).splitlines() if "Error" in line]
        return False, time.perf_counter() - started, (lines[-1] if lines else str(err))[:400]
    return True, time.perf_counter() - started, ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burners", type=int, default=1, help="CPU-bound processes, pinned to cores 0, 1, ...")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args(argv)

    cores = os.cpu_count() or 1
    limit = 60.0 + args.runs * len(args.notebooks) * 120.0
    burners = [start_burner(limit, core=i % cores) for i in range(args.burners)]
    print(f"{args.burners} CPU burner(s) started (PID {', '.join(str(b.pid) for b in burners)}) on {cores} cores; "
          f"{args.runs} runs of {len(args.notebooks)} notebook(s)", flush=True)
    failures = 0
    try:
        time.sleep(0.5)  # let the burner(s) reach full speed
        for run in range(1, args.runs + 1):
            for path in args.notebooks:
                ok, seconds, error = run_notebook(path, args.timeout)
                failures += not ok
                verdict = "passed" if ok else f"FAILED: {error}"
                print(f"run {run}: {path} {verdict} ({seconds:.1f} s)", flush=True)
    finally:
        for burner in burners:
            stop(burner)
    burned = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    print(f"burner(s) stopped; CPU seconds used by child processes (burners, kernels): {burned:.0f}")
    print("all runs passed" if not failures else f"{failures} run(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
