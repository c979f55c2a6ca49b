"""Run notebooks while a CPU-bound process competes for a core: do their claim checks still hold?

A learner's laptop is rarely idle.  This script starts one bounded busy-loop
process, runs the given notebooks top to bottom ``--runs`` times in fresh kernels
(outputs are not saved), and stops the burner by its own PID, also when a run
fails or is interrupted.  A notebook passes a run when every cell ran, i.e. every
``expect(...)`` claim held.  ``--burner-mode`` says where the burner spins:
``pinned`` to core 0 (where the OS allows; one core is always taken), ``unpinned``
(the scheduler moves it between cores, as a laptop's other work moves), or
``both`` (the default): ``--runs`` runs beside a pinned burner, then ``--runs``
beside an unpinned one.

    python tools/stress_check.py                       # every notebook with live measurements, 3+3 runs, 1 burner
    python tools/stress_check.py notebooks/03_parallel_execution.ipynb
    python tools/stress_check.py --runs 3 --burners 1 notebooks/0[123]*.ipynb
    python tools/stress_check.py --burner-mode unpinned --runs 1 notebooks/02_dag_executor.ipynb
    python tools/stress_check.py --fresh-clone         # then also `make test` in a fresh clone, burner running
    python tools/stress_check.py --fresh-clone --venv .venv --runs 0   # only the clone, reusing a built venv

A notebook has live measurements when one of its cells is tagged ``nbval-ignore-output`` (timings, real
servers); with no paths given those in ``notebooks/`` are run.  ``--fresh-clone`` clones this repository's
committed ``HEAD`` into a temporary folder and runs its ``make test`` while the burner(s) spin: the whole of CI
on a busy laptop.  It bootstraps its own ``.venv`` (minutes) unless ``--venv`` names a built one, whose
interpreter then runs the clone's tests with the clone first on ``PYTHONPATH`` (the venv is not modified).
The clone runs once, beside the first mode's burner(s) (pinned, with ``both``).

Prints one line per notebook, burner mode and run, then a table (notebook, burner mode, runs, passes, seconds
min-max), and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
MODES = {"pinned": ["pinned"], "unpinned": ["unpinned"], "both": ["pinned", "unpinned"]}

# The burner stops by itself after this many seconds, even if this script is killed before it can stop it.
BURNER = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def spawn_bounded(code: str, limit_s: float, core: int | None = None) -> subprocess.Popen:
    """A helper process running ``code`` (formatted with ``limit``) for at most ``limit_s`` seconds, optionally
    pinned to one core; tools/engine_stress.py starts its port churn with it too."""
    proc = subprocess.Popen([sys.executable, "-c", code.format(limit=limit_s)])
    if core is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # if not allowed, it still competes, just not for one particular core
            os.sched_setaffinity(proc.pid, {core})
    return proc


def start_burner(limit_s: float, core: int | None) -> subprocess.Popen:
    """A CPU-bound process that spins for at most ``limit_s`` seconds, optionally pinned to one core."""
    return spawn_bounded(BURNER, limit_s, core)


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


def live_notebooks(folder: Path) -> list[Path]:
    """The notebooks in ``folder`` with at least one cell tagged ``nbval-ignore-output`` (live measurements)."""
    found = []
    for path in sorted(folder.glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if any("nbval-ignore-output" in c.get("metadata", {}).get("tags", []) for c in cells):
            found.append(path)
    return found


def fresh_clone_make_test(venv: Path | None) -> tuple[bool, float, str]:
    """``git clone`` this repository's HEAD into a temporary folder and run its ``make test``; (passed, s, tail)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="infergraph-clone-") as tmp:
        clone = Path(tmp) / "infergraph"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        command, env = ["make", "test"], dict(os.environ)
        if venv is not None:
            # Reuse a built venv without touching it: its bin/ runs the tests, its stamp is taken as up to date,
            # and the clone's package comes first on the path (the venv's editable install may point elsewhere).
            venv = venv.resolve()
            command += [f"BIN={venv / 'bin'}", "-o", ".venv/.installed"]
            env["PYTHONPATH"] = str(clone)
        done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
        # the whole output outside the clone (which is removed): a failure's traceback is what one needs next
        log = Path(tempfile.gettempdir()) / f"infergraph-clone-make-test-{time.strftime('%Y%m%d-%H%M%S')}.log"
        log.write_text(done.stdout + done.stderr)
        tail = "\n".join([*(done.stdout + done.stderr).strip().splitlines()[-15:], f"(the whole output: {log})"])
        if venv is None:
            shutil.rmtree(clone / ".venv", ignore_errors=True)
    return done.returncode == 0, time.perf_counter() - started, tail


def start_burners(count: int, mode: str, limit_s: float) -> list[subprocess.Popen]:
    """``count`` burners: ``pinned`` to cores 0, 1, ... (wrapping), or ``unpinned`` (any core, as the OS moves it)."""
    cores = os.cpu_count() or 1
    return [start_burner(limit_s, core=i % cores if mode == "pinned" else None) for i in range(count)]


def print_table(results: dict[tuple[str, str], list[tuple[bool, float]]]) -> None:
    """One row per (notebook, burner mode): runs, passes, seconds min-max."""
    rows = [("notebook", "burner mode", "runs", "passes", "seconds (min-max)")]
    for (name, mode), runs in results.items():
        seconds = [s for _, s in runs]
        rows.append((name, mode, str(len(runs)), str(sum(ok for ok, _ in runs)),
                     f"{min(seconds):.1f}-{max(seconds):.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="default: every notebook in notebooks/ with live measurements")
    parser.add_argument("--runs", type=int, default=3, help="runs of each notebook per burner mode")
    parser.add_argument("--burners", type=int, default=1, help="CPU-bound processes (pinned: to cores 0, 1, ...)")
    parser.add_argument("--burner-mode", choices=sorted(MODES), default="both",
                        help="pinned to one core, unpinned (moved between cores by the OS), or both in turn")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument("--fresh-clone", action="store_true", help="then run a fresh clone's `make test` as well")
    parser.add_argument("--venv", type=Path, help="with --fresh-clone: a built venv to reuse instead of bootstrapping")
    args = parser.parse_args(argv)
    if args.runs < 0 or args.burners < 0:
        parser.error(f"--runs and --burners must be >= 0, got --runs {args.runs} --burners {args.burners}")
    if args.venv is not None and not (args.venv / "bin" / "python").exists():
        parser.error(f"--venv {args.venv} has no bin/python")
    args.notebooks = args.notebooks or live_notebooks(ROOT / "notebooks")

    results: dict[tuple[str, str], list[tuple[bool, float]]] = {}
    failures = 0
    for index, mode in enumerate(MODES[args.burner_mode]):
        clone_here = args.fresh_clone and index == 0
        limit = 60.0 + args.runs * len(args.notebooks) * 120.0 + (3600.0 if clone_here else 0.0)
        burners = start_burners(args.burners, mode, limit)
        print(f"{args.burners} {mode} CPU burner(s) started (PID {', '.join(str(b.pid) for b in burners)}) on "
              f"{os.cpu_count() or 1} cores; {args.runs} runs of {len(args.notebooks)} notebook(s)", flush=True)
        try:
            time.sleep(0.5)  # let the burner(s) reach full speed
            for run in range(1, args.runs + 1):
                for path in args.notebooks:
                    ok, seconds, error = run_notebook(path, args.timeout)
                    failures += not ok
                    results.setdefault((str(path), mode), []).append((ok, seconds))
                    verdict = "passed" if ok else f"FAILED: {error}"
                    print(f"run {run}, burner {mode}: {path} {verdict} ({seconds:.1f} s)", flush=True)
            if clone_here:
                ok, seconds, tail = fresh_clone_make_test(args.venv)
                failures += not ok
                results[("fresh clone: make test", mode)] = [(ok, seconds)]
                print(f"fresh clone, make test, burner {mode}: {'passed' if ok else 'FAILED'} ({seconds:.0f} s)\n"
                      f"{tail}", flush=True)
        finally:
            for burner in burners:
                stop(burner)
    burned = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    print(f"burner(s) stopped; CPU seconds used by child processes (burners, kernels): {burned:.0f}")
    if results:
        print_table(results)
    print("all runs passed" if not failures else f"{failures} run(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
