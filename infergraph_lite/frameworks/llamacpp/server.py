"""A real LLM server on this machine: llama.cpp's C++ server in its own process, on 127.0.0.1 (notebook 08).

:class:`LlamaCppServer` starts ``python -m infergraph_lite.frameworks.llamacpp.serve`` (which embeds
llama.cpp's server through the ``xllamacpp`` wheel), waits until ``/health`` answers, and stops that
process by its own PID.  The knobs are llama.cpp's own:

==================  =====================================================  =====================
ours / llama.cpp    what it is                                             vLLM's name
==================  =====================================================  =====================
``n_parallel``      slots: sequences decoded together (``--parallel``)     ``max_num_seqs``
``n_ctx``           KV cells in total, split evenly among the slots        (``num_gpu_blocks``)
``n_batch``         most tokens one ``llama_decode`` call takes            ``max_num_batched_tokens``
``n_ubatch``        tokens per physical compute step inside a decode call  --
``cont_batching``   sequences join and leave between decode steps          always on
``cache_ram_mib``   host memory keeping prompts evicted from slots         (CPU offload: LMCache)
                    (``--cache-ram``; None: llama.cpp's default, 0: off)
``slot_prompt_``    a request goes to the idle slot whose cached prompt    --
``similarity``      shares over this fraction of it (``--slot-prompt-
                    similarity``; None: llama.cpp's 0.1, 0: never)
==================  =====================================================  =====================

A request reuses a slot's cached prompt only if it asks (``cache_prompt``: see :class:`LlamaCppClient`); the server
itself never does, so each request pays its own prefill unless told otherwise (notebook 10).

Start-up failures have names, checked before any process starts where possible: :class:`ModelMissingError`,
:class:`ModelLoadError`, :class:`PortTakenError`, :class:`BadParameterError`; anything else is a
:class:`ServerStartError` carrying the end of llama.cpp's log.  A server that dies later, during requests,
fails every open request of its clients with a ``RequestError`` that says so (:meth:`LlamaCppServer.exit_reason`:
its PID, how it ended, its log's last line).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import psutil

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.frameworks.llamacpp.model import ModelInfo, trained_context_length
from infergraph_lite.serving.exits import describe_exit, exit_status, last_log_line, weak_exit_reason
from infergraph_lite.serving.processes import process_tree, stop_processes

__all__ = ["BadParameterError", "LlamaCppServer", "ModelLoadError", "ModelMissingError", "PortTakenError",
           "ServerStartError", "check_server_parameters"]

SLOT_CTX_MULTIPLE = 256     # llama.cpp pads each slot's context up to a multiple of 256 cells (and at least 256)


class ServerStartError(RuntimeError):
    """The llama.cpp server did not start; ``log_tail`` holds the end of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- llama.cpp log (end) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class ModelMissingError(ServerStartError, FileNotFoundError):
    """The model file does not exist."""


class ModelLoadError(ServerStartError):
    """The model file exists but llama.cpp cannot load it (not a GGUF file, or a broken one)."""


class PortTakenError(ServerStartError, OSError):
    """The port asked for is already taken on 127.0.0.1."""


class BadParameterError(ServerStartError, ValueError):
    """A server parameter llama.cpp would reject or silently change; ``argument`` and ``value`` name it."""

    def __init__(self, argument: str, value: Any, why: str) -> None:
        super().__init__(f"{argument}={value!r}: {why}")
        self.argument = argument
        self.value = value


def _positive_int(name: str, value: Any) -> int:
    # An int, also from a numpy integer (what reaches the child's JSON config must be a Python int).
    try:
        return check_count(name, value)
    except ValueError:
        raise BadParameterError(name, value, "must be an integer >= 1") from None


def _port(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= 65535:
        raise BadParameterError("port", value, "must be None (a free port) or an int in 1..65535")
    return int(value)


def check_server_parameters(*, n_parallel: int, n_ctx: int, n_batch: int, n_ubatch: int, threads: int,
                            port: int | None, model_ctx: int | None = None) -> None:
    """Refuse, by name, a parameter set llama.cpp would reject or silently change (nothing is started).

    llama.cpp gives each of the ``n_parallel`` slots ``n_ctx / n_parallel`` KV cells, rounded up to a multiple
    of 256 and capped at the model's trained context (``model_ctx``); we refuse instead of letting it round.

    >>> check_server_parameters(n_parallel=8, n_ctx=4096, n_batch=2048, n_ubatch=512, threads=2, port=None)
    >>> check_server_parameters(n_parallel=8, n_ctx=1000, n_batch=2048, n_ubatch=512, threads=2, port=None)
    Traceback (most recent call last):
    infergraph_lite.frameworks.llamacpp.server.BadParameterError: n_ctx=1000: must be n_parallel (8) x a multiple \
of 256 KV cells per slot (llama.cpp would round it to 2048), e.g. n_ctx=2048
    """
    for name, value in (("n_parallel", n_parallel), ("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                        ("threads", threads)):
        _positive_int(name, value)
    _port(port)
    n_parallel, n_ctx, n_batch, n_ubatch = int(n_parallel), int(n_ctx), int(n_batch), int(n_ubatch)
    per_slot = n_ctx // n_parallel
    if n_ctx % n_parallel or per_slot % SLOT_CTX_MULTIPLE or per_slot == 0:
        rounded = max(SLOT_CTX_MULTIPLE, -(-per_slot // SLOT_CTX_MULTIPLE) * SLOT_CTX_MULTIPLE) * n_parallel
        raise BadParameterError("n_ctx", n_ctx, f"must be n_parallel ({n_parallel}) x a multiple of "
                                f"{SLOT_CTX_MULTIPLE} KV cells per slot (llama.cpp would round it to {rounded}), "
                                f"e.g. n_ctx={rounded}")
    if model_ctx is not None and per_slot > model_ctx:
        raise BadParameterError("n_ctx", n_ctx, f"gives each of the {n_parallel} slots {per_slot} KV cells, more "
                                f"than the model's trained context ({model_ctx}); llama.cpp would cap it; use "
                                f"n_ctx <= {model_ctx * n_parallel}")
    if n_ubatch > n_batch:
        raise BadParameterError("n_ubatch", n_ubatch, f"must be <= n_batch ({n_batch}): a decode call of n_batch "
                                "tokens is computed in steps of n_ubatch")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop(proc: subprocess.Popen[bytes], timeout: float, log: Path | None = None) -> None:
    # Runs from close(), the finaliser and atexit: close the child's stdin (it stops on EOF), SIGTERM it by
    # its own PID, then stop_processes escalates to SIGKILL for it and anything it started.  ``log``: a log
    # file this server made for itself, removed once the process is gone.
    if proc.poll() is not None:
        if log is not None:
            log.unlink(missing_ok=True)
        return
    try:
        pids = [*process_tree(proc.pid), proc.pid]
    except psutil.Error:  # it exited between poll() and here
        pids = [proc.pid]
    try:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        stop_processes(pids, timeout=timeout)
    finally:
        if proc.poll() is None:          # interrupted (e.g. Ctrl-C) before it ended: do not leave it running
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=3.0)
        if proc.stdout is not None:
            proc.stdout.close()
        if log is not None:
            log.unlink(missing_ok=True)


class LlamaCppServer:
    """llama.cpp's server on 127.0.0.1 in a child process of its own; a context manager that stops it by PID.

    ``model`` is a GGUF path or the :class:`~infergraph_lite.frameworks.llamacpp.model.ModelInfo` of
    :func:`~infergraph_lite.frameworks.llamacpp.model.write_tiny_llama`.  ``n_ctx`` defaults to 512 KV cells
    per slot.  ``port=None`` lets the OS pick a free port when the server binds (no race with other
    programs); a port given explicitly is checked first and a taken one raises :class:`PortTakenError`.
    ``threads`` defaults to 1: llama.cpp's threads meet at a barrier after every operation, so on a busy
    machine (fewer free cores than threads) a token can take ten times longer with 2 threads than with 1.
    Start-up waits at most ``ready_timeout`` seconds.  The process is stopped by ``close()``, at the end of a
    ``with`` block (also when it raises), when the object is garbage-collected, and at interpreter exit.

    >>> from infergraph_lite.frameworks.llamacpp.model import write_tiny_llama
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> with LlamaCppServer(model, n_parallel=2) as server:
    ...     server.url.startswith("http://127.0.0.1:"), len(server.slots())
    (True, 2)
    >>> server.running
    False
    """

    def __init__(self, model: str | os.PathLike[str] | ModelInfo, *, n_parallel: int = 1, n_ctx: int | None = None,
                 n_batch: int = 2048, n_ubatch: int = 512, cont_batching: bool = True, threads: int = 1,
                 port: int | None = None, ready_timeout: float = 60.0, log_path: str | os.PathLike[str] | None = None,
                 start: bool = True, cache_ram_mib: int | None = None,
                 slot_prompt_similarity: float | None = None) -> None:
        path = Path(model.path if isinstance(model, ModelInfo) else model)
        # Numpy integers are taken as ints (and stored as ints: they go to the child as JSON); anything else that
        # is not a whole number >= 1 is refused by name.
        n_parallel = _positive_int("n_parallel", n_parallel)
        n_ctx = 512 * n_parallel if n_ctx is None else _positive_int("n_ctx", n_ctx)
        n_batch, n_ubatch, threads = (_positive_int(k, v) for k, v in
                                      (("n_batch", n_batch), ("n_ubatch", n_ubatch), ("threads", threads)))
        port = _port(port)
        if cache_ram_mib is not None and (isinstance(cache_ram_mib, bool) or not isinstance(
                cache_ram_mib, (int, np.integer)) or cache_ram_mib < -1):
            raise BadParameterError("cache_ram_mib", cache_ram_mib, "must be None, -1 (no limit), 0 (off) or MiB")
        if slot_prompt_similarity is not None and (isinstance(slot_prompt_similarity, bool) or not isinstance(
                slot_prompt_similarity, (int, float, np.number)) or not 0 <= slot_prompt_similarity <= 1):
            raise BadParameterError("slot_prompt_similarity", slot_prompt_similarity, "must be None or in [0, 1]")
        if not isinstance(cont_batching, (bool, np.bool_)):
            raise BadParameterError("cont_batching", cont_batching, "must be True or False")
        cont_batching = bool(cont_batching)
        try:
            ready_timeout = check_number("ready_timeout", ready_timeout)
        except ValueError:
            raise BadParameterError("ready_timeout", ready_timeout, "must be a number of seconds > 0") from None
        if not path.is_file():
            raise ModelMissingError(f"model file {str(path)!r} does not exist (write one with write_tiny_llama())")
        try:
            model_ctx = model.ctx if isinstance(model, ModelInfo) else trained_context_length(path)
        except ValueError as error:
            raise ModelLoadError(str(error)) from None
        check_server_parameters(n_parallel=n_parallel, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                                threads=threads, port=port, model_ctx=model_ctx)
        self.model_path = path
        self.model = model if isinstance(model, ModelInfo) else None
        self.n_parallel = n_parallel
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.cont_batching = cont_batching
        self.threads = threads
        self.cache_ram_mib = None if cache_ram_mib is None else int(cache_ram_mib)
        self.slot_prompt_similarity = None if slot_prompt_similarity is None else float(slot_prompt_similarity)
        self.ready_timeout = float(ready_timeout)
        self._port_asked = port
        self._own_log = log_path is None
        self._kept_log_tail = ""    # the log's end, kept by close() when it removes a log of its own
        self.log_path = Path(log_path) if log_path is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._closing = False            # close() was called: a process that ends now was stopped, not killed
        self._finalizer: weakref.finalize | None = None
        self.url = ""
        self.port = 0
        self.startup_s = float("nan")    # the child's own start (model load + bind), seconds
        self.ready_s = float("nan")      # Popen -> /health answers, seconds (includes Python's start)
        if start:
            self.start()

    # --- life cycle -----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The server process's PID (None before start)."""
        return None if self._proc is None else self._proc.pid

    @property
    def slot_ctx(self) -> int:
        """KV cells each slot holds (``n_ctx / n_parallel``): the most prompt + output one request can have."""
        return self.n_ctx // self.n_parallel

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LlamaCppServer:
        """Start the process and wait until ``/health`` answers; raises a named error and leaves nothing."""
        if self._proc is not None:
            raise RuntimeError("this LlamaCppServer was already started; make a new one")
        if self._port_asked is not None and not _port_is_free(self._port_asked):
            raise PortTakenError(f"port {self._port_asked} is already taken on 127.0.0.1 (use port=None for a "
                                 "free one)")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llamacpp-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        config = {"model": str(self.model_path), "n_parallel": self.n_parallel, "n_ctx": self.n_ctx,
                  "n_batch": self.n_batch, "n_ubatch": self.n_ubatch, "cont_batching": self.cont_batching,
                  "threads": self.threads, "port": self._port_asked or 0, "cache_ram_mib": self.cache_ram_mib,
                  "slot_prompt_similarity": self.slot_prompt_similarity}
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infergraph_lite.frameworks.llamacpp.serve", json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=self._child_env())
        # also runs at interpreter exit; the log this server made is removed with it (errors carry its text)
        self._finalizer = weakref.finalize(self, _stop, self._proc, 5.0, self.log_path if self._own_log else None)
        try:
            line = self._read_line(started + self.ready_timeout)
            if not line.startswith("READY "):
                self._raise_start_failure(line)
            _, self.url, startup = line.split()
            self.port = int(self.url.rsplit(":", 1)[1])
            self.startup_s = float(startup)
            self._wait_healthy(started + self.ready_timeout)
            self.ready_s = time.perf_counter() - started
        except BaseException:
            self.close()
            raise
        return self

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The child imports this package: make it the same copy as ours (a worktree on PYTHONPATH, or the install).
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def _read_line(self, deadline: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        stdout: IO[bytes] = self._proc.stdout
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise ServerStartError(f"llama.cpp server not ready after {self.ready_timeout:.0f} s "
                                           "(ready_timeout)", self.log_tail())
                if sel.select(timeout=min(left, 0.5)):
                    return stdout.readline().decode(errors="replace").strip()
                if self._proc.poll() is not None:
                    return ""

    def _raise_start_failure(self, line: str) -> None:
        assert self._proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5.0)
        log = self.log_tail(60)
        if "couldn't bind HTTP server socket" in log:
            raise PortTakenError(f"port {self._port_asked or 0} could not be bound on 127.0.0.1 (taken?)", log)
        if "failed to load model" in log:
            raise ModelLoadError(f"llama.cpp could not load the model {str(self.model_path)!r}", log)
        code = self._proc.returncode
        ended = "did not end" if code is None else exit_status(code)    # after 5 s, still exiting
        said = last_log_line(log)
        raise ServerStartError(f"llama.cpp server (pid {self._proc.pid}) exited during start-up ({ended}, "
                               f"{line or 'no output'})" + (f"; its log ends: {said!r}" if said else ""), log)

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self._proc is None or self._proc.poll() is not None:
                raise ServerStartError(f"/health never answered: {self.exit_reason()}", self.log_tail())
            if time.perf_counter() > deadline:
                raise ServerStartError(f"/health did not answer within {self.ready_timeout:.0f} s (ready_timeout)",
                                       self.log_tail())
            time.sleep(0.05)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM by its PID; SIGKILL after ``timeout`` s); waits at most ~``timeout`` + 6 s."""
        self._closing = True
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._proc is not None:
            _stop(self._proc, timeout)
        if self._own_log and self.log_path is not None:
            # a client whose stream the stop cut off may still ask why (exit_reason): keep the log's end for it
            self._kept_log_tail = self.log_tail(200)
            self.log_path.unlink(missing_ok=True)    # a start-up error already carries the log's text

    def __enter__(self) -> LlamaCppServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def exit_reason(self, wait: float = 0.0) -> str:
        """Why the server's process ended, in one line: ``''`` while it runs (after waiting up to ``wait`` s for it
        to end).

        Its clients ask this when a request's connection breaks, and put the answer in the ``RequestError``:
        ``"the llama.cpp server (pid 123) died (killed by SIGKILL); its log ends: '...'"``.  A killed process
        closes its sockets a moment before it can be reaped, hence ``wait``.
        """
        proc = self._proc
        if proc is None:
            return ""
        try:
            code = proc.wait(timeout=wait) if wait > 0 else proc.poll()
        except subprocess.TimeoutExpired:
            return ""
        if code is None:
            return ""
        return describe_exit("the llama.cpp server", proc.pid, code, self.log_tail(), stopped=self._closing)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of llama.cpp's log (its stderr)."""
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path is not None else ""
        except FileNotFoundError:    # removed by close(), maybe while a client thread was asking
            text = self._kept_log_tail
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = f"{self.url} pid {self.pid}" if self.running else "stopped"
        return (f"LlamaCppServer({self.model_path.name}, n_parallel={self.n_parallel}, n_ctx={self.n_ctx}, "
                f"cont_batching={self.cont_batching}, {state})")

    # --- what it serves -------------------------------------------------------------------------------------
    def _get(self, path: str, timeout: float = 10.0) -> bytes:
        if not self.running:
            raise RuntimeError(f"the llama.cpp server is not running: {self.exit_reason() or 'not started'}")
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            data: bytes = response.read()
            return data

    def slots(self) -> list[dict[str, Any]]:
        """``/slots``: one dict per slot (``id``, ``n_ctx``, ``is_processing``, ...)."""
        data: list[dict[str, Any]] = json.loads(self._get("/slots"))
        return data

    def busy_slots(self) -> int:
        """How many slots are processing a request now (from ``/slots``)."""
        return sum(1 for s in self.slots() if s.get("is_processing"))

    def metrics(self) -> dict[str, float]:
        """``/metrics`` parsed: ``{name without 'llamacpp:': value}`` (counters since start, and gauges)."""
        from infergraph_lite.frameworks.llamacpp.client import parse_prometheus

        return parse_prometheus(self._get("/metrics").decode())

    def client(self, **options: Any) -> Any:
        """A :class:`~infergraph_lite.frameworks.llamacpp.client.LlamaCppClient` for this server."""
        from infergraph_lite.frameworks.llamacpp.client import LlamaCppClient

        if self.model is not None:
            options.setdefault("banned_tokens", self.model.byte_token_ids)
        options.setdefault("exit_reason", weak_exit_reason(self))   # a broken request says whether this died
        return LlamaCppClient(self.url, **options)
