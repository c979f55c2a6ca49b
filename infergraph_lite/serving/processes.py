"""Processes a server started, and the sockets they listen on: loopback checks and stopping by PID.

Every server the notebooks and tests start (Triton, Ray, Dask, our own) must listen on 127.0.0.1 only
and be stopped by its own process IDs.  These helpers find a server's process tree, list every
listening socket of those processes, say whether an address is loopback, and stop what is left.
Used by :mod:`infergraph_lite.ray_serve` and :mod:`infergraph_lite.dask_graph` (notebook 07).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import psutil

__all__ = ["Listener", "is_loopback", "listening_sockets", "process_tree", "stop_processes"]


class Listener(NamedTuple):
    """One listening TCP socket: which process holds it, and where it listens."""

    pid: int
    process: str
    ip: str
    port: int


def is_loopback(ip: str) -> bool:
    """Whether ``ip`` only accepts connections from this machine (IPv4 127/8, ``::1``, or IPv4-mapped 127/8).

    >>> is_loopback("127.0.0.1"), is_loopback("::ffff:127.0.0.1"), is_loopback("::1")
    (True, True, True)
    >>> is_loopback("0.0.0.0"), is_loopback("::"), is_loopback("192.0.2.2")
    (False, False, False)
    """
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def process_tree(pid: int | None = None) -> list[int]:
    """The PIDs of every living descendant of ``pid`` (default: this process), children first.

    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> child.pid in process_tree()
    True
    >>> child.kill(); child.wait()
    -9
    """
    root = psutil.Process(os.getpid() if pid is None else pid)
    return [p.pid for p in root.children(recursive=True)]


def listening_sockets(pids: Iterable[int]) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) held by the processes ``pids``; gone processes are skipped.

    >>> import socket
    >>> s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    >>> port = s.getsockname()[1]
    >>> [(l.ip, l.port == port) for l in listening_sockets([os.getpid()]) if l.port == port]
    [('127.0.0.1', True)]
    >>> s.close()
    """
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            name = process.name()
            connections = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                found.append(Listener(pid, name, c.laddr.ip, c.laddr.port))
    return sorted(found, key=lambda x: (x.pid, x.port))


def stop_processes(pids: Sequence[int], timeout: float = 10.0) -> list[int]:
    """Wait up to ``timeout`` s for the processes ``pids`` to exit; SIGTERM, then SIGKILL, whatever is left.

    Every signal goes to a process by its own PID (never by name).  Returns the PIDs that had to be
    stopped this way (an empty list: they all exited by themselves).

    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> stopped = stop_processes([child.pid], timeout=0.1)   # it sleeps on: SIGTERM after 0.1 s
    >>> stopped == [child.pid], psutil.pid_exists(child.pid)
    (True, False)
    """
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=3.0)
    for p in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(still, timeout=3.0)
    return [p.pid for p in alive]


# --- loopback for Serve replicas --------------------------------------------------------------------------
