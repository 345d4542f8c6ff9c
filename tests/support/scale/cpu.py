"""CPU seconds per cluster member inside one trio run: a trio ``Instrument`` that times every
task step and charges it to the member whose task tree the task belongs to (``"fabric"`` for
the in-memory network's deliveries, ``"other"`` for the harness itself).

This separates our code's cost from the harness's: N members share one process and its
cores, so wall time is the sum of every member's work; a member's own CPU is what one
machine of a real cluster would spend (docs/cluster.md, "Many machines").
"""

from __future__ import annotations

import time
from collections import defaultdict

import trio


class CpuMeter(trio.abc.Instrument):
    """``roots``: task → owner name (a member's root task). ``seconds[owner]`` accumulates
    CPU time of each step (``time.thread_time``: the trio thread's own CPU, not the other processes' turns on a shared machine)."""

    def __init__(self) -> None:
        self.roots: dict[trio.lowlevel.Task, str] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self._owner: dict[int, str] = {}
        self._started = 0.0

    def own(self, task: trio.lowlevel.Task, owner: str) -> None:
        """Charge ``task`` and every task it starts to ``owner``."""
        self.roots[task] = owner
        self._owner.clear()

    def owner_of(self, task: trio.lowlevel.Task) -> str:
        found = self._owner.get(id(task))
        if found is not None:
            return found
        owner, walk = "other", task
        for _ in range(64):  # a task tree is shallow; bounded anyway
            if walk in self.roots:
                owner = self.roots[walk]
                break
            if walk.name.endswith("_deliver"):
                owner = "fabric"
                break
            nursery = walk.parent_nursery
            if nursery is None or nursery.parent_task is None:
                break
            walk = nursery.parent_task
        self._owner[id(task)] = owner
        return owner

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.seconds[self.owner_of(task)] += time.thread_time() - self._started

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self._owner.pop(id(task), None)

    def reset(self) -> None:
        self.seconds.clear()
