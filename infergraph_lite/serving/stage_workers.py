"""A stage's replicas in worker processes: ``GraphServer(..., workers="processes")`` (notebook 06).

The parent keeps the batching: each stage's :class:`~infergraph_lite.serving.batcher.DynamicBatcher` forms
batches under the stage's one :class:`~infergraph_lite.core.policy.BatchPolicy`, on ``replicas`` threads;
a :class:`StageWorkers` is that batcher's ``batch_fn`` and hands each batch to one of ``replicas`` worker
processes (one per thread, as Triton's model instances and Ray Serve's replicas are processes), which only
runs ``fn(batch)``.  Batches and answers cross a pipe, pickled.

Why a fresh interpreter per worker (spawned, not forked).  ``fork`` copies a process that already runs
threads (every batcher's, a notebook kernel's), and a lock one of them held is copied held, forever;
``forkserver`` leaves a server process running for the whole session; ``multiprocessing``'s ``spawn``
re-runs the parent's main script in every worker (a script without an ``if __name__ == "__main__"`` guard
starts its servers again).  So a worker is ``python -c <bootstrap>`` started by :mod:`subprocess`, talking
over two pipes: safe with threads, nothing of ``__main__`` runs in it, no process outlives
:meth:`StageWorkers.close`.  Its price: a worker costs a new interpreter (a second or so, paid at start,
all workers starting at once), and ``fn`` must reach the worker by name.  So a stage function works if it
pickles *and* lives in an importable module: a module-level function, a ``functools.partial`` of one, an
instance of a module-level class.  Lambdas, closures and anything defined in ``__main__`` (a notebook's
cells) are refused by name before any process starts (:func:`check_picklable`).

Failures are answers: ``fn`` raising fails that batch with the exception itself (or a
:class:`RemoteError` carrying its type, message and traceback when it cannot be pickled); a worker that dies
mid-batch (killed, crashed) fails its batch with :class:`WorkerDiedError` naming the stage and the PID and
quoting the last line the worker wrote to its stderr (which goes to a file of its own), and is **replaced** by
a fresh worker; if the replacement cannot start, the stage is marked failed and every later batch fails at
once with :class:`WorkerDiedError`.  Nothing waits without watching the worker's
sentinel, so nothing hangs.  Every worker is stopped by its own PID
(:func:`~infergraph_lite.serving.processes.stop_processes`).
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import pickletools
import queue
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import IO, Any

from infergraph_lite.serving.exits import last_log_line, tail_of_file
from infergraph_lite.serving.processes import stop_processes

__all__ = ["RemoteError", "StageWorkers", "WorkerDiedError", "check_picklable", "cores_available"]

_STOP = None  # the message that tells a worker to exit
# A worker's whole start: two pipe ends from argv, the parent's sys.path, then the loop below.
_BOOTSTRAP = ("import sys\nfrom multiprocessing.connection import Connection\n"
              "inbox = Connection(int(sys.argv[1]), writable=False)\n"
              "outbox = Connection(int(sys.argv[2]), readable=False)\n"
              "sys.path[:0] = inbox.recv()\n"
              "from infergraph_lite.serving.stage_workers import _worker_main\n"
              "_worker_main(inbox, outbox)\n")


class WorkerDiedError(RuntimeError):
    """A stage's worker process died (or could not start); ``.stage``, ``.pid`` and ``.exitcode`` say which, and
    ``.log_line`` is the last line it wrote to its stderr (``''``: none).

    >>> str(WorkerDiedError("embed", 12, -9, "died during a batch of 4", "MemoryError"))
    "stage 'embed': worker process 12 died during a batch of 4 (exit code -9); its stderr ends: 'MemoryError'"
    """

    def __init__(self, stage: str, pid: int | None, exitcode: int | None, what: str, log_line: str = ""):
        said = f"; its stderr ends: {log_line!r}" if log_line else ""
        super().__init__(f"stage {stage!r}: worker process {pid} {what} (exit code {exitcode}){said}")
        self.stage, self.pid, self.exitcode, self.log_line = stage, pid, exitcode, log_line


class RemoteError(RuntimeError):
    """What a worker's ``fn`` raised, when the exception itself could not cross the process boundary."""

    def __init__(self, type_name: str, message: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}\n--- in the worker process ---\n{remote_traceback}")
        self.type_name, self.remote_traceback = type_name, remote_traceback


def check_picklable(stage: str, fn: Callable[..., Any]) -> bytes:
    """``fn`` pickled, or a ``ValueError`` naming ``stage`` and saying why a worker process could not load it.

    >>> import functools, operator
    >>> len(check_picklable("ok", functools.partial(operator.mul, 2))) > 0
    True
    >>> check_picklable("shout", lambda xs: xs)
    Traceback (most recent call last):
    ...
    ValueError: stage 'shout': its fn <lambda> cannot run in a worker process: ...
    """
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    why = None
    try:
        data = pickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - pickle raises several types; the reason goes in the message
        data, why = b"", f"it does not pickle ({type(exc).__name__}: {exc})"
    if why is None and any(isinstance(arg, str) and arg == "__main__" for _, arg, _ in pickletools.genops(data)):
        why = "it is defined in __main__ (a script or notebook), which a spawned worker cannot import"
    if why is not None:
        raise ValueError(f"stage {stage!r}: its fn {label} cannot run in a worker process: {why}. Use a function "
                         "defined at the top level of an importable module (or a functools.partial of one), or "
                         "workers='threads'")
    return data


_PROBE = ("import time\nwall, cpu = time.perf_counter(), time.process_time()\n"
          "while time.perf_counter() - wall < {seconds}:\n    pass\n"
          "print((time.process_time() - cpu) / (time.perf_counter() - wall))\n")


def cores_available(processes: int = 2, seconds: float = 0.3) -> float:
    """How many cores ``processes`` busy-looping Python processes get together right now (at most ``processes``).

    On an idle machine with enough cores it is ``processes``; on a shared one less.  It is what a graph of
    that many CPU-bound worker processes can use, so it says what to expect of ``workers="processes"``
    before measuring it.  Each probe is a bare interpreter (no imports), stopped by its own exit.

    >>> 0.0 < cores_available(processes=1, seconds=0.05) <= 1.05
    True
    """
    probes = [subprocess.Popen([sys.executable, "-c", _PROBE.format(seconds=seconds)], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True) for _ in range(processes)]
    shares = []
    for probe in probes:
        out, _ = probe.communicate(timeout=60 + 10 * seconds)
        shares.append(float(out))
    return float(sum(shares))


def _worker_main(inbox: Connection, outbox: Connection) -> None:
    # The worker process: load fn, say ready, then run batches until told to stop (or the pipe closes).
    try:
        fn = pickle.loads(inbox.recv())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which refuses to start
        outbox.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    outbox.send(("ready", None))
    while True:
        try:
            batch = inbox.recv()
        except (EOFError, OSError):
            return
        if batch is _STOP:
            return
        started = time.thread_time()  # the work's CPU seconds, measured where it runs
        status: str = "ok"
        value: Any = None
        try:
            value = list(fn(batch))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a model too: the batch is told, we go on
            status, value = "error", exc
        work = time.thread_time() - started
        try:
            outbox.send((status, value, work))
        except Exception:  # noqa: BLE001 - an unpicklable result or exception: send what can be sent
            error = value if status == "error" else TypeError("fn returned results that cannot be pickled")
            outbox.send(("error", RemoteError(type(error).__name__, str(error),
                                              "".join(traceback.format_exception(error))), work))


class _Worker:
    # One worker process, the parent's ends of its two pipes (a dead worker closes `conn`: EOF), and the file its
    # stderr goes to (an unnamed temporary file: nothing to remove), read when it dies to say why.
    def __init__(self, process: subprocess.Popen, conn: Connection, send: Connection, log: IO[bytes]):
        self.process, self.conn, self.send, self.log = process, conn, send, log

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def exitcode(self, wait_s: float = 1.0) -> int | None:
        try:
            return self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def last_words(self) -> str:
        """The last meaningful line the worker wrote to its stderr (``''``: none, or its file is closed)."""
        try:
            return last_log_line(tail_of_file(self.log.fileno()))
        except (OSError, ValueError):
            return ""

    def release(self) -> None:
        """Close the parent's pipe ends and the stderr file (the process must be gone, or going)."""
        self.send.close()
        self.conn.close()
        self.log.close()


class StageWorkers:
    """``replicas`` worker processes running one stage's ``fn``; calling it runs one batch on an idle one.

    Use it as a :class:`~infergraph_lite.serving.batcher.DynamicBatcher`'s ``batch_fn`` with as many
    batcher threads as workers, so that a thread always finds an idle worker.  ``start_timeout`` bounds
    how long the workers may take to start (each loads ``fn`` and says it is ready).

    >>> import operator, functools
    >>> with StageWorkers("double", functools.partial(map, functools.partial(operator.mul, 2)), replicas=1) as w:
    ...     answer, pid, work = w([1, 2, 3]), w.pids[0], w.last_work()
    >>> answer, pid > 0, 0 <= work < 0.1, w.pids
    ([2, 4, 6], True, True, [])
    """

    def __init__(self, stage: str, fn: Callable[[list[Any]], Sequence[Any]], replicas: int = 1, *,
                 start_timeout: float = 60.0, start: bool = True):
        self.stage = stage
        self.replicas = replicas
        self._fn_bytes = check_picklable(stage, fn)  # before any process starts
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._closing = False
        self._failed: WorkerDiedError | None = None
        self._last = threading.local()  # each batcher thread's last batch: its work's CPU seconds
        self.replaced: list[int] = []  # PIDs of workers that died and were replaced
        if start:
            self.start()

    def launch(self) -> list[_Worker]:
        """Start the worker processes without waiting for them (:meth:`wait_ready` waits)."""
        started = []
        for _ in range(self.replicas):
            worker = self._spawn()
            with self._lock:  # at once, so that close() stops it even if a later one fails to start
                self._workers.append(worker)
            started.append(worker)
        return started

    def wait_ready(self, workers: Sequence[_Worker] | None = None) -> None:
        """Wait until the launched workers say they loaded ``fn``; stop them all and raise if one cannot."""
        deadline = time.monotonic() + self._start_timeout
        for worker in list(self._workers) if workers is None else workers:
            try:
                self._handshake(worker, deadline)
            except BaseException:
                self.close(timeout=1.0)
                raise
            self._idle.put(worker)

    def start(self) -> None:
        """Start the workers and wait until each has loaded ``fn``."""
        self.wait_ready(self.launch())

    def last_work(self) -> float:
        """The CPU seconds ``fn`` used in its worker on the calling thread's last batch (NaN if none ran).

        A :class:`~infergraph_lite.serving.batcher.DynamicBatcher` whose ``batch_fn`` has this method records it
        as each batch's ``work``: the parent thread's own CPU time would be the pickling, not the model.
        """
        return getattr(self._last, "work", math.nan)

    @property
    def pids(self) -> list[int]:
        """The PIDs of the living workers."""
        with self._lock:
            return [w.pid for w in self._workers if w.alive()]

    def __call__(self, batch: list[Any]) -> list[Any]:
        """Run ``fn(batch)`` in an idle worker; raise what it raised, or :class:`WorkerDiedError`."""
        if self._failed is not None:
            raise self._failed
        worker = self._idle.get()
        if worker is None:  # close(), or a stage marked failed, wakes waiting callers with None
            raise self._failed or RuntimeError(f"stage {self.stage!r}: the workers are closed")
        self._last.work = math.nan
        try:
            worker.send.send(batch)
            status, value, self._last.work = worker.conn.recv()  # or EOFError once the worker has died
        except (BrokenPipeError, EOFError, OSError):
            status, value = "died", None
        except Exception as exc:  # noqa: BLE001 - a batch that does not pickle, or an answer that does not load
            why = f"the batch or its answer could not cross the process boundary: {exc}"
            status, value = "error", RemoteError(type(exc).__name__, why, "".join(traceback.format_exception(exc)))
        if status == "died":
            code = worker.exitcode()
            said = worker.last_words()  # before _replace closes its file
            self._replace(worker)
            raise WorkerDiedError(self.stage, worker.pid, code, f"died during a batch of {len(batch)}", said)
        self._idle.put(worker)
        if status == "error":
            raise value
        return value

    def close(self, timeout: float | None = 10.0) -> list[int]:
        """Tell every worker to exit, wait up to ``timeout`` s, then stop the rest by PID (SIGTERM, then
        SIGKILL); returns the PIDs that had to be stopped that way."""
        with self._lock:
            self._closing = True
            workers, self._workers = list(self._workers), []
        for worker in workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                worker.send.send(_STOP)
        deadline = time.monotonic() + (10.0 if timeout is None else timeout)
        for worker in workers:
            worker.exitcode(max(deadline - time.monotonic(), 0.0))
        stuck = [w.pid for w in workers if w.alive()]
        if stuck:
            stop_processes(stuck, timeout=0.0)
        for worker in workers:
            worker.exitcode(1.0)  # reap it (stop_processes may have already)
            worker.release()
            self._idle.put(None)  # wakes a thread waiting for an idle worker
        return stuck

    def __enter__(self) -> StageWorkers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _spawn(self) -> _Worker:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Its stderr goes to a file, so that a worker that dies is reported with its last words (a traceback's
        # last line, a fatal error) rather than leaving them on a terminal a notebook never shows.
        log = tempfile.TemporaryFile(prefix=f"stage-{self.stage}-")  # noqa: SIM115 - the worker's, closed by release()
        try:
            process = subprocess.Popen([sys.executable, "-c", _BOOTSTRAP, str(to_child_r), str(from_child_w)],
                                       pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stderr=log)
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            log.close()
            raise
        os.close(to_child_r)  # the parent keeps only its ends: the worker's dying closes `conn`
        os.close(from_child_w)
        worker = _Worker(process, Connection(from_child_r, writable=False), Connection(to_child_w, readable=False),
                         log)
        try:
            worker.send.send([p for p in sys.path if isinstance(p, str)])
            worker.send.send(self._fn_bytes)
        except BaseException:
            stop_processes([worker.pid], timeout=0.0)  # it died at once, or we were interrupted: leave nothing
            worker.release()
            raise
        return worker

    def _handshake(self, worker: _Worker, deadline: float) -> None:
        status, detail = "died", None
        if not wait([worker.conn], timeout=max(deadline - time.monotonic(), 0.0)):
            raise WorkerDiedError(self.stage, worker.pid, None, f"did not start within {self._start_timeout} s",
                                  worker.last_words())
        with contextlib.suppress(EOFError, OSError):
            status, detail = worker.conn.recv()
        if status == "failed":
            raise ValueError(f"stage {self.stage!r}: the worker process could not load fn: {detail}")
        if status != "ready":
            code = worker.exitcode()  # first: its last words are all written once it has exited
            raise WorkerDiedError(self.stage, worker.pid, code, "exited while starting", worker.last_words())

    def _replace(self, dead: _Worker) -> None:
        # A fresh worker takes the dead one's place; if it cannot start, the stage fails from now on.
        with self._lock:
            if self._closing:
                return
            self._workers.remove(dead)
            self.replaced.append(dead.pid)
        dead.release()
        try:
            fresh = self._spawn()
            with self._lock:
                self._workers.append(fresh)
            self._handshake(fresh, time.monotonic() + self._start_timeout)
        except BaseException as exc:  # noqa: BLE001 - the stage is marked failed instead
            self._failed = WorkerDiedError(self.stage, dead.pid, dead.process.returncode,
                                           f"died and its replacement failed to start ({exc}); the stage is failed")
            for _ in range(self.replicas):
                self._idle.put(None)
            return
        self._idle.put(fresh)
