"""Tasks whose request is gone from their API node are cancelled (what a long-lived
cluster needs; ``exo_p2p.node.orphans``). Pure rule and the sweeper with a fake master; the case of
an API node that dies is tested on real nodes in tests/test_faults.py."""

from __future__ import annotations

import msgspec
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.node.orphans import CANCELS_PER_SWEEP, ORPHAN_GRACE, OrphanSweeper, orphans
from exo_p2p.types import CommandResult, State, TaskRecord
from tests.support.rules.plan_state import gen_task

ME = "node-a"


def _record(tid: str, api: str = ME, status: str = "running", cancel: bool = False) -> TaskRecord:
    task = gen_task(tid, 1)
    return TaskRecord(msgspec.structs.replace(task, api_node_id=api), status, cancel_requested=cancel)  # type: ignore[arg-type]


def test_a_task_without_a_request_here_is_due_after_the_grace_and_again_after_another():
    tasks = {"t1": _record("t1"), "t2": _record("t2"), "other": _record("other", api="node-b"),
             "asked": _record("asked", cancel=True), "done": _record("done", status="complete")}
    due, since = orphans(tasks, ME, {"t2"}, {}, now=100.0)
    assert due == [] and since == {"t1": 100.0}  # only t1 is an orphan: t2 has its request open
    due, since = orphans(tasks, ME, {"t2"}, since, now=100.0 + ORPHAN_GRACE - 0.01)
    assert due == []
    due, since = orphans(tasks, ME, {"t2"}, since, now=100.0 + ORPHAN_GRACE)
    assert due == ["t1"] and since == {"t1": 100.0 + ORPHAN_GRACE}  # the next try only after another grace
    due, since = orphans(tasks, ME, {"t1", "t2"}, since, now=200.0)  # its request opened again (a move)
    assert due == [] and since == {}


@given(st.dictionaries(st.sampled_from([f"t{k}" for k in range(40)]),
                       st.tuples(st.sampled_from([ME, "node-b"]), st.sampled_from(["pending", "running", "complete"]), st.booleans())),
       st.sets(st.sampled_from([f"t{k}" for k in range(40)])), st.floats(0, 30))
def test_only_this_nodes_unfinished_uncancelled_tasks_without_a_request_are_ever_cancelled(spec, open_, later):
    tasks = {tid: _record(tid, api, status, cancel) for tid, (api, status, cancel) in spec.items()}
    eligible = {tid for tid, (api, status, cancel) in spec.items() if api == ME and status != "complete" and not cancel and tid not in open_}
    due, since = orphans(tasks, ME, open_, {}, now=0.0)
    assert due == [] and set(since) == eligible
    due, _ = orphans(tasks, ME, open_, since, now=later)
    assert set(due) <= eligible and len(due) <= CANCELS_PER_SWEEP
    assert len(due) == (min(len(eligible), CANCELS_PER_SWEEP) if later >= ORPHAN_GRACE else 0)


def test_the_sweeper_asks_the_master_once_per_grace_and_survives_a_failed_cancel():
    state = State(tasks={"t1": _record("t1"), "t2": _record("t2")})
    asked: list[str] = []

    async def command(cmd, timeout):  # type: ignore[no-untyped-def]
        asked.append(cmd.task_id)
        if cmd.task_id == "t1":
            raise OSError("no master")
        return CommandResult(cmd.command_id)

    async def main() -> None:
        sweeper = OrphanSweeper(ME, lambda: state, lambda: frozenset(), command)
        assert await sweeper.sweep() == []
        await trio.sleep(ORPHAN_GRACE)
        assert await sweeper.sweep() == ["t1", "t2"]
        await trio.sleep(1.0)
        assert await sweeper.sweep() == []
        await trio.sleep(ORPHAN_GRACE)
        assert await sweeper.sweep() == ["t1", "t2"]  # not answered / not applied yet: asked again
        assert sweeper.cancelled == 4

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert asked == ["t1", "t2", "t1", "t2"]
