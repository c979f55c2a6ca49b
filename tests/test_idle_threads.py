"""`spinning_cpu_seconds` and `wait_until_idle`: notebook 03 times each BLAS configuration on free cores with them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from infergraph_lite.lessons.idle_threads import spinning_cpu_seconds, wait_until_idle


def spin_in_background(seconds: float) -> threading.Thread:
    """A thread that burns CPU for ``seconds`` of wall time, as an idle BLAS thread does."""

    def spin() -> None:
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    return thread


def test_a_sleeping_caller_alone_burns_nothing():
    # In a fresh interpreter: this test process may hold other tests' threads (a BLAS pool still spinning).
    code = "from infergraph_lite.lessons.idle_threads import spinning_cpu_seconds; print(spinning_cpu_seconds(0.2))"
    # One BLAS thread: a new OpenBLAS pool thread spins a while after it starts, even before any product.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    burned = float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                  env=env).stdout)
    assert 0 <= burned < 0.02


def test_a_spinning_thread_is_counted_while_the_caller_sleeps():
    spinner = spin_in_background(0.3)
    burned = spinning_cpu_seconds(after=0.15)
    spinner.join()
    assert burned > 0.05  # the spinner had a core (or a share of one) for most of the 0.15 s


def test_wait_until_idle_returns_once_the_spinner_stops_and_not_long_after():
    spinner = spin_in_background(0.2)
    started = time.perf_counter()
    waited = wait_until_idle(timeout=2.0)
    assert not spinner.is_alive()
    assert waited >= 0.15 and time.perf_counter() - started < 1.5


def test_wait_until_idle_gives_up_at_its_timeout_beside_a_thread_that_never_stops():
    spinner = spin_in_background(1.5)
    waited = wait_until_idle(timeout=0.3)
    assert 0.3 <= waited < 1.0 and spinner.is_alive()
    spinner.join()


@pytest.mark.parametrize("kwargs, name", [({"quiet": 0}, "quiet"), ({"slice_seconds": -1}, "slice_seconds"),
                                          ({"timeout": 0}, "timeout")])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        wait_until_idle(**kwargs)
    with pytest.raises(ValueError, match="after"):
        spinning_cpu_seconds(after=0)
