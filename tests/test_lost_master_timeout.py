"""A new master times out the master it replaced from that master's last heartbeat
(exo_p2p.cluster.peer_timeouts ``lost_master``; chaos run, issue 9 item 8).

The chaos run's slow recoveries were master kills: the new master gave the dead master, like
every node, a full timeout from the moment it became master, so the dead master's instances
failed (and were re-placed) failover + 5 s after the kill instead of 5 s. Every other node
keeps the grace (the issue 9 item 8 rule: tests/test_heal_rule.py).
"""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.member import ClusterMember, MasterHooks
from exo_p2p.cluster.peer_timeouts import timed_out
from tests.test_election import TIMEOUT, claim
from tests.test_heal_rule import _noop, _stub_replica


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
