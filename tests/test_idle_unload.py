"""Keep-alive and idle unload rules (pure): ``exo_p2p.state.usage``, ``master.idle`` and the
master's decisions that record uses (docs/models.md "Placement on demand and idle unload")."""

from __future__ import annotations

from exo_p2p.types import (
    ChatMessage,
    FinishGeneration,
    GenerationParams,
    InstanceCreated,
    InstanceDeleted,
    InstanceFailed,
    InstanceUsed,
    PlaceInstance,
    RunnerReady,
    RunnerStatusUpdated,
    SubmitTask,
)
from master.commands import handle_command
from master.idle import READY_GRACE, IdleClock
from tests.support.rules.master_run import GIB, one_node, run

T0 = 1_700_000_000.0


def _ready(s, instance):
    return run(s, [RunnerStatusUpdated(sh.runner_id, instance.instance_id, sh.node_id, RunnerReady()) for sh in instance.shards])


def _placed(keep_alive=None, pin=False, on_demand=False, total=16 * GIB):
    s = one_node(total=total, available=total)
    d = handle_command(s, PlaceInstance("i1", "m", keep_alive=keep_alive, pin=pin, on_demand=on_demand), now=T0)
    assert d.result.error is None, d.result.error
    s = run(s, d.events)
    return _ready(s, d.result.instance), d.result.instance


def _submit(s, task_id, keep_alive=None, now=T0):
    params = GenerationParams((ChatMessage("user", "hi"),), max_tokens=5)
    d = handle_command(s, SubmitTask(task_id, SubmitTask.generation(task_id, task_id, "m", params, "node-a").task,
                                     keep_alive=keep_alive), now=now)
    assert d.result.error is None, d.result.error
    return run(s, d.events)


def test_a_placement_by_hand_is_kept_forever_and_adds_no_events_per_request():
    s, inst = _placed()
    assert inst.instance_id not in s.usage
    before = s.last_event_idx
    s = _submit(s, "t1")
    assert s.last_event_idx == before + 1  # TaskCreated alone
    s = run(s, handle_command(s, FinishGeneration("f", "t1"), now=T0 + 5).events)
    assert IdleClock().due(s, T0 + 10**9) == ()


def test_idle_past_keep_alive_is_unloaded_never_while_a_task_runs():
    s, inst = _placed(keep_alive=2.0, on_demand=True)
    clock = IdleClock()
    assert s.usage[inst.instance_id].expires_at == T0 + 2.0 and s.usage[inst.instance_id].on_demand
    assert clock.due(s, T0) == ()  # seen ready now: not used yet, kept READY_GRACE
    s = _submit(s, "t1", now=T0 + 1)
    assert clock.due(s, T0 + 40) == ()  # a request runs on it
    s = run(s, handle_command(s, FinishGeneration("f", "t1"), now=T0 + 50).events)
    assert s.usage[inst.instance_id].last_used == T0 + 50 and s.usage[inst.instance_id].served
    assert clock.due(s, T0 + 51.9) == ()
    assert clock.due(s, T0 + 52.0) == (inst.instance_id,)


def test_an_unused_instance_gets_the_ready_grace():
    s, inst = _placed(keep_alive=1.0, on_demand=True)
    clock = IdleClock()
    assert clock.due(s, T0 + 5) == ()  # first seen ready at T0 + 5
    assert clock.due(s, T0 + 5 + READY_GRACE - 0.1) == ()
    assert clock.due(s, T0 + 5 + READY_GRACE) == (inst.instance_id,)


def test_keep_alive_zero_from_the_request_unloads_once_it_ends_and_negative_is_forever():
    s, inst = _placed(keep_alive=300.0, on_demand=True)
    s = _submit(s, "t1", keep_alive=0.0, now=T0 + 1)
    s = run(s, handle_command(s, FinishGeneration("f", "t1"), now=T0 + 2).events)
    assert IdleClock().due(s, T0 + 2) == (inst.instance_id,)
    s = _submit(s, "t2", keep_alive=-1.0, now=T0 + 3)
    assert s.usage[inst.instance_id].keep_alive is None and s.usage[inst.instance_id].expires_at is None
    s = run(s, handle_command(s, FinishGeneration("f2", "t2"), now=T0 + 4).events)
    assert IdleClock().due(s, T0 + 10**9) == ()


def test_pinned_never_expires_and_a_loading_instance_waits():
    s, inst = _placed(keep_alive=1.0, pin=True)
    assert s.usage[inst.instance_id].expires_at is None
    s = one_node()
    d = handle_command(s, PlaceInstance("i2", "m", keep_alive=0.5), now=T0)
    s = run(s, d.events)  # not ready: loading
    assert IdleClock().due(s, T0 + 10**6) == ()


def test_usage_follows_a_replacement_and_goes_with_its_instance():
    s, inst = _placed(keep_alive=7.0, on_demand=True)
    s = run(s, [InstanceFailed(inst.instance_id, "runner died")])
    moved = InstanceCreated(instance=type(inst)(**{**{f: getattr(inst, f) for f in inst.__struct_fields__},
                                                   "instance_id": "i9", "replaces": inst.instance_id, "failed_reason": None}))
    s = run(s, [moved])
    assert s.usage["i9"] == s.usage[inst.instance_id]
    s = run(s, [InstanceDeleted(inst.instance_id)])
    assert inst.instance_id not in s.usage and "i9" in s.usage
    late = run(s, [InstanceUsed("i9", T0 - 100)])  # a late use never moves the deadline back
    assert late.usage["i9"].last_used == T0


def test_on_demand_placements_of_one_model_make_one_instance():
    s = one_node()
    first = handle_command(s, PlaceInstance("a", "m", on_demand=True), now=T0)
    s = run(s, first.events)
    second = handle_command(s, PlaceInstance("b", "m", on_demand=True), now=T0)
    assert second.result.instance.instance_id == "a"
    assert [type(e) for e in second.events] == [InstanceUsed]  # a use of the existing one, no second placement
    by_hand = handle_command(s, PlaceInstance("c", "m"), now=T0)  # by hand: a second instance as asked
    assert by_hand.result.error is None and by_hand.events


def test_the_deadline_counts_from_when_the_master_last_saw_a_task_run():
    """A runner's "complete" can be indexed before the API node's ``FinishGeneration``: the
    task no longer counts as running while its last chunks are on their way, and ``last_used``
    is still the request's start. The master's own record of the task running keeps it."""
    from exo_p2p.types import TaskStatusUpdated

    s, inst = _placed(keep_alive=2.0, on_demand=True)
    clock = IdleClock()
    s = _submit(s, "t1", now=T0 + 1)
    assert clock.due(s, T0 + 30) == ()  # running, seen by this master at T0 + 30
    s = run(s, [TaskStatusUpdated("t1", "complete")])  # the runner's end, FinishGeneration not yet
    assert clock.due(s, T0 + 31) == ()
    assert clock.due(s, T0 + 32) == (inst.instance_id,)


def _room_for_one():
    """One node with room for one copy of the 1000-byte model (two models of that size)."""
    import msgspec

    from exo_p2p.types import NodeModelsUpdated
    from tests.support.rules.strategies import CARD

    s = one_node(total=1500, available=1500)
    return run(s, [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n")))])


def _on_demand(s, command_id, model, now, **kw):
    d = handle_command(s, PlaceInstance(command_id, model, on_demand=True, keep_alive=300.0, **kw), now=now)
    return d, (run(s, d.events) if d.result.error is None else s)


def test_a_placement_that_does_not_fit_unloads_the_least_recently_used_idle_instance():
    s = _room_for_one()
    d, s = _on_demand(s, "a", "m", T0)
    s = _ready(s, d.result.instance)
    d, after = _on_demand(s, "b", "n", T0 + 10)
    assert d.result.error is None, d.result.error
    assert [type(e).__name__ for e in d.events] == ["InstanceDeleted", "InstanceCreated", "InstanceUsed"]
    assert d.events[0].instance_id == "a" and set(after.instances) == {"b"}


def test_serving_pinned_and_by_hand_instances_are_never_handed_over():
    s = _room_for_one()
    d, s = _on_demand(s, "a", "m", T0)
    s = _ready(s, d.result.instance)
    import msgspec

    from exo_p2p.types import TaskCreated

    task = SubmitTask.generation("t1", "t1", "m", GenerationParams((ChatMessage("user", "hi"),), max_tokens=5), "node-a").task
    busy_state = run(s, [TaskCreated(msgspec.structs.replace(task, instance_id="a"))])  # a request runs on it
    refused, _ = _on_demand(busy_state, "b", "n", T0 + 10)
    assert refused.result.error.status == 400 and refused.events == ()
    assert refused.result.error.code == "placement_busy"  # only for now: it fits once "a" is idle
    assert "serving a request are idle: a" in refused.result.error.message
    s = _room_for_one()
    d, s = _on_demand(s, "p", "m", T0, pin=True)
    pinned = _on_demand(_ready(s, d.result.instance), "b", "n", T0 + 10)[0].result.error
    assert pinned.status == 400 and pinned.code == "placement_failed"
    assert "serving, pinned or kept until deleted" in pinned.message
    s = _room_for_one()
    s = run(s, handle_command(s, PlaceInstance("h", "m"), now=T0).events)  # by hand: until deleted
    by_hand = _on_demand(s, "b", "n", T0 + 10)[0].result.error
    assert by_hand.status == 400 and by_hand.code == "placement_failed"


def test_the_cli_says_when_an_instance_goes():
    from exo_p2p.cli.output.render import keep_alive_text

    assert keep_alive_text({"last_used": None}) == ""  # placed by hand: until deleted
    assert keep_alive_text({"pinned": True, "last_used": T0}) == "pinned"
    assert keep_alive_text({"last_used": T0, "expires_at": T0 + 300}, now=T0 + 10) == "idle unload in 4m (used 10s ago)"
    assert keep_alive_text({"last_used": T0, "expires_at": None}, now=T0 + 7200) == "kept forever (used 2h ago)"


def test_max_loaded_models_unloads_the_nodes_own_idle_instance_or_refuses():
    import msgspec

    s = one_node()
    s = msgspec.structs.replace(s, nodes={"node-a": msgspec.structs.replace(s.nodes["node-a"], max_loaded_models=1)})
    from exo_p2p.types import NodeModelsUpdated
    from tests.support.rules.strategies import CARD

    s = run(s, [NodeModelsUpdated("node-a", (CARD, msgspec.structs.replace(CARD, model_id="n")))])
    d, s = _on_demand(s, "a", "m", T0)
    s = _ready(s, d.result.instance)
    d, after = _on_demand(s, "b", "n", T0 + 10)  # memory is plenty: the bound alone hands A over
    assert [type(e).__name__ for e in d.events] == ["InstanceDeleted", "InstanceCreated", "InstanceUsed"], d
    pinned = run(after, handle_command(after, PlaceInstance("p", "n", pin=True), now=T0).events)  # a second copy of n: same model
    assert "p" in pinned.instances
    refused = handle_command(pinned, PlaceInstance("c", "m", on_demand=True), now=T0 + 20)  # b idle, p pinned: still 2 models
    assert refused.result.error.status == 400 and "--max-loaded-models: node-a at most 1" in refused.result.error.message
    assert refused.events == ()


def test_which_refusals_wait_for_a_placement_on_demand():
    from exo_p2p.api.demand.placer import waiting_on, waits
    from exo_p2p.types import ErrorInfo

    loading = ErrorInfo(503, "loading", "server_error", code="loading")
    s = one_node()
    assert waits(ErrorInfo(409, "not placed", "invalid_request_error", code="model_not_placed"), s, "m")
    by_hand = run(s, handle_command(s, PlaceInstance("h", "m"), now=T0).events)
    assert not waits(loading, by_hand, "m")  # placed by hand and loading: 503 with Retry-After, as before
    on_demand = run(s, handle_command(s, PlaceInstance("d", "m", on_demand=True, keep_alive=60.0), now=T0).events)
    assert waits(loading, on_demand, "m") and waiting_on(on_demand, "m") == ("d", None)
    failed = run(on_demand, [InstanceFailed("d", "runner died")])
    loading_id, failure = waiting_on(failed, "m")
    assert loading_id is None and failure.code == "instance_failed" and "runner died" in failure.message
    assert waiting_on(s, "m") == (None, None)  # none at all: the only case that places
