"""A runner's compute threads run below the node (``worker.runner.priority``), its heartbeat
thread does not: per-thread nice and scheduling policy on Linux, inherited by threads the
lowered thread creates."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from worker.runner.priority import RUNNER_NICE, lower_this_thread, thread_priority

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")


def _in_thread(fn):  # type: ignore[no-untyped-def]
    out: dict = {}

    def body() -> None:
        out["result"] = fn()
        out["tid"] = threading.get_native_id()

    t = threading.Thread(target=body)
    t.start()
    t.join(10)
    return out


def test_lowering_a_thread_leaves_the_others_and_is_inherited():
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen: dict = {}

    def compute() -> list[str]:
        done = lower_this_thread()
        child = _in_thread(lambda: thread_priority(threading.get_native_id()))  # a BLAS pool thread, say
        seen["child"] = child["result"]
        seen["self"] = thread_priority(threading.get_native_id())
        return done

    done = _in_thread(compute)["result"]
    assert done == [f"nice+{RUNNER_NICE}", "batch"]
    assert seen["self"] == (min(19, base + RUNNER_NICE), os.SCHED_BATCH)
    assert seen["child"] == seen["self"]  # created by the lowered thread: inherits
    # the calling (heartbeat-like) thread is untouched
    assert thread_priority(threading.get_native_id()) == (base, os.sched_getscheduler(0))
    assert os.sched_getscheduler(0) != os.SCHED_BATCH
