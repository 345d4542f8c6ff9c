"""Moving an idle instance onto a cheaper ring when its links change (``master.relink``;
docs/links.md#when-a-link-changes).

Two nodes n0, n1 joined by a fast address (10.1.0.x) and a slow one (10.2.0.x). The instance
is placed while only the slow one is measured (the fast one was down); then the fast one is
measured again, and the rule moves the idle instance through ``master.restore``'s switch.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cli.output.placed_view import restoring_text
from exo_p2p.types import InstanceCreated, InstanceDeleted, LinkFigures, RunnerLoading, State
from master.placement.place import place_instance
from master.relink import (
    RELINK_CHECK_EVERY,
    RELINK_FACTOR,
    RELINK_INTERVAL,
    RELINK_MARGIN_US,
    RELINK_SETTLE,
    RelinkClock,
    better_ring,
    current_cost_us,
    relink_step,
    worth_moving,
)
from master.restore import draining, handled_by_restore, restore_step
from tests.support.rules.placement_cluster import GIB, cluster
from tests.support.rules.restore_size import _ready, _task, _with
from tests.support.rules.relink_figures import FAST, MODEL, SLOW, _figures, _state

pytestmark = pytest.mark.unit

BOTH = frozenset({"n0", "n1"})


def _placed_on_slow() -> tuple[State, str]:
    """A ready 2-rank instance ``i`` placed while only the slow address was measured, in a
    State where the fast one is measured again (110 µs, 1 GB/s)."""
    inst = place_instance(_state(_figures(None)), MODEL, min_nodes=2, instance_id="i")
    assert {s.ring_address.rsplit(":", 1)[0] for s in inst.shards} == set(SLOW.values())
    state = _ready(_with(_state(_figures((110, 1_000_000_000))), inst), inst)
    return state, "i"


def test_the_current_cost_is_over_the_addresses_the_ring_uses_with_todays_figures():
    state, iid = _placed_on_slow()
    from master.placement.cost import cost_model
    from master.placement.topology import topology_from_state

    inst = state.instances[iid]
    model = cost_model(MODEL, "pipeline", 2)
    # 64 hidden × 4 bytes over 2.4 MB/s forward, 4 bytes back, each + 21 ms
    assert current_cost_us(topology_from_state(state), inst, model) == (21_000 + 107) + (21_000 + 2)
    # an address of the ring without figures while the link has others measured: unknown
    lost = msgspec.structs.replace(state, links=_figures((110, 1_000_000_000), None))
    assert current_cost_us(topology_from_state(lost), inst, model) is None
    assert better_ring(lost, inst, new_instance_id="j") is None


def test_an_idle_instance_on_the_slow_link_moves_to_the_fast_one_and_says_why():
    state, iid = _placed_on_slow()
    move = better_ring(state, state.instances[iid], new_instance_id="j")
    assert move is not None and move.instance_id == iid
    new = move.successor
    assert {s.ring_address.rsplit(":", 1)[0] for s in new.shards} == set(FAST.values())
    assert new.replaces == iid and new.restores and new.moved == move.why
    assert move.current_us == 42_109 and move.best_us < 400
    assert f"{move.current_us} -> {move.best_us} us/token" in move.why
    # the switch is master.restore's: the old one serves until the new one is ready and idle
    moving = _with(state, new)
    assert restore_step(moving, reachable=BOTH, now=0.0, not_before={}, new_instance_id="x").events == ()
    ready = _task(_ready(moving, new), "t1", iid)
    assert draining(ready) == {iid}
    assert restore_step(ready, reachable=BOTH, now=0.0, not_before={}, new_instance_id="x").events == ()
    done = msgspec.structs.replace(ready, tasks={})
    assert restore_step(done, reachable=BOTH, now=0.0, not_before={}, new_instance_id="x").events == (InstanceDeleted(iid),)
    # a successor that fails is deleted; the old one keeps serving
    failed = _with(moving, msgspec.structs.replace(new, failed_reason="x"))
    assert handled_by_restore(failed, failed.instances["j"])
    assert restore_step(failed, reachable=BOTH, now=0.0, not_before={}, new_instance_id="x").events == (InstanceDeleted("j"),)
    # ps says what the successor does
    assert restoring_text({"replaces": iid, "restores": True, "moved": move.why}, {iid: "i"}) == "moves i to a cheaper ring"


def test_no_move_when_busy_loading_away_unknown_or_already_on_the_best_ring():
    state, iid = _placed_on_slow()
    inst = state.instances[iid]

    def step(s: State, reachable=BOTH, since: float = 0.0):  # type: ignore[no-untyped-def]
        return relink_step(s, reachable=reachable, now=100.0, not_before={}, better_since={iid: since}, new_instance_id="j")

    assert step(state).move is not None
    assert step(_task(state, "t1", iid)).move is None  # a request in flight
    assert step(_task(state, "t1", iid, status="complete")).move is not None  # a finished one does not count
    assert step(state, reachable=frozenset({"n0"})).move is None  # a node not heard
    loading = _ready(state, inst, status=RunnerLoading(1, 4))
    assert step(loading).move is None
    assert step(msgspec.structs.replace(state, model_cards={})).move is None
    assert step(state, since=100.0 - RELINK_SETTLE + 1).move is None  # the gain has not held long enough
    assert relink_step(state, reachable=BOTH, now=100.0, not_before={iid: 101.0}, better_since={iid: 0.0},
                       new_instance_id="j").move is None  # moved too recently
    on_fast = place_instance(state, MODEL, min_nodes=2, instance_id="f")
    best = _ready(_with(msgspec.structs.replace(state, instances={}), on_fast), on_fast)
    assert step(best).move is None and step(best).justified == frozenset()


def test_one_move_at_a_time_and_the_clock_keeps_the_settle_and_the_interval():
    state, iid = _placed_on_slow()
    clock = RelinkClock()
    assert clock.due(0.0)
    plan = relink_step(state, reachable=BOTH, now=0.0, not_before=clock.not_before, better_since=clock.better_since,
                       new_instance_id="j")
    assert plan.move is None and plan.justified == {iid}  # first seen now: waits RELINK_SETTLE
    clock.checked(0.0, plan)
    assert not clock.due(RELINK_CHECK_EVERY - 0.1) and clock.due(RELINK_CHECK_EVERY)
    plan = relink_step(state, reachable=BOTH, now=RELINK_SETTLE, not_before=clock.not_before,
                       better_since=clock.better_since, new_instance_id="j")
    assert plan.move is not None and plan.events == (InstanceCreated(plan.move.successor),)
    clock.checked(RELINK_SETTLE, plan)
    assert clock.not_before == {iid: RELINK_SETTLE + RELINK_INTERVAL, "j": RELINK_SETTLE + RELINK_INTERVAL}
    # a break in the run of justified checks forgets it
    clock.checked(RELINK_SETTLE + 5, relink_step(state, reachable=frozenset(), now=RELINK_SETTLE + 5,
                                                   not_before={}, better_since={}, new_instance_id="k"))
    assert clock.better_since == {}


@settings(max_examples=200, deadline=None)
@given(fast=st.tuples(st.integers(50, 100_000), st.integers(10**5, 10**10)),
       slow=st.tuples(st.integers(50, 100_000), st.integers(10**5, 10**10)),
       now_fast=st.tuples(st.integers(50, 100_000), st.integers(10**5, 10**10)),
       busy=st.booleans())
def test_the_rule_never_moves_a_busy_instance_never_for_a_small_gain_and_a_move_always_costs_less(fast, slow, now_fast, busy):
    """Placed with some figures, checked with others: a move happens only when the instance
    is idle, the gain passes both thresholds, and the successor's cost is lower; when no
    move happens with the instance idle, the best placement does not pass them."""
    placed = place_instance(_state(_figures(fast, slow)), MODEL, min_nodes=2, instance_id="i")
    state = _ready(_with(_state(_figures(now_fast, slow)), placed), placed)
    if busy:
        state = _task(state, "t1", "i", status="pending")
    plan = relink_step(state, reachable=BOTH, now=1000.0, not_before={}, better_since={"i": 0.0}, new_instance_id="j")
    from master.placement.cost import cost_model
    from master.placement.topology import topology_from_state

    model = cost_model(MODEL, "pipeline", 2)
    current = current_cost_us(topology_from_state(state), placed, model)
    best_inst = place_instance(state, MODEL, min_nodes=2, instance_id="b")
    best = current_cost_us(topology_from_state(state), best_inst, model)
    assert current is not None and best is not None and best <= current  # placement never picks worse
    if plan.move is None:
        assert busy or not worth_moving(current, best)
        return
    assert not busy, "moved an instance with a request in flight"
    assert plan.move.current_us == current and plan.move.best_us == best < current
    assert current > RELINK_FACTOR * best and current - best > RELINK_MARGIN_US


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_worth_moving_is_both_thresholds(current, best):
    assert worth_moving(current, best) == (current > RELINK_FACTOR * best and current - best > RELINK_MARGIN_US)
    if worth_moving(current, best):
        assert not worth_moving(best, current)  # hysteresis: never straight back


def _run_master(relink: bool, two: bool = False) -> list[tuple[float, object]]:
    """A master (``MasterRole.run`` on trio's mock clock) over the instance placed on the slow
    link (``two``: and a second one), with the fast one measured; the runners of a successor
    report Ready 2 s after it is created (12 s with ``two``: over two relink checks). Returns
    (seconds since start, event) of the instances it created and deleted in ``RELINK_SETTLE``
    + 30 s (+ 60 s)."""
    import tempfile
    from pathlib import Path

    import trio
    import trio.testing

    from exo_p2p.replica import Replica
    from exo_p2p.types import (
        LinkMeasured,
        MasterElected,
        NodeModelsUpdated,
        NodeProfileUpdated,
        RunnerReady,
        RunnerStatusUpdated,
        TopologyEdgeCreated,
    )
    from master.role import MasterRole

    state, iid = _placed_on_slow()
    placed = [state.instances[iid]]
    ready_after = 12.0 if two else 2.0  # a successor loads over two relink checks when two
    if two:  # a second instance on the slow link
        placed.append(place_instance(_with(_state(_figures(None)), placed[0]), MODEL, min_nodes=2, instance_id="h"))
    seen: list[tuple[float, object]] = []

    async def main() -> None:
        start = trio.current_time()

        async def publish(indexed):  # type: ignore[no-untyped-def]
            if isinstance(indexed.event, (InstanceCreated, InstanceDeleted)):
                seen.append((trio.current_time() - start, indexed.event))

        with tempfile.TemporaryDirectory() as d:
            replica = Replica(Path(d) / "events.log", sync=False)
            master = MasterRole("n0", 1, replica, publish, reachable=lambda: set(BOTH), relink=relink)
            await master.emit([MasterElected("n0", 1), *(NodeProfileUpdated(p) for p in state.nodes.values()),
                               *(NodeModelsUpdated(n, (MODEL,)) for n in state.nodes),
                               *(TopologyEdgeCreated(e) for out in state.edges.values() for e in out.values()),
                               *(LinkMeasured(a, b, f) for a, sinks in state.links.items() for b, figs in sinks.items()
                                 for f in figs.values()),
                               *(InstanceCreated(inst) for inst in placed),
                               *(RunnerStatusUpdated(s.runner_id, inst.instance_id, s.node_id, RunnerReady())
                                 for inst in placed for s in inst.shards)])
            seen.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(master.run)
                for _ in range(int((RELINK_SETTLE + (60 if two else 30)) / 0.5)):
                    await trio.sleep(0.5)
                    for t, event in list(seen):
                        if isinstance(event, InstanceCreated) and trio.current_time() - start - t >= ready_after:
                            new = event.instance
                            if all(r.runner_id not in master.replica.state.runners for r in new.shards):
                                await master.emit([RunnerStatusUpdated(s.runner_id, new.instance_id, s.node_id, RunnerReady())
                                                   for s in new.shards])
                nursery.cancel_scope.cancel()
            replica.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return seen


def test_the_master_moves_the_idle_instance_after_the_settle_once_unless_turned_off():
    events = _run_master(relink=True)
    assert [type(e).__name__ for _, e in events] == ["InstanceCreated", "InstanceDeleted"], events
    (t_created, created), (t_deleted, deleted) = events
    assert RELINK_SETTLE <= t_created <= RELINK_SETTLE + RELINK_CHECK_EVERY + 1
    assert created.instance.moved and deleted == InstanceDeleted("i")  # type: ignore[attr-defined]
    assert t_deleted >= t_created + 2.0
    assert _run_master(relink=False) == []  # --no-relink


def test_the_master_moves_two_instances_one_after_the_other():
    events = _run_master(relink=True, two=True)
    kinds = [(type(e).__name__, getattr(e, "instance_id", None) or e.instance.replaces) for _, e in events]  # type: ignore[attr-defined]
    assert kinds == [("InstanceCreated", "h"), ("InstanceDeleted", "h"), ("InstanceCreated", "i"), ("InstanceDeleted", "i")], kinds
    assert events[2][0] >= events[1][0]  # the second move starts once the first switch is done


def test_the_better_ring_is_sought_among_the_nodes_the_master_hears():
    """Three nodes: the instance on n0-n1 over the slow link (the only one between them), a
    fast pair n0-n2. Moved to n0-n2 while n2 is heard, never while it is not."""
    base = cluster([(64 * GIB, 64 * GIB)] * 3)
    links: dict = {}
    for a, b, ip, figs in (("n0", "n1", "10.2.0.2", (21_000, 2_400_000)), ("n1", "n0", "10.2.0.1", (21_000, 2_400_000)),
                           ("n0", "n2", "10.1.0.3", (110, 10**9)), ("n2", "n0", "10.1.0.1", (110, 10**9)),
                           ("n1", "n2", "10.3.0.3", (21_000, 2_400_000)), ("n2", "n1", "10.3.0.2", (21_000, 2_400_000))):
        links.setdefault(a, {}).setdefault(b, {})[ip] = LinkFigures(ip, figs[0], figs[1], "ethernet")
    state = msgspec.structs.replace(base, model_cards={"m": MODEL}, links=links)
    inst = place_instance(state, MODEL, min_nodes=2, nodes=["n0", "n1"], instance_id="i")
    state = _ready(_with(state, inst), inst)
    all3 = frozenset({"n0", "n1", "n2"})
    move = better_ring(state, inst, new_instance_id="j", reachable=all3)
    assert move is not None and {s.node_id for s in move.successor.shards} == {"n0", "n2"}
    assert better_ring(state, inst, new_instance_id="j", reachable=BOTH) is None
    assert relink_step(state, reachable=BOTH, now=100.0, not_before={}, better_since={"i": 0.0},
                       new_instance_id="j").move is None


def test_two_instances_on_the_slow_link_move_one_at_a_time():
    state, iid = _placed_on_slow()
    other = place_instance(_with(_state(_figures(None)), state.instances[iid]), MODEL, min_nodes=2, instance_id="h")
    state = _ready(_with(state, other), other)
    plan = relink_step(state, reachable=BOTH, now=100.0, not_before={}, better_since={iid: 0.0, "h": 0.0},
                       new_instance_id="j")
    assert plan.justified == {iid, "h"} and len(plan.events) == 1 and plan.move.instance_id == "h"  # type: ignore[union-attr]
    # while that move is under way the master asks restore_step, which finishes it first
    from master.restore import restore_under_way

    assert restore_under_way(_with(state, plan.move.successor))  # type: ignore[union-attr]
