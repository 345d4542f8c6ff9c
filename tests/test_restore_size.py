"""A shrunk instance comes back to size (``master.restore``; docs/cluster.md).

A 2-rank instance on node-a (n0) and node-b (n1) loses node-b; its re-placement fits only on
node-a and records the placement it stands in for (``Instance.placed``). Once node-b is back
the master places the 2-rank instance again beside the shrunk one and deletes the shrunk one
once the new one is ready and the shrunk one has no task in flight.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cli.output.placed_view import shrunk_text, with_placed
from exo_p2p.cli.output.render import instances_table
from exo_p2p.types import ChatMessage, GenerationParams, Instance, InstanceCreated, InstanceDeleted, MasterElected, NodeModelsUpdated, NodeProfileUpdated, PlacedNode, RunnerLoading, RunnerReady, RunnerStatusUpdated, State, SubmitTask, TopologyEdgeCreated
from master.commands import handle_command
from master.placement.place import place_instance
from master.replace import replacement
from master.restore import RECHECK_INTERVAL, RESTORE_INTERVAL, draining, handled_by_restore, restore_step
from tests.support.rules.placement_cluster import GIB, card, cluster
from tests.support.rules.restore_size import _ready, _task, _with

MODEL = card(8, 8 * GIB)
BOTH = frozenset({"n0", "n1"})


def _two_nodes() -> State:
    return msgspec.structs.replace(cluster([(64 * GIB, 64 * GIB), (64 * GIB, 64 * GIB)]), model_cards={"m": MODEL})


def _shrunk() -> tuple[State, Instance]:
    """node-b left: the 2-rank instance ``old`` re-placed as ``s`` on node-a alone (ready);
    returns the State with node-b back (reachable, same id) and ``s``."""
    both = _two_nodes()
    old = place_instance(both, MODEL, min_nodes=2, instance_id="old")
    failed = msgspec.structs.replace(old, failed_reason="runner on node n0 failed: [ring] connection to a peer was lost", served=True)
    events = replacement(_with(both, failed), failed, "s", unreachable=frozenset({"n1"}))  # node-b dead, not timed out yet
    assert isinstance(events[0], InstanceDeleted) and isinstance(events[1], InstanceCreated)
    shrunk = events[1].instance
    return _ready(_with(both, shrunk), shrunk), shrunk


def test_a_re_placement_on_fewer_ranks_records_the_placement_it_stands_in_for():
    _, shrunk = _shrunk()
    assert shrunk.world_size == 1 and shrunk.shrunk and shrunk.placed_ranks == 2
    assert [(p.node_id, p.name) for p in shrunk.placed] == [("n0", "node-a"), ("n1", "node-b")]
    assert [(p.node_id, p.name) for p in shrunk.left_nodes()] == [("n1", "node-b")]
    # node-b already timed out (not in State): its id is kept, its name is not known
    both = _two_nodes()
    failed = msgspec.structs.replace(place_instance(both, MODEL, min_nodes=2, instance_id="old"), failed_reason="gone")
    without_b = msgspec.structs.replace(both, nodes={"n0": both.nodes["n0"]}, edges={}, instances={"old": failed})
    assert replacement(without_b, failed, "s")[1].instance.placed[1].name == ""  # type: ignore[attr-defined]
    # the shrunk instance re-placed at its placed size again is not shrunk any more
    again = replacement(_with(both, msgspec.structs.replace(shrunk, failed_reason="x")),
                        msgspec.structs.replace(shrunk, failed_reason="x"), "t")[1].instance  # type: ignore[attr-defined]
    assert again.world_size == 2 and again.placed == () and not again.shrunk


def test_an_old_snapshot_without_the_fields_decodes_as_not_shrunk():
    inst = Instance("i", "m", "pipeline", ())  # type: ignore[arg-type]
    raw = msgspec.json.encode(inst).replace(b',"placed":[]', b"").replace(b',"restores":false', b"")
    assert b"placed" not in raw
    back = msgspec.json.decode(raw, type=Instance)
    assert back.placed == () and not back.restores and not back.shrunk


def test_the_nodes_back_and_the_instance_idle_start_a_full_size_restore():
    state, shrunk = _shrunk()
    plan = restore_step(state, reachable=BOTH, now=100.0, not_before={}, new_instance_id="r")
    (created,) = plan.events
    assert isinstance(created, InstanceCreated)
    new = created.instance
    assert sorted(s.node_id for s in new.shards) == ["n0", "n1"]
    assert new.replaces == "s" and new.restores and new.placed == () and new.settings == shrunk.settings
    assert plan.instance_id == "s" and plan.wait == RESTORE_INTERVAL


def test_no_restore_while_a_node_is_away_busy_loading_off_or_too_soon():
    state, shrunk = _shrunk()
    kw = dict(now=100.0, not_before={}, new_instance_id="r")
    assert restore_step(state, reachable={"n0"}, **kw).events == ()  # node-b not heard
    gone = msgspec.structs.replace(state, nodes={"n0": state.nodes["n0"]})
    assert restore_step(gone, reachable=BOTH, **kw).events == ()  # node-b not in State
    assert restore_step(_task(state, "t", "s"), reachable=BOTH, **kw).events == ()  # a task in flight
    assert restore_step(_task(state, "t", "s", "complete"), reachable=BOTH, **kw).events != ()  # a finished one is no task
    loading = _ready(state, shrunk, RunnerLoading(1, 8))
    assert restore_step(loading, reachable=BOTH, **kw).events == ()
    assert restore_step(state, reachable=BOTH, start=False, **kw).events == ()  # --no-restore-size
    assert restore_step(state, reachable=BOTH, now=100.0, not_before={"s": 100.5}, new_instance_id="r").events == ()


def test_a_restore_that_does_not_fit_is_checked_again_later():
    state, _ = _shrunk()
    small_b = dict(state.nodes)
    small_b["n1"] = msgspec.structs.replace(small_b["n1"], memory_total=GIB // 2, memory_available=GIB // 2)
    plan = restore_step(msgspec.structs.replace(state, nodes=small_b), reachable=BOTH, now=1.0, not_before={}, new_instance_id="r")
    assert plan.events == () and plan.instance_id == "s" and plan.wait == RECHECK_INTERVAL and plan.why


def _restoring() -> tuple[State, Instance, Instance]:
    state, shrunk = _shrunk()
    # "z": after "s" by id, so the tie-break of equally loaded instances would pick the shrunk one
    (created,) = restore_step(state, reachable=BOTH, now=0.0, not_before={}, new_instance_id="z").events
    new = created.instance  # type: ignore[attr-defined]
    return _with(state, new), shrunk, new


def test_the_shrunk_instance_serves_until_the_new_one_is_ready_then_goes_once_idle():
    state, shrunk, new = _restoring()
    kw = dict(reachable=BOTH, now=1.0, not_before={}, new_instance_id="x")
    loading = _ready(state, new, RunnerLoading(1, 4))
    assert restore_step(loading, **kw).events == ()  # one at a time, and nothing to switch yet
    assert draining(loading) == frozenset()
    ready = _ready(state, new)
    assert draining(ready) == {"s"}
    busy = _task(ready, "t", "s")
    assert restore_step(busy, **kw).events == ()  # its request finishes first
    assert restore_step(ready, **kw).events == (InstanceDeleted("s"),)


def test_new_requests_go_to_the_full_size_instance_once_it_is_ready():
    state, shrunk, new = _restoring()
    ready = _ready(state, new)
    cmd = SubmitTask.generation(command_id="c", task_id="t", model_id="m", api_node_id="n0",
                           params=GenerationParams((ChatMessage("user", "hi"),)))
    for _ in range(3):
        decision = handle_command(ready, cmd)
        assert decision.result.instance_id == new.instance_id
    loading = _ready(state, new, RunnerLoading(1, 4))
    assert handle_command(loading, cmd).result.instance_id == "s"


def test_a_failed_restore_is_dropped_and_a_failed_shrunk_instance_leaves_the_restore_to_take_over():
    state, shrunk, new = _restoring()
    kw = dict(reachable=BOTH, now=1.0, not_before={}, new_instance_id="x")
    new_failed = msgspec.structs.replace(new, failed_reason="runner failed")
    s1 = _with(state, new_failed)
    assert handled_by_restore(s1, new_failed) and restore_step(s1, **kw).events == (InstanceDeleted("z"),)
    old_failed = msgspec.structs.replace(shrunk, failed_reason="runner failed")
    s2 = _with(state, old_failed)
    assert handled_by_restore(s2, old_failed) and restore_step(s2, **kw).events == (InstanceDeleted("s"),)
    assert not handled_by_restore(_with(state, old_failed, new_failed), old_failed)  # both failed: re-placement's


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 40.0), st.sampled_from(["task", "finish", "tick", "ready", "fail"])),
                min_size=1, max_size=60))
def test_the_rule_never_restores_with_a_task_in_flight_nor_more_often_than_the_bound(steps):
    """A scripted master (as ``master.role.MasterRole._restore_pass`` keeps ``not_before``):
    tasks come and go on the shrunk instance, restores come ready or fail; every restore
    starts with no task in flight on the instance it restores, at most one is under way, and
    two starts for one instance are at least ``RESTORE_INTERVAL`` apart."""
    state, _ = _shrunk()
    now, not_before, starts, n = 0.0, {}, {}, 0
    for dt, what in steps:
        now += dt
        current = next(i for i in state.instances.values() if i.shrunk or not i.restores)
        pending = [i for i in state.instances.values() if i.restores and i.replaces in state.instances]
        if what == "task":
            n += 1
            state = _task(state, f"t{n}", current.instance_id)
        elif what == "finish":
            state = msgspec.structs.replace(state, tasks={})
        elif what == "ready" and pending:
            state = _ready(state, pending[0])
        elif what == "fail" and pending:
            state = _with(state, msgspec.structs.replace(pending[0], failed_reason="x"))
        plan = restore_step(state, reachable=BOTH, now=now, not_before=not_before, new_instance_id=f"r{n}-{now}")
        if plan.instance_id is not None:
            not_before[plan.instance_id] = now + plan.wait
        for event in plan.events:
            if isinstance(event, InstanceCreated):
                target = event.instance.replaces
                assert not any(r.task.instance_id == target for r in state.tasks.values()), "restored with a task in flight"
                assert not pending, "two restores at once"
                assert now - starts.get(target, -RESTORE_INTERVAL) >= RESTORE_INTERVAL, "restored too often"
                starts[target] = now
                state = _with(state, event.instance)
            elif isinstance(event, InstanceDeleted):
                assert not any(r.task.instance_id == event.instance_id for r in state.tasks.values()), "a request lost"
                state = msgspec.structs.replace(state, instances={k: v for k, v in state.instances.items() if k != event.instance_id})
        if not any(i.shrunk for i in state.instances.values()):
            break  # restored


def _run_master(restore_size: bool) -> list[object]:
    """A master (``MasterRole.run`` on trio's mock clock) over the shrunk instance with
    node-b back; the runners of any instance it creates report Ready 1 s later. Returns the
    events it sequenced itself after 5 s."""
    from exo_p2p.replica import Replica
    from master.role import MasterRole

    state, shrunk = _shrunk()
    seen: list[object] = []
    created: list[Instance] = []

    async def publish(indexed):  # type: ignore[no-untyped-def]
        seen.append(indexed.event)
        if isinstance(indexed.event, InstanceCreated) and indexed.event.instance.restores:
            created.append(indexed.event.instance)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as d:
            replica = Replica(Path(d) / "events.log", sync=False)
            master = MasterRole("n0", 1, replica, publish, reachable=lambda: set(BOTH), restore_size=restore_size)
            await master.emit([MasterElected("n0", 1), *(NodeProfileUpdated(p) for p in state.nodes.values()),
                               *(NodeModelsUpdated(n, (MODEL,)) for n in state.nodes),
                               *(TopologyEdgeCreated(e) for out in state.edges.values() for e in out.values()),
                               InstanceCreated(shrunk),
                               *(RunnerStatusUpdated(s.runner_id, "s", s.node_id, RunnerReady()) for s in shrunk.shards)])
            seen.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(master.run)
                await trio.sleep(1.0)
                for new in created:
                    await master.emit([RunnerStatusUpdated(s.runner_id, new.instance_id, s.node_id, RunnerReady()) for s in new.shards])
                await trio.sleep(4.0)
                nursery.cancel_scope.cancel()
            replica.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return [e for e in seen if isinstance(e, (InstanceCreated, InstanceDeleted))]


def test_the_master_restores_then_deletes_the_shrunk_instance_unless_turned_off():
    events = _run_master(restore_size=True)
    assert [type(e).__name__ for e in events] == ["InstanceCreated", "InstanceDeleted"], events
    assert events[0].instance.world_size == 2 and events[1] == InstanceDeleted("s")  # type: ignore[attr-defined]
    assert _run_master(restore_size=False) == []  # --no-restore-size


def test_the_node_setting_turns_it_off(tmp_path):
    from exo_p2p.cli.cluster.node_config import build_node_config

    assert build_node_config(data_dir=tmp_path).restore_size is True
    assert build_node_config(data_dir=tmp_path, restore_size=False).restore_size is False


def test_ps_says_an_instance_is_shrunk_and_names_the_node_that_left():
    listed = [{"instance_id": "s1", "model": "m", "sharding": "pipeline", "status": "ready",
               "shards": [{"node_id": "n0", "rank": 0, "start_layer": 0, "end_layer": 8, "status": "ready"}]},
              {"instance_id": "r1", "model": "m", "sharding": "pipeline", "status": "loading", "shards": []}]
    state = {"instances": {"s1": {"placed": [{"node_id": "n0", "name": "node-a"}, {"node_id": "n1", "name": "node-b"}]},
                           "r1": {"placed": [], "restores": True, "replaces": "s1"}}}
    merged = with_placed(listed, state)
    assert "placed" not in listed[0]  # the input is unchanged
    assert shrunk_text(merged[0]) == "shrunk from 2 ranks (node node-b left)"
    assert shrunk_text(merged[1]) is None
    assert shrunk_text({**merged[0], "placed": [{"node_id": "n0"}, {"node_id": "n1"}]}, {"n1": "b"}) == "shrunk from 2 ranks (node b left)"
    assert with_placed(listed, None) == listed
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(instances_table(merged, {"n0": "node-a"}))
    text = console.export_text()
    assert "shrunk from 2 ranks (node node-b left)" in text
    assert "restores the size of s" in text
