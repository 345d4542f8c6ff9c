"""A CPU quota for a node's process tree: a cgroup v1 ``cpu`` child group (tests and
``scripts/bench_split.py``: one node held to a fraction of a core, docs/placement-speed.md).

``cpu_quota(name, percent)`` makes ``/sys/fs/cgroup/cpu/<name>`` with ``cpu.cfs_quota_us =
percent × 1000`` per ``cpu.cfs_period_us = 100000``; a process moved in (``CpuGroup.add``)
takes its children along, as they are born after. On exit, even on failure, every process
still in it is moved back to the root group and the group removed. Needs root and the v1 cpu
controller (``available``): callers skip otherwise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def available() -> bool:
    """Whether this process can make cpu cgroups here (v1 controller mounted, root)."""
    return (CPU_ROOT / "cpu.cfs_quota_us").exists() and os.access(CPU_ROOT, os.W_OK)


class CpuGroup:
    """One cpu cgroup (``path``) with a quota."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, pid: int) -> None:
        """Move ``pid`` (its threads; children it spawns later are born inside) and its live
        children into the group."""
        pids = [pid]
        try:
            pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in pids:
            try:
                (self.path / "cgroup.procs").write_text(str(p))
            except (ProcessLookupError, OSError):
                continue  # gone meanwhile

    def pids(self) -> list[int]:
        """The processes in the group now."""
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []


@contextmanager
def cpu_quota(name: str, percent: int) -> Iterator[CpuGroup]:
    """A cgroup ``name`` holding its processes to ``percent`` % of one core (module docstring).
    Raises ``ValueError`` for a percent outside 1..100, ``OSError`` when it cannot be made."""
    if not 1 <= percent <= 100:
        raise ValueError(f"cpu quota {percent} % outside 1..100")
    path = CPU_ROOT / name
    path.mkdir(exist_ok=True)
    try:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(percent * PERIOD_US // 100))
        yield CpuGroup(path)
    finally:
        remove(path)


def remove(path: Path, timeout: float = 10.0) -> None:
    """Move every process of group ``path`` back to the root group and remove it (bounded by
    ``timeout`` s; processes forking meanwhile are moved again)."""
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        for pid in CpuGroup(path).pids():
            try:
                (CPU_ROOT / "cgroup.procs").write_text(str(pid))
            except OSError:
                continue
        try:
            path.rmdir()
        except OSError:
            time.sleep(0.1)
