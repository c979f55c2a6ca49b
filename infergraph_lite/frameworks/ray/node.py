"""One local Ray node for a :class:`~infergraph_lite.frameworks.ray.serve.RayServeGraph`: started on loopback,
watched while it starts, stopped by PID.

Starting Ray is several processes racing each other on a busy machine: a GCS server, a raylet, and the two
Python agents the raylet spawns and *fate-shares* with (if one exits, the raylet exits too).  When one of
them dies during the start, Ray does not tell its driver: ``ray.init`` may already have returned, and
``serve.start`` then waits in ``ray.get`` for a controller no node can run -- forever.  So every step of a start
runs under :func:`run_watched`, which returns the step's result, or raises :class:`RayStartError` as soon as
a process the node started has died (naming it and quoting the log line that says why) or when the deadline
passes (naming the step it was in).

The agents' ports are picked here and handed to Ray (so the raylet need not wait 15 s per port for the
agents to write theirs to a file).  They are picked *below the kernel's ephemeral range*
(``free_ports(below_ephemeral=True)``): Ray's own processes bind port 0 and open connections while they start,
and both draw from that range, so a port picked there (as ``bind(0)`` picks) could be taken by Ray itself
before its agent binds it -- the hang this module was written for.  A port taken anyway (by another program
that names it) is reported with ``port_taken=True``, and the caller starts again on fresh ports.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ray._private import ray_constants

from infergraph_lite.serving.exits import exit_status
from infergraph_lite.serving.processes import free_ports, living

__all__ = ["LIGHT_IMPORT_STUBS", "LocalRayNode", "RayStartError", "run_watched"]

T = TypeVar("T")

LIGHT_IMPORT_STUBS = {
    # ``import ray`` imports jsonschema, which imports rfc3987_syntax if it is installed (the Jupyter stack
    # installs it), and that package builds an Earley parser for IRIs at import: about 3 of the 5 CPU-seconds
    # an ``import ray`` costs (measured), in every Python process Ray starts -- its agents, its dashboard
    # server, the Serve controller, every replica -- for a format check Ray never asks for.  jsonschema
    # imports it inside ``suppress(ImportError)``, so a stand-in that raises ImportError only drops that check.
    "rfc3987_syntax": 'raise ImportError("kept out of the processes Ray starts for a RayServeGraph")\n',
}
"""Modules that every process Ray starts for a node here finds as an ImportError (a folder of stand-ins,
first on their ``PYTHONPATH``; this interpreter is not affected)."""

# A log line that says a port was taken: the start is tried again on fresh ports.
PORT_TAKEN = re.compile(r"address already in use|failed to bind", re.IGNORECASE)
# A log line that says why a process stopped.
# A log line that says why a process stopped: Ray's C++ log lines at level E(rror), F(atal) or C(ritical)
# ("[2026-12-06 02:33:05,677 E 15154 15154] ..."), and Python's errors; not an I(nfo) line that mentions a failure.
WHY = re.compile(r"^\[[^\]]* [EFC] \d+ \d+\]|fate-shares|\bERROR\b|\bFATAL\b|Check failed|\b\w+Error\b")
POLL_S = 0.2


class RayStartError(RuntimeError):
    """Ray or Serve did not start: a process it started died (``process``, with the ``log_line`` that says why),
    or a step did not finish by the deadline.  ``port_taken``: the cause was a port another process held, so
    a start on fresh ports may succeed."""

    def __init__(self, message: str, *, process: str | None = None, log_line: str | None = None,
                 port_taken: bool = False):
        super().__init__(message)
        self.process, self.log_line, self.port_taken = process, log_line, port_taken


class LocalRayNode:
    """A Ray head node on 127.0.0.1 that records every process it spawns, as it spawns it.

    ``start()`` returns Ray's ``Node`` (its ``address`` is what ``ray.init`` connects to).  ``roots`` maps the
    PID of each process Ray started itself to its kind ("gcs_server", "raylet", ...); ``dead()`` lists those that
    have exited; ``why(kind)`` quotes the log line that says why.  ``stop()`` ends them (the caller stops their
    descendants by PID).
    """

    def __init__(self, num_cpus: int):
        self.num_cpus = num_cpus
        self.roots: dict[int, str] = {}
        self._popen: dict[int, Any] = {}  # Ray's Popen of each root: how it exited
        self.log_dirs: set[str] = set()  # where Ray's processes write their logs (read from their command lines)
        self.node: Any = None
        self.site: str | None = None  # the folder of LIGHT_IMPORT_STUBS

    def start(self) -> Any:
        """Start the head node (GCS, raylet and the raylet's agents) and return Ray's ``Node``."""
        from ray._private import services
        from ray._private.node import Node
        from ray._private.parameter import RayParams

        metrics_agent, agent_listen, runtime_env_agent, metrics_export = free_ports(4, below_ephemeral=True)
        system_config: dict[str, Any] = {
            "agent_register_timeout_ms": 120_000, "worker_register_timeout_seconds": 120,
            # no idle workers started ahead: they carry no runtime env, so no replica can use them
            "enable_worker_prestart": False, "prestart_worker_first_driver": False}
        options: dict[str, Any] = {"include_log_monitor": False}  # typed str | None in Ray's hints, read as a flag
        params = RayParams(
            node_ip_address="127.0.0.1", num_cpus=self.num_cpus, include_dashboard=False, no_monitor=True,
            metrics_agent_port=metrics_agent, dashboard_agent_listen_port=agent_listen,
            runtime_env_agent_port=runtime_env_agent, metrics_export_port=metrics_export,
            _system_config=system_config, **options)
        site = self.site = tempfile.mkdtemp(prefix="infergraph-ray-site-")
        for module, source in LIGHT_IMPORT_STUBS.items():
            os.makedirs(os.path.join(site, module))
            with open(os.path.join(site, module, "__init__.py"), "w") as stub:
                stub.write(source)
        original = services.start_ray_process

        def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
            # Ray 2.60 gives its agents all four ports but the raylet only three: the raylet has a
            # --dashboard_agent_listen_port flag that services.start_raylet never passes, so it would still wait
            # 15 s for that port's file.  Pass it, only to the raylet, only while this node starts.
            if process_type == ray_constants.PROCESS_TYPE_RAYLET:
                command = [*command, f"--dashboard_agent_listen_port={agent_listen}"]
            # Every process Ray starts (and the raylet's children: agents, workers) skips rfc3987_syntax's
            # 3 s-of-CPU import (LIGHT_IMPORT_STUBS): the largest single cost of a start on busy cores.
            path = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
            kwargs["env_updates"] = {**(kwargs.get("env_updates") or {}), "PYTHONPATH": path}
            info = original(command, process_type, *args, **kwargs)
            self.roots[info.process.pid] = process_type  # watched from this moment, not once Node() returns
            self._popen[info.process.pid] = info.process
            self.log_dirs.update(a.split("=", 1)[1] for a in command if a.startswith(("--log_dir=", "--log-dir=")))
            return info

        services.start_ray_process = start_ray_process
        try:
            self.node = Node(params, head=True, shutdown_at_exit=False, spawn_reaper=True)
        finally:
            services.start_ray_process = original
        return self.node

    def dead(self) -> list[tuple[int, str]]:
        """The processes Ray started for this node (PID, kind) that have exited."""
        roots = list(self.roots.items())  # one snapshot: the starting thread may add to it meanwhile
        alive = set(living(pid for pid, _ in roots))
        return [(pid, kind) for pid, kind in roots if pid not in alive]

    def why(self, kind: str) -> tuple[str | None, bool]:
        """The log line that says why ``kind`` stopped, and whether a taken port was the cause.

        A taken port, anywhere in the node's logs, is the answer (the agents log it, and the raylet then
        only says it fate-shares with them); else the last line of ``kind``'s own logs that names a failure.
        """
        logs = sorted(os.path.join(d, name) for d in set(self.log_dirs) if os.path.isdir(d) for name in os.listdir(d)
                      if os.path.isfile(os.path.join(d, name)))
        own_line = None
        for path in logs:
            lines = _read_lines(path)
            taken = next((line for line in lines if PORT_TAKEN.search(line)), None)
            if taken:
                return f"{os.path.basename(path)}: {taken}", True
            if os.path.basename(path).startswith(kind):
                own_line = next((f"{os.path.basename(path)}: {line}" for line in reversed(lines) if WHY.search(line)),
                                own_line)
        return own_line, False

    def exit_status(self, pid: int) -> str:
        """How the root ``pid`` ended, in words: "killed by SIGKILL", "exit status 1", or "exited" if unknown."""
        code = None
        if pid in self._popen:
            # Seen gone a moment ago, but perhaps not yet reaped: wait for it briefly.
            with contextlib.suppress(Exception):
                code = self._popen[pid].wait(timeout=1.0)
        return "exited" if code is None else exit_status(code)

    def stop(self) -> None:
        """Ask Ray's node to end its processes (it waits for them); the caller then stops the rest by PID."""
        node, self.node = self.node, None
        if node is not None:
            node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)

    def remove_site(self) -> None:
        if self.site is not None:
            shutil.rmtree(self.site, ignore_errors=True)
            self.site = None


def _read_lines(path: str, tail_bytes: int = 200_000) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(os.path.getsize(path) - tail_bytes, 0))
            return [line.strip() for line in f.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return []


def run_watched(step: str, work: Callable[[], T], node: LocalRayNode, deadline: float, *,
                on_this_thread: bool = False) -> T:
    """Run ``work()`` and return its result, unless a process of ``node`` dies first or ``deadline`` passes.

    ``work`` runs on a helper thread (Ray's calls have no deadline of their own), checked every 0.2 s.  On a
    death, :class:`RayStartError` names the process and quotes its log line; at the deadline, it names
    ``step``.  Either way the helper thread may still be waiting inside Ray: the caller stops the node by PID,
    which ends that wait.  ``on_this_thread=True`` runs ``work`` on the caller's thread and checks once it
    returns: for work that starts processes, because Linux ends a child that asked to share its parent's fate
    (``PR_SET_PDEATHSIG``, which Ray's node uses) when the *thread* that started it exits.

    >>> node = LocalRayNode(num_cpus=1)                       # nothing started: nothing to die
    >>> run_watched("adding", lambda: 1 + 1, node, time.monotonic() + 5)
    2
    >>> run_watched("sleeping", lambda: time.sleep(5), node, time.monotonic() + 0.3)
    Traceback (most recent call last):
    ...
    infergraph_lite.frameworks.ray.node.RayStartError: Ray's start did not finish sleeping within the time it was given
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread below
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"ray-start-{step}", daemon=True)
    if on_this_thread:
        run()
    else:
        worker.start()
    while True:
        worker.join(timeout=POLL_S) if not on_this_thread else None
        dead = node.dead()
        if dead:  # checked first: a step that fails *because* a process died is reported as that death
            pid, kind = dead[0]
            status = node.exit_status(pid)
            line, taken = node.why(kind)
            if "killed by" in status and not taken:
                line = None  # ended from outside: its own last words are about something else
            because = f": {line}" if line else "" if "killed by" in status else " (its logs say nothing about why)"
            raise RayStartError(f"Ray's {kind} (pid {pid}) ended ({status}) while {step}{because}",
                                process=kind, log_line=line, port_taken=taken)
        if on_this_thread or not worker.is_alive():
            if "error" in outcome:
                raise outcome["error"]
            if time.monotonic() > deadline:
                break
            return outcome["value"]
        if time.monotonic() > deadline:
            break
    raise RayStartError(f"Ray's start did not finish {step} within the time it was given")
