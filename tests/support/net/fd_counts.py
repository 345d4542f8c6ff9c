"""Counting a process's file descriptors and listening ports, with the flood tests' bounds."""

from __future__ import annotations

import os
from pathlib import Path


SLACK = 4.0
"""Seconds beyond a bound the node may take to close a connection on a loaded machine."""
HEALTH_BOUND = 1.0
"""Seconds within which ``/health`` answers during the flood (on a quiet machine every probe
does: measured max 0.2-0.8 s)."""
IDLE_FDS_SLACK = 20
"""Descriptors beyond the idle count the node may hold after the flood (log rotation, a
runner's pipes, a peer's stream)."""


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on (its socket inodes in ``/proc/net/tcp``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports
