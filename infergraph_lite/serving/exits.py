"""Why a child process ended, in one line: its name and PID, its exit status or signal, its log's last words.

Every server the package starts (llama.cpp, Triton, a GraphServer's stage workers) reports a child that dies,
during start-up or during a request, with an error that names the process and quotes the line of its log that
says why; these helpers word that line the same way everywhere (notebooks 06-08).  Kept apart from
:mod:`~infergraph_lite.serving.processes`, which finds and stops processes: this module only reads what they
left behind.
"""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Callable
from typing import Protocol

__all__ = ["ExitReporting", "describe_exit", "exit_status", "last_log_line", "tail_of_file", "weak_exit_reason"]

LINE_LIMIT = 300  # characters of a quoted log line: enough for an error message, not a whole tensor dump


def exit_status(returncode: int) -> str:
    """A process's exit in words: its status, or the signal that ended it.

    >>> exit_status(3), exit_status(-9), exit_status(-15)
    ('exit status 3', 'killed by SIGKILL', 'killed by SIGTERM')
    """
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:  # a number this platform has no name for
        return f"killed by signal {-returncode}"


def last_log_line(text: str) -> str:
    """The last line of a log that says something (blank lines and table rules skipped), cut to 300 characters.

    >>> last_log_line("loading\\nValueError: weights are corrupt\\n\\n+-----+\\n")
    'ValueError: weights are corrupt'
    >>> last_log_line("")
    ''
    """
    for line in reversed(text.splitlines()):
        line = line.strip()
        if any(c.isalnum() for c in line):  # a table's rule (+----+) or a lone bracket says nothing
            return line if len(line) <= LINE_LIMIT else line[:LINE_LIMIT] + "..."
    return ""


def tail_of_file(fd: int, size: int = 8192) -> str:
    """The last ``size`` bytes of the open file ``fd``, as text, read without moving its offset.

    ``os.pread`` leaves the file position alone, so a child still writing through its own copy of the
    descriptor (which shares that position) is not disturbed.

    >>> import tempfile
    >>> with tempfile.TemporaryFile() as f:
    ...     _ = f.write(b"one\\ntwo\\n"); f.flush()
    ...     tail_of_file(f.fileno(), size=4)
    'two\\n'
    """
    end = os.fstat(fd).st_size
    return os.pread(fd, min(size, end), max(end - size, 0)).decode(errors="replace")


def describe_exit(what: str, pid: int, returncode: int, log: str, *, stopped: bool = False) -> str:
    """One sentence on a process that ended: what it was, its PID, how it ended, and its log's last line.

    ``stopped``: it was told to stop (its owner's ``close()``), so it did not die.

    >>> describe_exit("the llama.cpp server", 12, -9, "slot 0: decoding\\n")
    "the llama.cpp server (pid 12) died (killed by SIGKILL); its log ends: 'slot 0: decoding'"
    >>> describe_exit("tritonserver", 7, 0, "", stopped=True)
    'tritonserver (pid 7) was stopped (exit status 0)'
    """
    line = last_log_line(log)
    said = f"; its log ends: {line!r}" if line else ""
    return f"{what} (pid {pid}) {'was stopped' if stopped else 'died'} ({exit_status(returncode)}){said}"


class ExitReporting(Protocol):
    """A server that can say why its process ended (``""``: it is still running), waiting up to ``wait`` seconds."""

    def exit_reason(self, wait: float) -> str: ...


def weak_exit_reason(server: ExitReporting) -> Callable[[float], str]:
    """``server.exit_reason`` through a weak reference, for the clients a server hands out.

    A client must not keep its server from being collected (and so stopped by its finaliser); once the server is
    gone, the function says nothing.

    >>> class Server:
    ...     def exit_reason(self, wait: float) -> str:
    ...         return "died (killed by SIGKILL)"
    >>> server = Server(); reason = weak_exit_reason(server)
    >>> reason(0.0)
    'died (killed by SIGKILL)'
    >>> del server; reason(0.0)
    ''
    """
    ref = weakref.ref(server)

    def exit_reason(wait: float) -> str:
        alive = ref()
        return "" if alive is None else alive.exit_reason(wait)

    return exit_reason
