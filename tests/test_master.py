"""Master rules: command decisions, reactions, per-origin de-duplication (pure)."""

from __future__ import annotations

import msgspec

from exo_p2p.types import CancelGeneration, ChatMessage, DeleteInstance, GenerationParams, IndexedEvent, InstanceCreated, InstanceFailed, LocalEvent, MasterElected, NodeModelsUpdated, NodeProfile, NodeProfileUpdated, NodeTimedOut, PlaceInstance, RunnerFailed, RunnerReady, RunnerStatusUpdated, SubmitTask, TaskCancelRequested, TaskCreated, TaskDeleted, TaskStatusUpdated
from master.commands import handle_command
from master.reactions import react
from master.sequencer import OriginSeqs
from tests.support.rules.strategies import CARD
from tests.support.rules.master_run import GIB, one_node, run


def params():
    return GenerationParams((ChatMessage("user", "hi"),), max_tokens=5)


def test_place_then_submit_then_cancel():
    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    assert d.result.error is None and isinstance(d.events[0], InstanceCreated)
    s = run(s, d.events)
    inst = d.result.instance
    # not ready yet → 503 loading
    d = handle_command(s, SubmitTask.generation("cmd-2", "t1", "m", params(), "node-a"))
    assert d.result.error.status == 503 and d.result.error.code == "loading"
    s = run(s, [RunnerStatusUpdated(inst.shards[0].runner_id, inst.instance_id, "node-a", RunnerReady())])
    d = handle_command(s, SubmitTask.generation("cmd-3", "t1", "m", params(), "node-a"))
    assert d.result.error is None and isinstance(d.events[0], TaskCreated)
    s = run(s, d.events)
    d = handle_command(s, CancelGeneration("cmd-4", "t1"))
    assert d.events == (TaskCancelRequested("t1"),)
    # cancelling an unknown task is tolerated
    assert handle_command(s, CancelGeneration("cmd-5", "nope")).result.error is None


def test_status_codes_for_unknown_unplaced_and_failed():
    s = one_node()
    assert handle_command(s, SubmitTask.generation("c", "t", "zzz", params(), "node-a")).result.error.status == 404
    err = handle_command(s, SubmitTask.generation("c", "t", "m", params(), "node-a")).result.error
    assert err.status == 409 and "exo-p2p place m" in err.message
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    s = run(s, [InstanceFailed(d.result.instance.instance_id, "runner died")])
    err = handle_command(s, SubmitTask.generation("c", "t", "m", params(), "node-a")).result.error
    assert err.status == 503 and "runner died" in err.message
    assert handle_command(s, PlaceInstance("c2", "nope")).result.error.status == 404
    assert handle_command(s, DeleteInstance("c3", "nope")).result.error.status == 404


def test_a_retried_placement_is_answered_with_the_instance_it_made():
    """The command client sends a command again when the master's answer was lost (a reset
    stream, a master killed after it decided). The instance id is the command id: the retry
    gets the same instance and no event — not a 400 counting the first placement's memory
    against itself, and not a second ``InstanceCreated`` overwriting the first one's shards."""
    s = one_node(total=1500, available=1500)  # room for one copy of the 1000-byte model only
    first = handle_command(s, PlaceInstance("cmd-1", "m"))
    assert first.result.error is None
    s = run(s, first.events)
    again = handle_command(s, PlaceInstance("cmd-1", "m"))
    assert again.events == () and again.result.error is None
    assert again.result.instance == first.result.instance
    other = handle_command(s, PlaceInstance("cmd-2", "m"))  # a new placement still obeys memory
    assert other.result.error is not None and other.result.error.status == 400 and other.events == ()
    clash = handle_command(run(s, [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n")))]),
                           PlaceInstance("cmd-1", "n"))
    assert clash.events == () and clash.result.error.status == 409


def test_placement_that_does_not_fit_is_400_and_creates_nothing():
    big = msgspec.structs.replace(CARD, model_id="big", storage_size=30 * GIB, layer_bytes=tuple([30 * GIB // 4] * 4), embedding_bytes=0, norm_bytes=0)
    s = run(one_node(total=16 * GIB), [NodeModelsUpdated("node-a", (CARD, big))])
    d = handle_command(s, PlaceInstance("c", "big"))
    assert d.result.error.status == 400 and d.events == ()
    assert "33.0 GiB" in d.result.error.message


def test_queue_limit_gives_429():
    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    s = run(s, [RunnerStatusUpdated(inst.shards[0].runner_id, inst.instance_id, "node-a", RunnerReady())])
    for k in range(2):
        d = handle_command(s, SubmitTask.generation(f"c{k}", f"t{k}", "m", params(), "node-a"), queue_limit=2)
        s = run(s, d.events)
    d = handle_command(s, SubmitTask.generation("c9", "t9", "m", params(), "node-a"), queue_limit=2)
    assert d.result.error.status == 429


def test_a_gone_api_nodes_tasks_are_cancelled_and_its_instances_failed():
    """The client connections of a timed-out node's requests were on that node: nobody waits
    for their tokens. Its unfinished tasks on other nodes' instances get a cancel request
    (once); tasks of instances on the gone node fail and are removed as before."""
    s = one_node()
    s = run(s, [NodeProfileUpdated(NodeProfile("node-b", "boot-1", "b", memory_total=GIB, memory_available=GIB))])
    d = handle_command(s, PlaceInstance("cmd-1", "m", nodes=("node-a",)))
    s = run(s, d.events)
    inst = d.result.instance
    s = run(s, [RunnerStatusUpdated(inst.shards[0].runner_id, inst.instance_id, "node-a", RunnerReady())])
    for tid, api in (("t-b1", "node-b"), ("t-b2", "node-b"), ("t-b3", "node-b"), ("t-a", "node-a")):
        s = run(s, handle_command(s, SubmitTask.generation(f"c-{tid}", tid, "m", params(), api)).events)
    s = run(s, [TaskCancelRequested("t-b2"), TaskStatusUpdated("t-b3", "complete")])
    out = react(s, NodeTimedOut("node-b"))
    assert out == (TaskCancelRequested("t-b1"),)
    s = run(s, out)
    assert react(s, NodeTimedOut("node-b")) == ()  # asked once
    out = react(s, NodeTimedOut("node-a"))  # the instance's own node: its tasks fail, no cancel besides
    assert isinstance(out[0], InstanceFailed) and not any(isinstance(e, TaskCancelRequested) for e in out)
    assert {e.task_id for e in out if isinstance(e, TaskDeleted)} == {"t-b1", "t-b2", "t-a"}


def test_reactions_remove_finished_tasks_and_fail_instances():
    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    rid = inst.shards[0].runner_id
    s = run(s, [RunnerStatusUpdated(rid, inst.instance_id, "node-a", RunnerReady())])
    s = run(s, handle_command(s, SubmitTask.generation("c", "t1", "m", params(), "node-a")).events)
    ev = TaskStatusUpdated("t1", "complete")
    s = run(s, [ev])
    assert react(s, ev) == (TaskDeleted("t1"),)
    s = run(s, handle_command(s, SubmitTask.generation("c", "t2", "m", params(), "node-a")).events)
    ev = RunnerStatusUpdated(rid, inst.instance_id, "node-a", RunnerFailed("oom"))
    s = run(s, [ev])
    out = react(s, ev)
    assert isinstance(out[0], InstanceFailed) and "oom" in out[0].reason
    assert TaskStatusUpdated("t2", "failed") in out and TaskDeleted("t2") in out
    # a restarted node (new boot id) fails instances placed on its previous boot
    s2 = run(one_node(), [InstanceCreated(inst)])
    ev = NodeProfileUpdated(NodeProfile("node-a", "boot-2", "a", memory_total=GIB, memory_available=GIB))
    s2 = run(s2, [ev])
    assert isinstance(react(s2, ev)[0], InstanceFailed)


def test_origin_sequence_dedup():
    seqs = OriginSeqs()
    ev = MasterElected("x", 1)
    le = lambda n, boot="b1": LocalEvent("node-b", boot, n, ev)  # noqa: E731
    assert seqs.check(le(1)) == "accept"
    seqs.record(le(1))
    assert seqs.check(le(1)) == "duplicate"
    assert seqs.check(le(3)) == "gap"
    assert seqs.check(le(2)) == "accept"
    assert seqs.check(le(1, boot="b2")) == "accept"  # a new boot starts again at 1
    rebuilt = OriginSeqs.from_log([IndexedEvent(1, 1, ev, "node-b", "b1", 1), IndexedEvent(1, 2, ev, "node-b", "b1", 2)])
    assert rebuilt.check(le(2)) == "duplicate" and rebuilt.check(le(3)) == "accept"


def test_failed_instance_is_replaced_then_given_up():
    from exo_p2p.types import InstanceDeleted
    from master.replace import MAX_ATTEMPTS, backoff, replacement

    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    s = run(s, [InstanceFailed(inst.instance_id, "runner died")])
    events = replacement(s, s.instances[inst.instance_id], "new-1")
    assert isinstance(events[0], InstanceDeleted) and events[0].instance_id == inst.instance_id
    new = events[1].instance
    assert new.replaces == inst.instance_id and new.attempt == 1 and new.instance_id == "new-1"
    assert new.shards[0].runner_id.startswith("new-1")
    # attempts used up → given up, with the reason, and never again
    worn = msgspec.structs.replace(s.instances[inst.instance_id], attempt=MAX_ATTEMPTS)
    s2 = msgspec.structs.replace(s, instances={inst.instance_id: worn})
    (final,) = replacement(s2, worn, "new-2")
    assert final.final and "gave up" in final.reason and "runner died" in final.reason
    s2 = run(s2, [final])
    assert s2.instances[inst.instance_id].gave_up
    assert replacement(s2, s2.instances[inst.instance_id], "new-3") == ()
    assert backoff(0) < backoff(1) < backoff(2)


def test_an_instance_that_served_starts_its_replacement_count_again():
    """The attempt limit is for crash loops: an instance whose every rank reached Ready
    (``served``, set by apply) and that later fails is re-placed as attempt 1 whatever its
    own attempt number; one that never served counts on and is given up."""
    from exo_p2p.types import RunnerLoading, RunnerReady, RunnerStatusUpdated
    from master.replace import MAX_ATTEMPTS, replacement

    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    worn = msgspec.structs.replace(s.instances[inst.instance_id], attempt=MAX_ATTEMPTS)
    s = msgspec.structs.replace(s, instances={inst.instance_id: worn})
    shard = inst.shards[0]
    s = run(s, [RunnerStatusUpdated(shard.runner_id, inst.instance_id, shard.node_id, RunnerLoading(1, 4))])
    assert not s.instances[inst.instance_id].served
    s = run(s, [RunnerStatusUpdated(shard.runner_id, inst.instance_id, shard.node_id, RunnerReady())])
    assert s.instances[inst.instance_id].served
    s = run(s, [InstanceFailed(inst.instance_id, "node restarted")])
    events = replacement(s, s.instances[inst.instance_id], "new-1")
    assert events[1].instance.attempt == 1 and not events[1].instance.served
    # the same failure without ever serving: given up
    never = msgspec.structs.replace(s.instances[inst.instance_id], served=False)
    (final,) = replacement(msgspec.structs.replace(s, instances={inst.instance_id: never}), never, "new-2")
    assert final.final and "gave up" in final.reason


def test_failed_instance_that_no_longer_fits_is_given_up_with_the_reason():
    from master.replace import replacement

    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    s = run(s, [InstanceFailed(inst.instance_id, "node gone"),
                NodeProfileUpdated(NodeProfile("node-a", "boot-1", "a", memory_total=100, memory_available=100, models=("m",)))])
    (final,) = replacement(s, s.instances[inst.instance_id], "new-1")
    assert final.final and "not re-placed" in final.reason and "needs" in final.reason


def test_a_re_placement_that_fits_nowhere_waits_for_the_memory_release_before_giving_up():
    """Within ``RELEASE_WAIT`` of the failure nothing is given up (the failed runners may still
    hold the memory; their nodes re-publish it once they exit: under
    tests/test_runner_churn.py a re-placement was refused by 2 MB): no events, the master tries again; the
    memory back in a new report → re-placed; still nowhere after the wait → given up."""
    from master.replace import RELEASE_WAIT, replacement

    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    low = NodeProfile("node-a", "boot-1", "a", memory_total=100, memory_available=100, models=("m",))
    s_low = run(s, [InstanceFailed(inst.instance_id, "runner killed"), NodeProfileUpdated(low)])
    failed = s_low.instances[inst.instance_id]
    assert replacement(s_low, failed, "new-1", waited=0.5) == ()
    assert replacement(s_low, failed, "new-1", waited=RELEASE_WAIT - 0.1) == ()
    s_back = run(s, [InstanceFailed(inst.instance_id, "runner killed")])  # the node's memory as before
    deleted, created = replacement(s_back, s_back.instances[inst.instance_id], "new-1", waited=0.5)
    assert created.instance.replaces == inst.instance_id
    (final,) = replacement(s_low, failed, "new-1", waited=RELEASE_WAIT)
    assert final.final and "needs" in final.reason


def test_a_prompt_too_large_for_any_tokenization_is_refused_before_a_task_exists():
    """A prompt of more than context × MAX_BYTES_PER_TOKEN bytes cannot fit the context: 400
    context_length_exceeded at the master, no event, so no runner ever tokenizes it (a 5 MB
    prompt used to keep a runner silent past its 10 s bound and fail the instance); a
    prompt just under the bound is admitted (the runner checks its exact token count)."""
    from master.admission import MAX_BYTES_PER_TOKEN

    s = one_node()
    d = handle_command(s, PlaceInstance("cmd-1", "m"))
    s = run(s, d.events)
    inst = d.result.instance
    s = run(s, [RunnerStatusUpdated(inst.shards[0].runner_id, inst.instance_id, "node-a", RunnerReady())])
    limit = CARD.context_length * MAX_BYTES_PER_TOKEN
    huge = GenerationParams((ChatMessage("user", "x" * (limit + 1)),), max_tokens=5)
    d = handle_command(s, SubmitTask.generation("cmd-2", "t1", "m", huge, "node-a"))
    assert d.events == () and d.result.error.status == 400
    assert d.result.error.code == "context_length_exceeded" and str(limit + 1) in d.result.error.message
    assert d.result.error.context_tokens is not None and d.result.error.prompt_tokens > d.result.error.context_tokens  # a lower bound
    fits_bound = GenerationParams((ChatMessage("user", "x" * limit),), max_tokens=5)
    d = handle_command(s, SubmitTask.generation("cmd-3", "t2", "m", fits_bound, "node-a"))
    assert d.result.error is None or d.result.error.code != "context_length_exceeded"
