"""Processes a server started, and the sockets they listen on: loopback checks and stopping by PID.

Every server the notebooks and tests start (Triton, Ray, Dask, our own) must listen on 127.0.0.1 only
and be stopped by its own process IDs.  These helpers find a server's process tree, list every
listening socket of those processes, say whether an address is loopback, and stop what is left.
Used by the Triton, Ray Serve and Dask adapters (notebook 07).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import psutil

__all__ = ["Listener", "ephemeral_port_range", "free_ports", "is_loopback", "listening_sockets", "living",
           "owned_processes", "process_tree", "stop_processes", "within"]


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


def living(pids: Iterable[int]) -> list[int]:
    """The ``pids`` that are still running (not gone, not zombies), in order; a process that exits while it is
    being looked at is simply left out.

    >>> import os
    >>> living([os.getpid(), 2**22 + 12345]) == [os.getpid()]
    True
    """
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


def owned_processes(roots: Iterable[int]) -> list[int]:
    """The living processes among ``roots`` and every living descendant of each: what a server owns.

    A server records the root PIDs it spawned itself (or that its framework records for it) and finds the
    rest from those roots, never as "every child of this interpreter", so closing one server cannot touch
    another's processes.  Gone roots are skipped; the list is in order of discovery, without repeats.

    >>> import subprocess, sys
    >>> mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> owned_processes([mine.pid]) == [mine.pid]       # the other child of this process is not mine
    True
    >>> stop_processes([mine.pid, other.pid], timeout=0.1) == sorted([mine.pid, other.pid])
    True
    """
    found: dict[int, None] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            if root.status() == psutil.STATUS_ZOMBIE:
                continue
            found.setdefault(pid)
            for child in root.children(recursive=True):
                found.setdefault(child.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return list(found)


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's ephemeral port range ``(low, high)``, inclusive: where a bind to port 0, and every outgoing
    connection, takes its port.  Read from Linux's ``ip_local_port_range`` or macOS's ``sysctl``; else IANA's.

    >>> low, high = ephemeral_port_range()
    >>> 1024 < low < high <= 65535
    True
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
        return low, high
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            out = subprocess.run(["sysctl", "-n", "net.inet.ip.portrange.first", "net.inet.ip.portrange.last"],
                                 capture_output=True, text=True, timeout=5, check=True).stdout.split()
            return int(out[0]), int(out[1])
    return 49152, 65535


def free_ports(count: int, host: str = "127.0.0.1", *, below_ephemeral: bool = False) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago.

    Another process can take one before the caller binds it (a race no pick can close): a server that
    starts on picked ports must retry on a taken one (see :class:`~infergraph_lite.frameworks.triton.TritonServer`).
    By default the kernel picks them (a bind to port 0), so they come from its ephemeral range -- the range every
    outgoing connection and every other port-0 listener on the machine draws from too, so the server's own
    processes, starting at the same moment, can take them.  ``below_ephemeral=True`` picks them at random
    between 20000 and the ephemeral range's start instead (each checked free by a bind), where only a process
    that names that very port can take it.

    >>> ports = free_ports(3)
    >>> len(set(ports)), all(1024 <= p < 65536 for p in ports)
    (3, True)
    >>> low, _ = ephemeral_port_range()
    >>> all(20000 <= p < low for p in free_ports(4, below_ephemeral=True))
    True
    """
    sockets: list[socket.socket] = []
    try:
        if not below_ephemeral:
            for _ in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((host, 0))
                sockets.append(s)
        else:
            low = ephemeral_port_range()[0]
            # 20000 and up: clear of the ports servers are commonly configured on and of Ray's default worker
            # port range (10002-19999, used by `ray start`).
            candidates = list(range(20000, low))
            random.shuffle(candidates)
            for port in candidates:
                if len(sockets) == count:
                    break
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                try:
                    s.bind((host, port))
                except OSError:
                    s.close()
                    continue
                sockets.append(s)
            if len(sockets) < count:
                raise OSError(f"found only {len(sockets)} of {count} free ports between 20000 and {low} on {host}")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def stop_processes(pids: Sequence[int], timeout: float = 10.0, *, signal_wait: float = 3.0) -> list[int]:
    """Wait up to ``timeout`` s for the processes ``pids`` to exit; then SIGTERM, then SIGKILL, whatever is left.

    After each signal it waits up to ``signal_wait`` s, so it returns within ``timeout + 2 * signal_wait`` s
    (:func:`within` splits one overall budget into the two).  Every signal goes to a process by its own PID
    (never by name).  Returns the PIDs that had to be signalled (an empty list: they all exited by themselves).

    >>> import subprocess, sys
    >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    >>> stopped = stop_processes([child.pid], timeout=0.1)   # it sleeps on: SIGTERM after 0.1 s
    >>> stopped == [child.pid], psutil.pid_exists(child.pid)
    (True, False)
    """
    procs = []
    for pid in dict.fromkeys(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=max(timeout, 0.0))
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=signal_wait)
    for p in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(still, timeout=signal_wait)
    return sorted(p.pid for p in alive)


def within(budget: float) -> dict[str, float]:
    """``stop_processes`` arguments that spend at most ``budget`` seconds in all (a quarter per signal, at most 3 s).

    >>> within(20.0), within(2.0)
    ({'timeout': 14.0, 'signal_wait': 3.0}, {'timeout': 1.0, 'signal_wait': 0.5})
    """
    budget = max(budget, 0.0)
    wait = min(3.0, budget / 4)
    return {"timeout": budget - 2 * wait, "signal_wait": wait}

