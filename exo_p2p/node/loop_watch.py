"""How late the node's trio loop runs, and which task steps held it.

Every node task (heartbeats, log sync, the API) shares one thread: a task step that runs long
without a checkpoint delays them all, and a heartbeat sent late makes the master time the
node out (docs/cluster.md#how-the-cluster-keeps-going). ``LoopWatch`` measures both halves:

- ``run()`` sleeps ``interval`` (50 ms) again and again and records how late it wakes (the
  loop's *lag*: what a heartbeat due then waited too);
- as a ``trio.abc.Instrument`` it times every task step and keeps those longer than
  ``slow_step`` (100 ms), with the thread's CPU time in the step: CPU time near the wall time
  is work done on the loop (move it to a thread); wall time far above it is the process
  waiting for a core (a loaded machine), which no code change on the loop removes.

A lag above ``warn`` (0.5 s) is logged once per ``warn`` period with the slow steps since the
last report and what the process's other threads are running (``busy_threads``): a thread
holding the GIL (an import, a C call that keeps it) stalls the loop thread without any task
step being slow in CPU. Cheap: two clock reads per task step.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque

import structlog
import trio

from exo_p2p.cluster.liveness import Stalls

log = structlog.get_logger(__name__)

SLOW_STEPS_KEPT = 32
"""Slow task steps kept for the next report (the oldest are dropped)."""


_IDLE = ("threading.py", "queue.py", "selectors.py", "_thread_cache.py", "socket.py")
"""Files whose frames mean a thread waits (a lock, a queue, a select): not shown."""


def busy_threads(limit: int = 6) -> list[str]:
    """Other threads' innermost frames (``thread: file:line function``), waiting ones left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        if not where.startswith(_IDLE):
            outer = frame
            while outer.f_back is not None and "site-packages" in outer.f_code.co_filename:
                outer = outer.f_back  # the project's frame that called into the library
            out.append(f"{names.get(ident, ident)}: {where} <- {outer.f_code.co_filename.rsplit('/', 1)[-1]}:{outer.f_lineno}")
    return out[:limit]


class SlowStep(tuple):
    """``(task name, wall seconds, thread CPU seconds)`` of one task step."""

    __slots__ = ()


class LoopWatch(trio.abc.Instrument):
    """Loop lag (``worst_lag``, ``late``: wakes later than ``warn``) and slow task steps
    (``slow``, ``worst_step``) of the trio loop it is added to (module docstring). Seconds."""

    def __init__(self, *, interval: float = 0.05, slow_step: float = 0.1, warn: float = 0.5) -> None:
        self.interval, self.slow_step, self.warn = interval, slow_step, warn
        self.worst_lag = 0.0
        self.late = 0
        self.wakes = 0
        self.worst_step: SlowStep | None = None
        self.slow: deque[SlowStep] = deque(maxlen=SLOW_STEPS_KEPT)
        self.stalls = Stalls()
        """Wakes late by ``interval`` or more, as ``(start, end)`` of ``time.monotonic`` (the
        cluster's clock): not counted as a peer's silence (``cluster.liveness``)."""
        self._t0: float | None = None
        self._c0 = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._t0 = time.perf_counter()
        self._c0 = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._t0 is None:  # the step that added this instrument: not timed
            return
        wall, self._t0 = time.perf_counter() - self._t0, None
        if wall >= self.slow_step:
            step = SlowStep((task.name, round(wall, 3), round(time.thread_time() - self._c0, 3)))
            self.slow.append(step)
            if self.worst_step is None or wall > self.worst_step[1]:
                self.worst_step = step

    async def run(self) -> None:
        """Measure the lag until cancelled (adds this instrument to the running loop)."""
        trio.lowlevel.add_instrument(self)
        try:
            last_report = -self.warn
            while True:
                due = time.perf_counter() + self.interval
                self.stalls.due = time.monotonic() + self.interval
                await trio.sleep(self.interval)
                lag = max(0.0, time.perf_counter() - due)
                self.wakes += 1
                self.worst_lag = max(self.worst_lag, lag)
                if lag >= self.interval:
                    end = time.monotonic()
                    self.stalls.add(end - lag, end)
                if lag >= self.warn:
                    self.late += 1
                    now = time.perf_counter()
                    if now - last_report >= self.warn:
                        last_report = now
                        log.warning("event loop lagged", lag_s=round(lag, 3), worst_lag_s=round(self.worst_lag, 3),
                                    slow_steps=[list(s) for s in self.slow], busy_threads=busy_threads())
                        self.slow.clear()
        finally:
            trio.lowlevel.remove_instrument(self)

    def summary(self) -> dict[str, object]:
        """What ``GET /state`` shows: worst lag and step, late wakes, wakes (seconds, counts)."""
        return {"worst_lag_s": round(self.worst_lag, 3), "late_wakes": self.late, "wakes": self.wakes,
                "worst_step": list(self.worst_step) if self.worst_step else None}
