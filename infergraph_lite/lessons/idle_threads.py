"""What a process's own background threads burn while its code waits, and a wait until they stop (notebook 03).

BLAS libraries do not put their threads to sleep the moment a matrix product ends: they spin, waiting for the
next one, for a while (OpenBLAS 2^28 cycles by default, about a tenth of a second, set by
``OPENBLAS_THREAD_TIMEOUT``; Intel's OpenMP runtime 200 ms, ``KMP_BLOCKTIME``).  A spinning thread stays
runnable and competes for a core.  A measurement that starts right after a multi-threaded product may therefore
run on fewer free cores than it seems to: two worker threads timed just after a product with BLAS's default
threads compete with the spinner.  :func:`spinning_cpu_seconds` measures that spin, :func:`wait_until_idle`
waits it out, so each configuration of a comparison starts on the same free cores.

Used by notebook 03 (section 7) and ``benchmarks/bench_parallel.py``.
"""

from __future__ import annotations

import time


def spinning_cpu_seconds(after: float = 0.3) -> float:
    """CPU seconds this process burns while its calling thread sleeps ``after`` seconds.

    Call it right after the work whose background threads you suspect: a thread that only sleeps burns
    nothing, so what is measured is other threads of this process still running.

    >>> import threading
    >>> until = time.perf_counter() + 0.2
    >>> def spin():  # what an idle BLAS thread does: burn a core, waiting for work
    ...     while time.perf_counter() < until:
    ...         pass
    >>> spinner = threading.Thread(target=spin)
    >>> spinner.start(); burned = spinning_cpu_seconds(after=0.1); spinner.join()
    >>> burned > 0.03  # the spinner ran, on a core or a share of one, while the caller slept
    True
    """
    if not after > 0:  # also refuses NaN
        raise ValueError(f"after must be positive seconds, got {after!r}")
    started = time.process_time()
    time.sleep(after)
    return time.process_time() - started


def wait_until_idle(*, quiet: float = 0.05, slice_seconds: float = 0.02, timeout: float = 2.0) -> float:
    """Sleep until this process's other threads use under ``quiet`` of a core for one ``slice_seconds``.

    Returns the seconds waited.  Gives up after ``timeout`` seconds (a thread that never stops, a server's
    poller say, must not hang a measurement) and returns what it waited.

    >>> import threading
    >>> until = time.perf_counter() + 0.15
    >>> def spin():
    ...     while time.perf_counter() < until:
    ...         pass
    >>> busy = threading.Thread(target=spin)
    >>> busy.start(); waited = wait_until_idle(); busy.join()
    >>> waited > 0.1  # it waited for the busy thread to finish
    True
    """
    for name, value in {"quiet": quiet, "slice_seconds": slice_seconds, "timeout": timeout}.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    started = time.perf_counter()
    while True:
        burned = spinning_cpu_seconds(slice_seconds)
        waited = time.perf_counter() - started
        if burned < quiet * slice_seconds or waited >= timeout:
            return waited
