"""The heal rule, claim admission, command access and the timeout grace as pure rules and
loop-level tests (no processes): the partition-heal rule of ``exo_p2p.cluster.election``, the admission of
master claims of ``exo_p2p.cluster.claims``, the master's timeout grace of
``exo_p2p.cluster.peer_timeouts`` and the direct-heartbeat cadence of
``exo_p2p.cluster.direct_heartbeat``. The election simulator is the one of
tests/test_election.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p.cluster.claims import ClaimChecker, ClaimStatus, ProbeAnswer, log_prefix_check, probe_answer
from exo_p2p.cluster.direct_heartbeat import direct_delay, gossip_fresh
from exo_p2p.cluster.election import ElectionView, decide, master_rank, support
from exo_p2p.cluster.member import ClusterMember, MasterHooks
from exo_p2p.cluster.messages import LogResponse
from exo_p2p.cluster.peer_timeouts import timed_out
from exo_p2p.replica import Replica
from exo_p2p.types import State
from tests.support.rules.election_sim import SETTINGS, TIMEOUT, Sim, SimNode, claim, hb
from tests.support.rules.heal_stubs import _noop, _stub_replica

# --- the side that kept the cluster going wins a heal ----------------------------------------------


def test_lone_claimer_with_a_higher_term_loses_to_the_majority():
    """A node cut off alone claimed term 9; the majority's master kept term 4 with two
    followers. Every node holding all heartbeats follows the majority's master, at its term
    (under the old ``(term, priority, node_id)`` rule the lone node won)."""
    lone = claim("node-z", 9, priority=5, last_idx=40, commit_idx=40)
    m = claim("node-a", 4, last_idx=30, commit_idx=30)
    f1, f2 = hb("node-b", 4, "node-a", last_idx=30), hb("node-c", 4, "node-a", last_idx=29)
    everyone = [lone, m, f1, f2]
    for own in everyone:
        peers = tuple(p for p in everyone if p is not own)
        d = decide(ElectionView(own, peers, 0.0), settle=SETTINGS.failover_settle)
        assert (d.follow, d.term, d.claim) == ("node-a", 4, False), own.node_id


def test_equal_sides_prefer_more_committed_events_then_the_term():
    """Two masters with one follower each: the one with more committed events wins whatever
    the terms; a claimed commit index above the claimer's own last index does not count."""
    a, b = claim("node-a", 3, last_idx=20, commit_idx=20), claim("node-b", 7, last_idx=20, commit_idx=12)
    fa, fb = hb("node-c", 3, "node-a"), hb("node-d", 7, "node-b")
    d = decide(ElectionView(fa, (a, b, fb), 0.0), settle=0.5)
    assert d.follow == "node-a"
    liar = claim("node-b", 7, last_idx=5, commit_idx=10**9)
    assert master_rank(liar, 2) < master_rank(a, 2)
    d = decide(ElectionView(fa, (a, liar, fb), 0.0), settle=0.5)
    assert d.follow == "node-a"
    # equal sides and committed events: the term decides, as before
    a2 = claim("node-a", 3, last_idx=12, commit_idx=12)
    assert decide(ElectionView(fa, (a2, b, fb), 0.0), settle=0.5).follow == "node-b"


def test_support_counts_the_heartbeats_that_name_the_master():
    hbs = [claim("a", 1), hb("b", 1, "a"), hb("c", 1, "x"), claim("x", 2)]
    assert support(hbs, "a") == 2 and support(hbs, "x") == 2 and support(hbs, "b") == 0


def _groups_link(minority: set[str], cut: float, heal: float):
    def link(s: str, r: str, t: float) -> float | None:
        if cut - 1e-9 <= t < heal - 1e-9 and ((s in minority) != (r in minority)):
            return None
        return 0.01

    return link


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 6), k=st.integers(1, 2), master_in_minority=st.booleans(), prio=st.integers(0, 3))
def test_heal_keeps_the_majoritys_master(n, k, master_in_minority, prio):
    """Simulated partition of ``n`` nodes into a minority of ``k`` < n/2 and the rest; each
    side has a master by the end of the cut (the minority's claims at a higher term when the
    master was on the majority side). After the heal every node follows the master of the
    majority side, which never stepped down, and the term of that side."""
    if 2 * k >= n:
        k = (n - 1) // 2
    ids = [f"n{i}" for i in range(n)]
    master = ids[0]
    minority = set(ids[:k]) if master_in_minority else set(ids[n - k :])
    nodes = [SimNode(x, 3, master, priority=prio if x in minority else 0) for x in ids]
    sim = Sim(nodes)
    sim.seed([ids])
    cut, heal = 1.0, 14.0
    sim.link = _groups_link(minority, cut, heal)
    sim.run(heal - 0.1)
    sides = {(x in minority): sim.nodes[x].master for x in ids}
    assert sides[True] in minority and sides[False] not in minority  # a master on each side
    majority_master = sides[False]
    majority_term = sim.nodes[majority_master].term
    history_before = list(sim.nodes[majority_master].history)
    sim.run(heal + 6.0)
    assert sim.view() == {(majority_master, majority_term)}
    assert sim.nodes[majority_master].history == history_before  # it never stepped down
    for x in ids:
        if x not in minority:
            # the majority's followers never left their master after the heal
            assert all(m == majority_master for t, m, _ in sim.nodes[x].history if t >= heal)


# --- which claims are admitted ---------------------------------------------------------------------


def _checker_status(checker: ClaimChecker, c, *, side=1, following=(None, 0), own_last=10, own_term=3, chain=None, now=0.0):
    chain_at = chain or (lambda i: b"d%d" % i)
    return checker.status(c, side=side, following=following, own_last_idx=own_last, own_term=own_term, chain_at=chain_at, now=now)


def test_forged_claim_with_a_huge_term_is_refused_without_the_clusters_log():
    """A claimer ahead of us must answer the probe with events after our last index; one
    that does not answer (a rogue peer serves no log), or answers with a snapshot while
    claiming a term far above ours, is refused; refusals are re-checked after 5 s."""
    rogue = claim("rogue", 10**6, last_idx=10**6, commit_idx=10**6)
    ck = ClaimChecker()
    assert _checker_status(ck, rogue) is ClaimStatus.PROBE
    ck.probe_started(rogue)
    assert _checker_status(ck, rogue) is ClaimStatus.PENDING
    ck.probe_done(rogue, probe_answer(None), now=0.0)
    assert _checker_status(ck, rogue, now=1.0) is ClaimStatus.REFUSED
    assert _checker_status(ck, rogue, now=5.1) is ClaimStatus.PROBE
    ck.probe_done(rogue, probe_answer(LogResponse(snapshot=State(), last_idx=10**6, diverged=True)), now=6.0)
    assert _checker_status(ck, rogue, now=6.5) is ClaimStatus.REFUSED
    # a rogue behind us with another log and a huge term: refused at once (no probe)
    behind = claim("rogue2", 10**6, last_idx=5, chain=b"other")
    assert _checker_status(ClaimChecker(), behind) is ClaimStatus.REFUSED


def test_claims_with_the_clusters_log_or_a_side_are_admitted():
    ck = ClaimChecker()
    same = claim("m", 4, last_idx=7, chain=b"d7")
    assert _checker_status(ck, same) is ClaimStatus.ADMITTED  # our log up to 7 is its log
    assert log_prefix_check(claim("m", 4, last_idx=0), 0, lambda i: None) is True
    ahead = claim("m", 4, last_idx=50)
    assert _checker_status(ck, ahead) is ClaimStatus.PROBE
    ck.probe_done(ahead, probe_answer(LogResponse(events=(), last_idx=50)), now=0.0)
    assert _checker_status(ck, ahead, now=100.0) is ClaimStatus.ADMITTED
    # a master whose log has our next events compacted away answers with a snapshot that
    # does not say "diverged": admitted, whatever its term (a fresh node joining an old cluster)
    old = claim("m2", 40, last_idx=5000)
    assert probe_answer(LogResponse(snapshot=State(), last_idx=5000)) is ProbeAnswer.COMPACTED
    ck.probe_done(old, ProbeAnswer.COMPACTED, now=0.0)
    assert _checker_status(ck, old, own_term=0, own_last=0, now=0.1) is ClaimStatus.ADMITTED
    huge = claim("x", 10**6, last_idx=10**6)
    assert _checker_status(ck, huge, side=2) is ClaimStatus.ADMITTED  # another node follows it
    assert _checker_status(ck, huge, following=("x", 10**6)) is ClaimStatus.ADMITTED
    # the other side of a healed 1|1 partition: diverged log, term one above ours
    other_side = claim("y", 4, last_idx=9, chain=b"theirs")
    assert _checker_status(ck, other_side) is ClaimStatus.PROBE
    ck.probe_done(other_side, ProbeAnswer.DIVERGED, now=0.0)
    assert _checker_status(ck, other_side, now=0.1) is ClaimStatus.ADMITTED


class _NoLogNet:
    """A network whose every request fails (a claimer that serves no log)."""

    async def request(self, *_a, **_k):  # type: ignore[no-untyped-def]
        raise ConnectionError("no such protocol")


def test_master_alone_ignores_a_forged_claim_with_a_huge_term(tmp_path: Path):
    """B, master alone at term 1, hears a rogue peer's heartbeats claiming term 10⁶ with a
    huge log: the rogue cannot answer for its log, so B stays master at its term and counts
    the refusals (before the fix B stepped down and followed the rogue)."""

    async def main() -> ClusterMember:
        replica = Replica(tmp_path / "events.log", sync=False)
        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=_noop)  # type: ignore[arg-type]
        clock = lambda: trio.current_time() + 1000.0  # noqa: E731
        member = ClusterMember(_NoLogNet(), replica, "node-b", "boot-b", hooks, clock=clock)
        rogue = claim("rogue", 10**6, last_idx=10**6, commit_idx=10**6)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.roles.run)
            await trio.sleep(3 * SETTINGS.settle)
            assert member.is_master and member.term == 1
            for _ in range(20):
                member.liveness.heard(rogue, clock())
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        replica.close()
        return member

    m = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert m.is_master and m.master == "node-b" and m.term == 1
    assert m.counters.get("master_claim_refused", 0) >= 1


# --- a new master gives every node a full timeout -------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    heard=st.one_of(st.none(), st.floats(0, 100)),
    since=st.floats(0, 100),
    dt=st.floats(0, 20),
)
def test_no_node_times_out_before_a_full_timeout_of_mastership(heard, since, dt):
    now = since + dt
    if heard is not None and heard > now:
        heard = now
    gone = timed_out(["x", "me"], self_id="me", last_heard={"x": heard}.get, master_since=since, now=now, timeout=TIMEOUT)
    ref = since if heard is None else max(heard, since)
    assert ("x" in gone) == (now - ref >= TIMEOUT)
    assert "me" not in gone
    if dt < TIMEOUT:
        assert gone == []


@pytest.mark.parametrize("heard_at", [None, 1.0])
def test_new_master_times_out_a_silent_node_only_a_full_timeout_after_it_became_master(heard_at):
    """B starts at t=0 as a follower, State lists X; X is silent (never heard, or heard at
    t=1 s). B becomes master at t=6 s: X is timed out no earlier than t=6+timeout and no later
    than one check (0.5 s) after. Before the fix B timed X out at its first check (t≈6.5 s):
    its clock started at node start."""
    emitted: list[float] = []

    async def main() -> None:
        async def emit(events):  # type: ignore[no-untyped-def]
            emitted.append(trio.current_time())
            return 0

        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=emit)  # type: ignore[arg-type]
        member = ClusterMember(None, _stub_replica(["node-b", "node-x"]), "node-b", "boot-b", hooks, clock=trio.current_time)
        if heard_at is not None:
            await trio.sleep(heard_at)
            member.liveness.heard(hb("node-x", 0, None), trio.current_time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.sequencer.timeout_loop)
            await trio.sleep(6.0 - trio.current_time())
            await member.roles.claim(1)
            assert member.is_master
            await trio.sleep(10.0)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert emitted, "X was never timed out"
    assert 6.0 + TIMEOUT - 1e-9 <= emitted[0] <= 6.0 + TIMEOUT + 0.5 + 1e-9, emitted[0]


def test_direct_heartbeat_cadence():
    """Every heartbeat interval while the master has not heard us by gossip lately; else
    every third of the timeout, so a direct heartbeat always lands within the timeout."""
    assert direct_delay(False, heartbeat_interval=0.5, peer_timeout=5.0) == 0.5
    assert direct_delay(True, heartbeat_interval=0.5, peer_timeout=5.0) < 5.0 / 2
    assert not gossip_fresh(None, 10.0, heartbeat_interval=0.5)
    assert gossip_fresh(9.0, 10.0, heartbeat_interval=0.5) and not gossip_fresh(8.5, 10.0, heartbeat_interval=0.5)
    assert math.isclose(direct_delay(True, heartbeat_interval=0.5, peer_timeout=6.0), 2.0)


# --- who may send commands -------------------------------------------------------------------------


def test_commands_only_from_members_in_their_own_name():
    from exo_p2p.cluster.command_access import command_refusal

    members, followers = {"a", "b"}, {"c"}
    assert command_refusal("a", "a", members, followers) is None
    assert command_refusal("c", "c", members, followers) is None  # follows us, profile on its way
    assert "not a member" in command_refusal("rogue", "rogue", members, followers)
    assert "origin" in command_refusal("rogue", "a", members, followers)
