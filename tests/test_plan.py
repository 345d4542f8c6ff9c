"""The worker's pure planner (docs/architecture.md#rules "Plan is idempotent")."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.types import CreateRunner, LoadModel, RunnerIdle, RunnerLoaded, RunnerReady, RunnerRecord, RunnerRunning, RunnerShutdown, Shutdown, StartWarmup, State, TaskRecord, CancelTask
from worker.plan import ForwardTask, LocalRunner, plan
from tests.support.rules.plan_state import BOOT, NODE, gen_task, instance, state_with


def test_create_then_load_then_warmup_then_tasks_in_master_order():
    inst = instance()
    s = state_with(inst)
    assert isinstance(plan(NODE, BOOT, s, {}), CreateRunner)
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerIdle())}
    assert plan(NODE, BOOT, s, local) == LoadModel(runner_id="i1-r0")
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerIdle(), frozenset({"load"}))}
    assert plan(NODE, BOOT, s, local) is None
    s = state_with(inst, {"i1-r0": RunnerLoaded()})
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerLoaded(), frozenset({"load"}))}
    assert plan(NODE, BOOT, s, local) == StartWarmup(runner_id="i1-r0")
    t_late, t_early = gen_task("zzz", 10), gen_task("aaa", 20)
    s = state_with(inst, {"i1-r0": RunnerReady()}, tasks=(t_late, t_early))
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset({"load", "warmup"}))}
    assert plan(NODE, BOOT, s, local) == ForwardTask("i1-r0", t_late)  # created first, not smallest id
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerRunning(), frozenset({"load", "warmup", "zzz"}))}
    assert plan(NODE, BOOT, s, local) == ForwardTask("i1-r0", t_early)  # a Running runner still receives tasks (they queue)


def test_never_resends_and_is_idempotent():
    inst = instance()
    t = gen_task("t1", 5)
    s = state_with(inst, {"i1-r0": RunnerReady()}, tasks=(t,))
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset({"load", "warmup"}))}
    first = plan(NODE, BOOT, s, local)
    assert first == plan(NODE, BOOT, s, local) == ForwardTask("i1-r0", t)
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerRunning(), frozenset({"load", "warmup", "t1"}))}
    assert plan(NODE, BOOT, s, local) is None


def test_cancel_is_sent_once_to_runners_that_have_the_task():
    inst = instance()
    t = gen_task("t1", 5)
    s = state_with(inst, {"i1-r0": RunnerRunning()}, tasks=(t,))
    s = msgspec.structs.replace(s, tasks={"t1": TaskRecord(t, "running", cancel_requested=True)})
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerRunning(), frozenset({"t1"}))}
    assert plan(NODE, BOOT, s, local) == CancelTask(runner_id="i1-r0", task_id="t1")
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerRunning(), frozenset({"t1", "cancel:t1"}))}
    assert plan(NODE, BOOT, s, local) is None
    # a task cancelled before it reached the runner is sent, then cancelled: the runner ends
    # it (as cancelled); nothing else would ever remove it from State
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset())}
    assert plan(NODE, BOOT, s, local) == ForwardTask("i1-r0", t)
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset({"t1"}))}
    assert plan(NODE, BOOT, s, local) == CancelTask(runner_id="i1-r0", task_id="t1")


def test_runner_of_deleted_or_failed_instance_is_shut_down_once():
    inst = instance()
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady())}
    assert plan(NODE, BOOT, State(), local) == Shutdown(runner_id="i1-r0")
    failed = msgspec.structs.replace(inst, failed_reason="x")
    assert plan(NODE, BOOT, state_with(failed), local) == Shutdown(runner_id="i1-r0")
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset({"shutdown"}))}
    assert plan(NODE, BOOT, State(), local) is None


def test_restarted_node_never_revives_runners_of_a_previous_boot():
    inst = instance(boot="boot-0")
    assert plan(NODE, BOOT, state_with(inst), {}) is None


def test_ended_runner_is_not_recreated():
    inst = instance()
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerShutdown())}
    assert plan(NODE, BOOT, state_with(inst), local) is None


def test_generation_waits_for_every_rank_to_be_ready():
    inst = instance(world=2)
    t = gen_task("t1", 5)
    s = state_with(inst, {"i1-r0": RunnerReady(), "i1-r1": RunnerLoaded()}, tasks=(t,))
    local = {"i1-r0": LocalRunner("i1-r0", "i1", RunnerReady(), frozenset({"connect", "load", "warmup"}))}
    assert plan(NODE, BOOT, s, local) is None
    s = state_with(inst, {"i1-r0": RunnerReady(), "i1-r1": RunnerRunning()}, tasks=(t,))
    assert plan(NODE, BOOT, s, local) == ForwardTask("i1-r0", t)


@given(st.lists(st.sampled_from(["idle", "loaded", "ready", "running"]), min_size=1, max_size=3), st.integers(0, 3))
def test_plan_is_a_function_of_its_inputs(statuses, n_tasks):
    by_tag = {"idle": RunnerIdle(), "loaded": RunnerLoaded(), "ready": RunnerReady(), "running": RunnerRunning()}
    insts = [instance(f"i{k}") for k in range(len(statuses))]
    tasks = [gen_task(f"t{j}", j, inst=insts[j % len(insts)].instance_id) for j in range(n_tasks)]
    s = State(
        instances={i.instance_id: i for i in insts},
        runners={f"{i.instance_id}-r0": RunnerRecord(f"{i.instance_id}-r0", i.instance_id, NODE, by_tag[t]) for i, t in zip(insts, statuses)},
        tasks={t.task_id: TaskRecord(t) for t in tasks},
    )
    local = {f"{i.instance_id}-r0": LocalRunner(f"{i.instance_id}-r0", i.instance_id, by_tag[t]) for i, t in zip(insts, statuses)}
    a = plan(NODE, BOOT, s, local)
    b = plan(NODE, BOOT, s, local)
    assert a == b
    # executing the returned task (recording it as sent) never yields the same task again
    if a is not None and not isinstance(a, CreateRunner):
        key = {"LoadModel": "load", "StartWarmup": "warmup"}.get(type(a).__name__) or a.task.task_id
        rid = a.runner_id
        local[rid] = msgspec.structs.replace(local[rid], sent=local[rid].sent | {key})
        assert plan(NODE, BOOT, s, local) != a


def test_ranks_connect_only_once_no_rank_is_downloading_its_shard():
    """A rank fetching its shard from peers has no runner process yet; the others
    wait Idle instead of connecting to a group it cannot join."""
    from exo_p2p.types import ConnectToGroup, RunnerDownloading

    inst = instance(world=2)
    me, other = inst.shards[0].runner_id, inst.shards[1].runner_id
    local = {me: LocalRunner(me, "i1", RunnerIdle())}
    downloading = state_with(inst, {me: RunnerIdle(), other: RunnerDownloading(10, 100)})
    assert plan(NODE, BOOT, downloading, local) is None
    fetched = state_with(inst, {me: RunnerIdle(), other: RunnerIdle()})
    assert plan(NODE, BOOT, fetched, local) == ConnectToGroup(runner_id=me)
    # a downloading local runner gets no lifecycle task, but a deleted instance stops it
    mine = {me: LocalRunner(me, "i1", RunnerDownloading(0, 100))}
    assert plan(NODE, BOOT, state_with(inst, {me: RunnerDownloading(0, 100), other: RunnerIdle()}), mine) is None
    assert plan(NODE, BOOT, State(), mine) == Shutdown(runner_id=me)
