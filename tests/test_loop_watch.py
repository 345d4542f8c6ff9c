"""``exo_p2p.node.loop_watch``: a task step that blocks the trio loop is seen as lag and named as
a slow step with its CPU time; a loop that only sleeps shows neither."""

from __future__ import annotations

import time

import pytest
import trio

from exo_p2p.node.loop_watch import LoopWatch

pytestmark = pytest.mark.unit


def _run(blocker) -> LoopWatch:  # type: ignore[no-untyped-def]
    watch = LoopWatch(interval=0.01, slow_step=0.1, warn=0.2)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await trio.sleep(0.05)
            await blocker()
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return watch


def test_a_blocking_step_shows_as_lag_and_as_a_slow_step_with_its_cpu_time():
    async def busy() -> None:
        # 0.3 s of CPU work without a checkpoint, counted in CPU time so a loaded machine that
        # holds the thread off a core makes the step longer, never less busy (10 s wall at most)
        cpu_end, wall_end = time.thread_time() + 0.3, time.perf_counter() + 10
        while time.thread_time() < cpu_end and time.perf_counter() < wall_end:
            pass

    watch = _run(busy)
    assert watch.worst_lag >= 0.25 and watch.late >= 1
    name, wall, cpu = watch.worst_step  # type: ignore[misc]
    assert "main" in name and wall >= cpu >= 0.25  # CPU work on the loop, told apart from waiting for a core


def test_a_loop_that_only_awaits_has_no_slow_step():
    async def idle() -> None:
        await trio.sleep(0.3)

    watch = _run(idle)
    assert watch.wakes >= 5
    # a loaded machine may hold the process off a core mid-step (wall time), never make it work
    assert all(cpu < 0.1 for _name, _wall, cpu in watch.slow), list(watch.slow)
