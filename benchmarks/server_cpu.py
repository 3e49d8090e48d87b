"""The CPU a local PostgreSQL server's processes used, from /proc.

Only for a server on this machine (the embedded one, or a local service):
for a remote one, or where /proc cannot be read, :func:`server_pids` gives
an empty list and the figures are left out.
"""

from __future__ import annotations

import os


def _stat_fields(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def server_pids(backend_pid: int) -> list[int]:
    """The postmaster of ``backend_pid`` and all its children (this server only);
    empty when that pid is not a PostgreSQL process here."""
    try:
        with open(f"/proc/{backend_pid}/comm") as f:
            if f.read().strip() != "postgres":
                return []
        postmaster = int(_stat_fields(backend_pid)[1])
    except OSError:
        return []
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(_stat_fields(entry)[1]) == postmaster:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of ``pids``; a process that exited counts nothing."""
    ticks = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
