"""A runner's record of what was sent to it holds only what State still lists (what a
long-lived cluster needs). Before: every task id and ``cancel:<id>`` a runner ever received
stayed in ``RunnerSupervisor.sent``, which the worker copies on every plan pass. No runner
process is started."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.types import RunnerReady, RunnerRunning
from tests.support.rules.plan_state import BOOT, NODE, gen_task, instance, state_with
from worker.plan import LIFECYCLE_KEYS, LocalRunner, plan
from worker.supervisor import RunnerSupervisor
from worker.worker import Worker


def _supervisor(inst) -> RunnerSupervisor:  # type: ignore[no-untyped-def]
    """A supervisor whose process is never started (its trio primitives need a run)."""
    async def make() -> RunnerSupervisor:
        return RunnerSupervisor(NODE, inst, inst.shards[0], Path("/nonexistent"), lambda e: None, lambda c: None)

    return trio.run(make)


def test_the_worker_forgets_the_keys_of_tasks_state_no_longer_lists() -> None:
    inst = instance()
    live = [gen_task("live-1", 1001), gen_task("live-2", 1002)]
    state = state_with(inst, {"i1-r0": RunnerRunning()}, tasks=live)
    worker = Worker(NODE, BOOT, lambda: state, lambda e: None, lambda c: None, lambda m: None)
    sup = _supervisor(inst)
    worker.supervisors["i1-r0"] = sup
    sup.sent |= {"connect", "load", "warmup"} | {f"done-{k}" for k in range(1000)} | {f"cancel:done-{k}" for k in range(0, 1000, 7)}
    sup.sent |= {"live-1", "live-2", "cancel:live-2"}
    worker._prune()
    assert sup.sent == {"connect", "load", "warmup", "live-1", "live-2", "cancel:live-2"}
    assert worker.local_runners()["i1-r0"].sent == frozenset(sup.sent)


keys = st.sampled_from(sorted(LIFECYCLE_KEYS) + [f"t{k}" for k in range(6)] + [f"cancel:t{k}" for k in range(6)])


@given(sent=st.frozensets(keys), listed=st.frozensets(st.integers(0, 5)), cancelled=st.frozensets(st.integers(0, 5)),
       running=st.booleans())
def test_forgetting_ended_tasks_changes_no_plan(sent, listed, cancelled, running) -> None:
    """For any State and any record of sent keys, the plan is the same after the keys of
    tasks State no longer lists were dropped: the planner reads a task's keys only while
    State holds the task."""
    inst = instance()
    status = RunnerRunning() if running else RunnerReady()
    state = state_with(inst, {"i1-r0": status}, tasks=[gen_task(f"t{k}", k) for k in sorted(listed)])
    state = msgspec.structs.replace(state, tasks={
        tid: msgspec.structs.replace(r, cancel_requested=int(tid[1:]) in cancelled) for tid, r in state.tasks.items()
    })
    sup = _supervisor(inst)
    sup.sent = set(sent)
    sup.forget_ended(state.tasks)
    assert sup.sent <= sent
    assert all(k in LIFECYCLE_KEYS or k.removeprefix("cancel:") in state.tasks for k in sup.sent)
    before = plan(NODE, BOOT, state, {"i1-r0": LocalRunner("i1-r0", "i1", status, sent)})
    after = plan(NODE, BOOT, state, {"i1-r0": LocalRunner("i1-r0", "i1", status, frozenset(sup.sent))})
    assert before == after
