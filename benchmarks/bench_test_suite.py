"""The whole `make test` run, timed (target, issue 11: the fresh-clone bootstrap plus `make test` under
10 minutes on 2 cores; the suite alone gets 8 of them).

The virtual environment is already built when `make bench` runs this, so what is timed is the suite
itself: unit, property, hygiene and lint tests, and nbval re-running every notebook.

    python benchmarks/bench_test_suite.py      (or: make bench)
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from _timing import machine, table, verdict


def main() -> None:
    root = Path(__file__).resolve().parent.parent
    started = time.perf_counter()
    result = subprocess.run(["make", "--no-print-directory", "test"], cwd=root, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    closing = [line for line in result.stdout.splitlines() if " passed" in line or " failed" in line]
    summary = closing[-1].strip("= ") if closing else "(no pytest summary line)"
    if result.returncode != 0:
        raise SystemExit(f"make test failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    table(f"Test suite ({machine()})", ["measure", "value", "target", "verdict"],
          [["make test, seconds", seconds, "< 480", verdict(seconds, 480, "lower")], ["pytest says", summary, "", ""]])


if __name__ == "__main__":
    main()
