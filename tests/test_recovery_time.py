"""Recovery time after a fault (scripts/chaos.py): a new master times out the master
it replaced from that master's last heartbeat (exo_p2p.cluster.peer_timeouts ``lost_master``),
and a failed instance that had served is re-placed at once (master.replace ``replace_delay``).

Under scripts/chaos.py the slow recoveries were master kills: the new master gave the dead master, like
every node, a full timeout from the moment it became master, so the dead master's instances
failed (and were re-placed) failover + 5 s after the kill instead of 5 s. Every other node
keeps the grace (the timeout-grace rule: tests/test_heal_rule.py).
"""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.member import ClusterMember, MasterHooks
from exo_p2p.cluster.peer_timeouts import timed_out
from tests.support.rules.election_sim import TIMEOUT, claim
from tests.support.rules.heal_stubs import _noop, _stub_replica


@settings(max_examples=200, deadline=None)
@given(heard=st.floats(0, 100), since=st.floats(0, 100), dt=st.floats(0, 20), other_heard=st.one_of(st.none(), st.floats(0, 100)))
def test_the_lost_master_counts_from_its_last_heartbeat_every_other_node_keeps_the_grace(heard, since, dt, other_heard):
    now = max(heard, since) + dt
    if other_heard is not None and other_heard > now:
        other_heard = now
    heard_of = {"m": heard, "x": other_heard}.get
    gone = timed_out(["m", "x", "me"], self_id="me", last_heard=heard_of, master_since=since, now=now,
                     timeout=TIMEOUT, lost_master="m")
    assert ("m" in gone) == (now - heard >= TIMEOUT)
    x_ref = since if other_heard is None else max(other_heard, since)
    assert ("x" in gone) == (now - x_ref >= TIMEOUT)
    # a lost master never heard (impossible for a follower, but safe): the grace applies
    never = timed_out(["m"], self_id="me", last_heard=lambda n: None, master_since=since, now=now, timeout=TIMEOUT, lost_master="m")
    assert ("m" in never) == (now - since >= TIMEOUT)


def test_a_follower_that_takes_over_times_out_the_dead_master_a_timeout_after_its_last_heartbeat():
    """B follows M; M's last heartbeat reaches B at t=1 s; B loses M, then becomes master at
    t=3 s (the failover). M is timed out at t=1+timeout (one 0.5 s check later at most), not at
    t=3+timeout as before the fix. X, silent since t=0.5 s, still gets the full grace."""
    emitted: dict[str, float] = {}

    async def main() -> None:
        async def emit(events):  # type: ignore[no-untyped-def]
            for e in events:
                emitted.setdefault(e.node_id, trio.current_time())
            return 0

        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=emit)  # type: ignore[arg-type]
        member = ClusterMember(None, _stub_replica(["node-b", "node-m", "node-x"]), "node-b", "boot-b", hooks, clock=trio.current_time)
        await trio.sleep(0.5)
        member.liveness.heard(claim("node-x", 0), trio.current_time())
        await member.roles.set_master("node-m", 1)
        await trio.sleep(0.5)
        member.liveness.heard(claim("node-m", 1), trio.current_time())  # M's last heartbeat
        await trio.sleep(1.0)
        await member.roles.set_master(None, 1)  # "master gone"
        assert member.roles.lost_master == "node-m"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.sequencer.timeout_loop)
            await trio.sleep(3.0 - trio.current_time())
            await member.roles.claim(2)
            assert member.is_master
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert 1.0 + TIMEOUT - 1e-9 <= emitted["node-m"] <= 1.0 + TIMEOUT + 0.5 + 1e-9, emitted
    assert 3.0 + TIMEOUT - 1e-9 <= emitted["node-x"] <= 3.0 + TIMEOUT + 0.5 + 1e-9, emitted


def test_following_another_master_forgets_the_lost_one():
    async def main() -> None:
        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=_noop)  # type: ignore[arg-type]
        member = ClusterMember(None, _stub_replica(["node-b", "node-m"]), "node-b", "boot-b", hooks, clock=trio.current_time)
        await member.roles.set_master("node-m", 1)
        await member.roles.set_master(None, 1)
        assert member.roles.lost_master == "node-m"
        await member.roles.set_master("node-c", 2)
        assert member.roles.lost_master is None

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# --- a served instance is re-placed at once (master.replace.replace_delay) -------------------------


def test_a_served_instance_is_re_placed_at_once_a_crash_loop_still_backs_off():
    """The master's loop re-places a failed instance that had served within one pass (0.25 s),
    where before it waited the 1 s backoff of attempt 0; one that never served still waits
    ``backoff(attempt)``."""
    from exo_p2p.replica import Replica
    from exo_p2p.types import InstanceCreated, InstanceFailed, RunnerReady, RunnerStatusUpdated
    from master.commands import handle_command
    from master.replace import backoff, replace_delay
    from master.role import MasterRole
    from exo_p2p.types import PlaceInstance
    from tests.support.rules.master_run import one_node

    import tempfile
    from pathlib import Path

    def timing(serve: bool) -> float:
        created: list[float] = []

        async def publish(indexed):  # type: ignore[no-untyped-def]
            if isinstance(indexed.event, InstanceCreated) and indexed.event.instance.replaces:
                created.append(trio.current_time())

        async def main() -> None:
            with tempfile.TemporaryDirectory() as d:
                replica = Replica(Path(d) / "events.log", sync=False)
                master = MasterRole("node-a", 1, replica, publish)
                seed = one_node()
                await master.emit([e for e in _events_of(seed)])
                decision = handle_command(replica.state, PlaceInstance("cmd-1", "m"))
                await master.emit(list(decision.events))
                inst = decision.result.instance
                shard = inst.shards[0]
                if serve:
                    await master.emit([RunnerStatusUpdated(shard.runner_id, inst.instance_id, shard.node_id, RunnerReady())])
                assert replica.state.instances[inst.instance_id].served == serve
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(master.run)
                    await trio.sleep(1.0)
                    t_fail = trio.current_time()
                    await master.emit([InstanceFailed(inst.instance_id, "node node-a restarted")])
                    failed = replica.state.instances[inst.instance_id]
                    assert replace_delay(failed) == (0.0 if serve else backoff(failed.attempt))
                    await trio.sleep(5.0)
                    nursery.cancel_scope.cancel()
                replica.close()
                created[:] = [t - t_fail for t in created]

        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        assert created, "not re-placed"
        return created[0]

    assert timing(serve=True) <= 0.25 + 1e-9
    assert backoff(0) - 1e-9 <= timing(serve=False) <= backoff(0) + 0.25 + 1e-9


def _events_of(state):  # type: ignore[no-untyped-def]
    """The events that build ``one_node()``'s State (its master, profile and model)."""
    from exo_p2p.types import MasterElected, NodeModelsUpdated, NodeProfileUpdated

    profile = state.nodes["node-a"]
    return [MasterElected("node-a", 1), NodeProfileUpdated(profile), NodeModelsUpdated("node-a", tuple(state.model_cards.values()))]


def test_a_rejoined_node_whose_events_arrive_before_its_heartbeats_is_not_timed_out_again():
    """X was heard by heartbeat at t=0.5 s, then died (timed out ~t=5.5 s). Its new
    incarnation's profile reaches the master directly at t=7.75 s, before any of its heartbeats:
    the master must count X's time from those events, not time it out again at once (before
    the fix: a NodeTimedOut at every check from then on, a rejoined node removed again)."""
    from exo_p2p.cluster.messages import LocalEventBatch
    from exo_p2p.types import LocalEvent, NodeTimedOut

    emitted: list[tuple[str, float]] = []

    async def main() -> None:
        async def emit(events):  # type: ignore[no-untyped-def]
            emitted.extend((e.node_id, trio.current_time()) for e in events)
            return 0

        async def accept_local(_local):  # type: ignore[no-untyped-def]
            return None

        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=accept_local, command=_noop, emit=emit)  # type: ignore[arg-type]
        member = ClusterMember(None, _stub_replica(["node-b", "node-x"]), "node-b", "boot-b", hooks, clock=trio.current_time)
        await member.roles.claim(1)
        await trio.sleep(0.5)
        member.liveness.heard(claim("node-x", 0), trio.current_time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.sequencer.timeout_loop)
            await trio.sleep(7.75 - trio.current_time())
            profile = LocalEvent("node-x", "boot-x2", 1, NodeTimedOut("node-y"))  # any event of its own
            await member.sequencer._accept(LocalEventBatch((profile,)), "node-x")  # type: ignore[arg-type]
            await trio.sleep(6.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    times = [t for n, t in emitted if n == "node-x"]
    assert times and min(times) <= 0.5 + TIMEOUT + 0.5 + 1e-9, times  # the dead incarnation: timed out
    assert not [t for t in times if 7.75 < t < 7.75 + TIMEOUT - 1e-9], times  # the new one: a full timeout


@settings(max_examples=300, deadline=None)
@given(heard=st.floats(0, 50), cut=st.one_of(st.none(), st.floats(0, 50)), dt=st.floats(0, 20), since=st.floats(0, 10))
def test_a_node_without_a_connection_is_timed_out_after_the_shorter_bound(heard, cut, dt, since):
    """A node the master has no connection to (since ``cut``) and has not heard for
    ``DISCONNECTED_TIMEOUT`` s is gone (a killed node: its connection closed at once), once
    the new master's own grace is over; a connected node gets the full timeout."""
    from exo_p2p import defaults

    short = defaults.DISCONNECTED_TIMEOUT
    now = max(heard, since, cut or 0.0) + dt
    gone = timed_out(["x"], self_id="me", last_heard=lambda n: heard, master_since=since, now=now, timeout=TIMEOUT,
                     disconnected_since=lambda n: cut)
    ref = max(heard, since)
    expected = now - ref >= TIMEOUT or (cut is not None and now - since >= TIMEOUT and now - max(ref, cut) >= short)
    assert ("x" in gone) == expected
    assert short < TIMEOUT


def test_a_killed_node_is_timed_out_soon_after_its_connection_closed():
    """Master B (for a while already) hears X until t=10 s; X's connection closes at
    t=10.2 s (SIGKILL): X is timed out ``DISCONNECTED_TIMEOUT`` s after its last heartbeat,
    one check later at most (before: the full ``PEER_TIMEOUT``, while placement kept putting
    re-placed instances on the dead node)."""
    from types import SimpleNamespace

    from exo_p2p import defaults

    emitted: list[float] = []
    connected = {"node-x"}

    async def main() -> None:
        async def emit(events):  # type: ignore[no-untyped-def]
            emitted.extend(trio.current_time() for e in events if e.node_id == "node-x")
            return 0

        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=emit)  # type: ignore[arg-type]
        net = SimpleNamespace(connected_peers=lambda: set(connected))
        member = ClusterMember(net, _stub_replica(["node-b", "node-x"]), "node-b", "boot-b", hooks, clock=trio.current_time)
        await member.roles.claim(1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.sequencer.timeout_loop)
            while trio.current_time() < 10.0:
                member.liveness.heard(claim("node-x", 0), trio.current_time())
                await trio.sleep(0.5)
            await trio.sleep(0.2)
            connected.clear()
            member.peers.disconnected_at["node-x"] = trio.current_time()
            await trio.sleep(8.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert emitted, "never timed out"
    assert 10.0 + defaults.DISCONNECTED_TIMEOUT - 1e-9 <= emitted[0] <= 10.0 + defaults.DISCONNECTED_TIMEOUT + 0.5 + 1e-9, emitted


def test_a_re_placement_that_raises_does_not_take_the_master_down(monkeypatch):
    """A bug in the re-placement rule for one failed instance must not end the master's loop
    (it would take the node down, and the next master would crash the same way): the error
    is logged once and other failed instances are still re-placed."""
    import tempfile
    from pathlib import Path

    import master.replace
    from exo_p2p.replica import Replica
    from exo_p2p.types import InstanceCreated, InstanceFailed, PlaceInstance
    from master.commands import handle_command
    from master.role import MasterRole
    from tests.support.rules.master_run import one_node

    real = master.replace.replacement
    created: list[str] = []

    def replacement(state, instance, new_id, **kw):  # type: ignore[no-untyped-def]
        if instance.instance_id == "cmd-1":
            raise RuntimeError("a rule bug")
        return real(state, instance, new_id, **kw)

    monkeypatch.setattr(master.replace, "replacement", replacement)

    async def publish(indexed):  # type: ignore[no-untyped-def]
        if isinstance(indexed.event, InstanceCreated) and indexed.event.instance.replaces:
            created.append(indexed.event.instance.replaces)

    async def main() -> None:
        with tempfile.TemporaryDirectory() as d:
            replica = Replica(Path(d) / "events.log", sync=False)
            role = MasterRole("node-a", 1, replica, publish)
            await role.emit(_events_of(one_node()))
            for cmd in ("cmd-1", "cmd-2"):
                await role.emit(list(handle_command(replica.state, PlaceInstance(cmd, "m")).events))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(role.run)
                await role.emit([InstanceFailed("cmd-1", "x"), InstanceFailed("cmd-2", "y")])
                await trio.sleep(10.0)
                nursery.cancel_scope.cancel()
            replica.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert created and set(created) == {"cmd-2"}
