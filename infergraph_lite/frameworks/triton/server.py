"""A real ``tritonserver`` on 127.0.0.1: started from the ``nvidia-pytriton`` wheel, stopped by its own PID.

A server that dies, during start-up or while requests are open, is named with its PID, how it ended and its
log's last line: in :class:`TritonStartError`, and in the error of every request its clients had open.

See ``/work/shared/reference/triton-cpu`` (the recipe this follows) for what the binary and its Python stubs
need: a backend folder, the venv's ``bin`` on ``PATH``, ``LD_LIBRARY_PATH`` with the interpreter's LIBDIR.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from infergraph_lite.frameworks.triton.client import TritonClient
from infergraph_lite.frameworks.triton.errors import TritonStartError, TritonUnavailableError
from infergraph_lite.frameworks.triton.repository import Repository, read_repository
from infergraph_lite.serving.exits import describe_exit, exit_status, last_log_line, weak_exit_reason
from infergraph_lite.serving.processes import free_ports, stop_processes, within

__all__ = ["TritonServer", "triton_available"]


def _pytriton_root() -> Path:
    if not (sys.platform == "linux" and os.uname().machine == "x86_64"):
        raise TritonUnavailableError(
            f"the tritonserver binary ships (in the nvidia-pytriton wheel) for Linux x86_64 only; this is "
            f"{sys.platform} {os.uname().machine}. Run Triton's container instead (nvcr.io/nvidia/tritonserver) "
            "and point TritonClient at it.")
    found = importlib.util.find_spec("pytriton")
    if found is None or not found.submodule_search_locations:
        raise TritonUnavailableError("nvidia-pytriton is not installed: pip install -r requirements.txt "
                                     "(it carries the tritonserver binary)")
    root = Path(next(iter(found.submodule_search_locations))) / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        raise TritonUnavailableError(f"no tritonserver binary in {root / 'bin'}: reinstall nvidia-pytriton")
    return root


def triton_available() -> str | None:
    """``None`` when the tritonserver binary can run here, else the reason why not.

    >>> triton_available() is None or isinstance(triton_available(), str)
    True
    """
    try:
        _pytriton_root()
    except TritonUnavailableError as err:
        return str(err)
    return None


def _free_ports(count: int) -> list[int]:
    return free_ports(count)


def _group_members(pgid: int) -> list[int]:
    # Every living process of the server's process group but the server itself: its Python stubs, found also once
    # the server is gone (a killed server's stubs are re-parented, so they are nobody's children any more).
    import psutil

    members = []
    for process in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if process.pid != pgid and os.getpgid(process.pid) == pgid:
                members.append(process.pid)
    return members


def _stop_process_group(process: subprocess.Popen, grace: float, timeout: float | None = None) -> None:
    # SIGINT (Triton's clean shutdown), then SIGTERM, then SIGKILL, by the server's own PID; then anything
    # left in its process group (its Python stubs), whose id is that same PID.  A Ctrl-C while waiting
    # (a learner interrupting the kernel) skips to SIGKILL, so the server never outlives the interruption.
    # With a timeout, the waits are cut so that the whole stop returns within it.
    import psutil

    if timeout is not None:
        grace = min(grace, 0.5 * timeout)
    term, kill, stub_wait = (3.0, 5.0, 5.0) if timeout is None else (0.15 * timeout, 0.15 * timeout, 0.2 * timeout)
    try:  # the model stubs, remembered now: once the server is gone they are nobody's children
        stubs = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
    except psutil.Error:
        stubs = []
    stubs = [*dict.fromkeys([*stubs, *_group_members(process.pid)])]  # a server that died left them in its group
    interrupted: BaseException | None = None
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, term), (signal.SIGKILL, kill)):
        if process.poll() is not None:
            break
        try:
            process.send_signal(sig)
            process.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            break
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    stop_processes(stubs, **within(stub_wait))  # wait until every stub is really gone (SIGKILL is not instant)
    if interrupted is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(kill)  # reap it
        raise interrupted


def _port_taken(log: str) -> bool:
    return "already in use" in log or "Address in use" in log or "Failed to bind" in log


class TritonServer:
    """A real ``tritonserver`` on 127.0.0.1, free ports, as a context manager that always stops it.

    Starts the binary from the ``nvidia-pytriton`` wheel on the repository, waits until it is ready
    (``timeout`` seconds), and keeps its log (``.log``).  Leaving the block -- also by an exception --
    stops it by its own PID: SIGINT, then SIGTERM, then SIGKILL, and nothing of its process group is
    left.  A start that fails (port taken, bad config, missing binary) raises an error naming the cause
    and leaves no process.  ``model_control="explicit"`` lets :meth:`TritonClient.load` reload models.

    >>> TritonServer("no-such-repository").start()
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.triton.errors.TritonConfigError: model repository no-such-repository does not exist

    Typical use (needs the binary, so not run as a doctest)::

        with TritonServer(repo) as server, server.client() as client:
            client.infer({"text": "The pizza was excellent."})          # {'format': 'food (0.91), ...'}
            run_closed_loop(client, n_clients=16, n_requests=500, make_item=...)
            client.statistics()["embed"].batch_sizes                     # {1: 40, 2: 31, ...}
    """

    def __init__(self, repository: Repository | str | Path, *, timeout: float = 60.0,
                 model_control: Literal["none", "explicit"] = "none", ports: Sequence[int] | None = None,
                 exit_timeout: int = 3, extra_args: Sequence[str] = (), port_attempts: int = 3):
        self.repository = Path(repository.path if isinstance(repository, Repository) else repository)
        self.timeout, self.model_control, self.exit_timeout = timeout, model_control, exit_timeout
        self.extra_args = list(extra_args)
        self._ports = list(ports) if ports else None
        self.port_attempts = port_attempts
        self.attempts = 0
        self.process: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._saved_log = ""
        self._stopping = False  # stop() was called: a process that ends now was stopped, not killed

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def url(self) -> str:
        """``127.0.0.1:port`` of the HTTP endpoint."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def log(self) -> str:
        """Everything the server has written so far."""
        if self._workdir is None or not (self._workdir / "server.log").exists():
            return self._saved_log  # kept from the last run once the server stopped
        return (self._workdir / "server.log").read_text(errors="replace")

    def environment(self, root: Path) -> dict[str, str]:
        """The environment the binary and its Python stubs need (see the triton-cpu recipe)."""
        env = dict(os.environ)
        site = root.parent.parent
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libs = [sysconfig.get_config_var("LIBDIR") or "", str(site / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*[p for p in libs if p], *filter(None, [env.get("LD_LIBRARY_PATH")])])
        # One BLAS thread per stub: every model instance is its own process, so Triton's instance_group
        # count, not BLAS, decides how many cores a model uses (and 2 cores are not oversubscribed).
        for knob in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(knob, "1")
        # The stubs import the package's factories as this process would; what they find besides is what their
        # working directory (this process's) holds: a factory beside a script is copied as source instead.
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
        return env

    def start(self) -> TritonServer:
        """Start the server and wait until it is ready; on failure nothing is left (no process, no folder).

        Without ``ports`` given, the ports are picked free; another process may take one before the server
        binds it (a race no pick can close), so a start that fails on a taken port is retried on newly picked
        ports, ``port_attempts`` times in all.  ``attempts`` says how many starts this took.
        """
        if self.process is not None:
            raise RuntimeError("this TritonServer is already running")
        read_repository(self.repository)  # a bad config fails here, before any process exists
        root = _pytriton_root()
        tries = 1 if self._ports else self.port_attempts
        for attempt in range(1, tries + 1):
            self.attempts = attempt
            try:
                self._start_once(root)
                return self
            except TritonStartError:
                if attempt == tries or not _port_taken(self.log):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self, root: Path) -> None:
        self._stopping = False
        self._workdir = Path(tempfile.mkdtemp(prefix="infergraph-triton-"))
        try:  # from here on, any failure removes the folder (and the process, once there is one)
            backend = self._workdir / "backends" / "python"
            backend.mkdir(parents=True)
            for file in ("libtriton_python.so", "triton_python_backend_utils.py"):
                shutil.copy(root / "backends" / "python" / file, backend)
            version = f"{sys.version_info[0]}.{sys.version_info[1]}"
            stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
            if not stub.exists():
                raise TritonUnavailableError(f"nvidia-pytriton has no Python backend stub for Python {version}")
            shutil.copy(stub, backend)
            self.http_port, self.grpc_port, self.metrics_port = self._ports or _free_ports(3)
            command = [
                str(root / "bin" / "tritonserver"), f"--model-repository={self.repository.resolve()}",
                f"--backend-directory={backend.parent}",
                "--http-address=127.0.0.1", f"--http-port={self.http_port}",
                "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
                "--metrics-address=127.0.0.1", f"--metrics-port={self.metrics_port}", "--allow-gpu-metrics=false",
                f"--exit-timeout-secs={self.exit_timeout}", f"--model-control-mode={self.model_control}",
                "--model-load-thread-count=8", "--disable-auto-complete-config",
                *(["--load-model=*"] if self.model_control == "explicit" else []), *self.extra_args,
            ]
            with open(self._workdir / "server.log", "wb") as log:
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.environment(root),
                                                start_new_session=True)
            self._finalizer = weakref.finalize(self, _stop_process_group, self.process,
                                               float(self.exit_timeout + 2))
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                what = f"(pid {self.process.pid}) exited ({exit_status(self.process.returncode)})"
                raise TritonStartError(self._failure_reason(what), self.log)
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TritonStartError(self._failure_reason(f"was not ready after {self.timeout:.0f} s"), self.log)

    def _failure_reason(self, what: str) -> str:
        log = self.log
        if _port_taken(log):
            cause = (f"a port is taken (http {self.http_port}, grpc {self.grpc_port}, metrics {self.metrics_port}); "
                     "another server is listening there")
        else:
            failed = re.findall(r"failed to load '([^']+)' version \d+: ([^\"\\]*)", log)
            errors = [f"model {model!r} failed to load: {why.strip()}" for model, why in dict.fromkeys(failed)]
            errors += [line.strip() for line in log.splitlines()
                       if not failed and (re.match(r"\s*E\d{4}", line) or line.startswith("error:")
                                          or "unrecognized option" in line)  # then its usage text, no error
                       and "CUDA" not in line and "Cuda" not in line]
            said = last_log_line(log)
            cause = "; ".join(dict.fromkeys(errors[:4])) or (f"its log ends: {said!r}" if said else "see .log")
        return f"tritonserver {what}: {cause}"

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server (SIGINT, SIGTERM, SIGKILL by its PID) and remove its working folder.

        Returns within ``timeout`` seconds when one is given (the grace Triton gets for a clean exit is cut to
        fit); without one, Triton gets ``exit_timeout + 2`` s to finish its requests before it is signalled.
        Safe to call twice.
        """
        self._stopping = True
        if self._finalizer is not None:
            finalizer, self._finalizer = self._finalizer, None
            detached = finalizer.detach()  # runs _stop_process_group once, here, with this timeout
            if detached is not None:
                _, function, args, _ = detached
                function(*args, timeout=timeout)
        if self._workdir is not None:
            self._saved_log = self.log
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self.process = None

    def processes(self) -> list[Any]:
        """The server's process and its children (a Python stub per model instance), as ``psutil.Process``."""
        import psutil

        if self.process is None:
            return []
        try:
            server = psutil.Process(self.process.pid)
            return [server, *server.children(recursive=True)]
        except psutil.NoSuchProcess:  # it died (and was reaped): what is left of its group is stopped by stop()
            return []

    def exit_reason(self, wait: float = 0.0) -> str:
        """Why the server's process ended, in one line: ``''`` while it runs (after waiting up to ``wait`` s for it
        to end), or before it started.

        Its clients ask this when a request's connection breaks, and put the answer in the request's error:
        ``"tritonserver (pid 123) died (killed by SIGKILL); its log ends: '...'"``.  A killed process closes its
        sockets a moment before it can be reaped, hence ``wait``.
        """
        process = self.process
        if process is None:
            return ""
        try:
            code = process.wait(wait) if wait > 0 else process.poll()
        except subprocess.TimeoutExpired:
            return ""
        if code is None:
            return ""
        return describe_exit("tritonserver", process.pid, code, self.log, stopped=self._stopping)

    def instances(self) -> dict[str, int]:
        """Model -> how many Python stub processes serve it now (``instance_group`` count, per version loaded)."""
        counts: dict[str, int] = {}
        for process in self.processes()[1:]:
            try:
                command = process.cmdline()
            except Exception:  # noqa: BLE001 - a stub that just exited has no command line any more
                continue
            if len(command) > 1 and command[1].endswith("model.py"):
                model = Path(command[1]).parent.parent.name
                counts[model] = counts.get(model, 0) + 1
        return dict(sorted(counts.items()))

    def client(self, **options: Any) -> TritonClient:
        """A :class:`TritonClient` connected to this server (``options``: its keyword arguments); a request that
        this server's death breaks off fails with an error saying so (:meth:`exit_reason`)."""
        options.setdefault("exit_reason", weak_exit_reason(self))
        return TritonClient(self.grpc_url, **options)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def close(self, timeout: float | None = None) -> None:
        """The same as :meth:`stop` (every server in the package has a ``close(timeout)``)."""
        self.stop(timeout)
