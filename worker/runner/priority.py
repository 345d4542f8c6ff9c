"""A runner's compute runs below the node (docs/architecture.md#rules, "Busy hosts").

On a CPU-only node inference saturates every core, and a busy node is normal. The node's
process (heartbeats, the election, the log) must keep its timing meanwhile, so a runner's
compute threads run at a lower priority than the node: ``nice`` +``RUNNER_NICE`` and, on
Linux, ``SCHED_BATCH`` (the scheduler treats them as CPU-bound: no wake-up preemption of
interactive threads, longer slices). Not ``SCHED_IDLE``: under other CPU load (burners at
nice 0) it would starve the runner altogether.

Linux's nice and scheduling policy are per thread, and a thread inherits them from the thread
that creates it. So the runner lowers only its compute threads: the main thread (the engine
and the MLX/BLAS thread pools it creates) and the preload thread (whose imports create
OpenBLAS's pool), never its heartbeat or input threads — a runner whose heartbeat thread
starved would be killed as silent (``worker.liveness``). Unprivileged: lowering is always
allowed, never raising, so what is lowered stays lowered.
"""

from __future__ import annotations

import os
import sys
import threading

RUNNER_NICE = 10
"""Nice increment of a runner's compute threads: weight 110 against the node's 1024 (nice
0), so the node's loop gets a core within a scheduler slice however many compute threads run."""


def lower_this_thread(nice: int = RUNNER_NICE) -> list[str]:
    """Lower the calling thread: ``nice`` more, and ``SCHED_BATCH`` on Linux. Returns what
    was done (``["nice+10", "batch"]``); a step the OS refuses is left out, never raised (a
    runner at normal priority still works)."""
    done = []
    tid = threading_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + nice))
        done.append(f"nice+{nice}")
    except (OSError, AttributeError):
        pass
    if sys.platform.startswith("linux") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # 0: the calling thread
            done.append("batch")
        except OSError:
            pass
    return done


def threading_native_id() -> int:
    """The calling thread's kernel id (``PRIO_PROCESS`` with it names one thread on Linux;
    elsewhere 0, the process)."""
    return threading.get_native_id() if sys.platform.startswith("linux") else 0


def thread_priority(tid: int) -> tuple[int, int]:
    """``(nice, policy)`` of thread ``tid`` of this process (Linux), for tests and reports."""
    return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)
