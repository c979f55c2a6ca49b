"""Listening TCP sockets of a process tree, read straight from /proc (Linux), for the server tests.

Independent of the package's own helpers on purpose: a test of "every listener is on 127.0.0.1"
should not trust the code it checks.  Walk the tree from a PID through /proc/*/stat parent links,
collect each process's socket inodes from /proc/PID/fd, and match them against the LISTEN rows of
/proc/net/tcp and /proc/net/tcp6.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def descendants(root: int) -> list[int]:
    """Every living descendant of ``root``, from the parent links in /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _address(hex_ip: str) -> str:
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6 stores the address as four little-endian 32-bit words.
    words = struct.unpack("<4I", raw)
    return str(ipaddress.IPv6Address(struct.pack(">4I", *words)))


def _listening_inodes() -> dict[str, tuple[str, int]]:
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN:
                ip, port = fields[1].split(":")
                inodes[fields[9]] = (_address(ip), int(port, 16))
    return inodes


def listening(pids: list[int]) -> list[tuple[int, str, str, int]]:
    """``(pid, command, ip, port)`` for every listening TCP socket held by one of ``pids``."""
    table = _listening_inodes()
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = target[8:-1]
                if inode in table:
                    found.append((pid, command, *table[inode]))
    return sorted(set(found))


def not_loopback(entries: list[tuple[int, str, str, int]]) -> list[tuple[int, str, str, int]]:
    """The entries whose address is not loopback (IPv4 127/8, ::1, or IPv4-mapped 127/8)."""
    bad = []
    for entry in entries:
        address = ipaddress.ip_address(entry[2])
        mapped = getattr(address, "ipv4_mapped", None)
        if not (address.is_loopback or (mapped is not None and mapped.is_loopback)):
            bad.append(entry)
    return bad
