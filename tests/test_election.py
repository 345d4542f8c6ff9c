"""Election and liveness rules, as pure unit tests (no processes, no sockets): a late
message, same-term claims, liveness by the receiver's clock (user-reported failure scenarios).

How the scenarios map onto this design (no campaign messages; a claim rides in a heartbeat,
``hb.master == hb.node_id``; a term is claimed without votes, election rule 2; logs are
matched by a hash chain because two cut-off nodes can claim the same term):

- "A late message does not flip the master": a delayed heartbeat of a former master
  claiming an older term reaches nodes that already follow a newer claim; ``decide`` ranks
  claims by ``(term, priority, node_id)``, so the old claim loses and no node changes master.
- "A same-term candidacy when no campaign runs": there is no campaign state to be in;
  ``decide`` is evaluated on every pass of the election loop over whatever heartbeats are
  live, so a second claim at the same term is always evaluated, and every node that holds both
  claims picks the same one. "Stale-clock messages get a reply carrying the current term": a
  node with a stale term that hears a live master's higher term adopts it (``ElectionDecision.term``).
- Liveness is stamped with the receiver's monotonic clock (``Liveness``; heartbeats carry
  no time), and ``apply`` reads no clock, so replay gives the same State hash on any machine.

``Sim`` below is a small deterministic simulator of many nodes, each stepping the real
election step ``exo_p2p.cluster.election.election_step`` (settle after start vs after a loss,
master-gone check, follow/claim) over ``Liveness`` with an injected clock and scripted
message delays. Some tests drive the real ``role.RoleKeeper`` loop under trio's MockClock.
"""

from __future__ import annotations

import ast
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import msgspec
import msgspec.inspect as mi
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import exo_p2p.cluster.election as election_module
import exo_p2p.cluster.liveness as liveness_module
from exo_p2p.cluster.election import ElectionView, candidate_rank, decide, master_rank
from exo_p2p.cluster.liveness import Liveness
from exo_p2p.cluster.member import ClusterMember, MasterHooks
from exo_p2p.cluster.messages import Heartbeat, encode
from exo_p2p.replica import Replica
from exo_p2p.state import apply, state_hash
from exo_p2p.types import Event, IndexedEvent, State
from tests.support.rules.strategies import events, index
from tests.support.rules.election_sim import Link, SETTINGS, Sim, SimNode, TIMEOUT, claim, hb

STATE_DIR = Path(__file__).resolve().parents[1] / "exo_p2p" / "state"


def no_wall_clock(*_a, **_k):  # type: ignore[no-untyped-def]
    raise AssertionError("a wall clock was read")


def master_changes(node: SimNode, initial: str | None) -> int:
    """Changes between successive masters followed (masterless gaps are not a change)."""
    seq = [m for m in [initial, *(m for _, m, _ in node.history)] if m is not None]
    return sum(a != b for a, b in itertools.pairwise(seq))


# --- a late message does not flip the master -------------------------------------------------
CUT, HEAL = 2.0, 12.0


def _cut_link(late_delay: float | None, heal: float | None = HEAL) -> Link:
    """A's links to B and C are down from CUT to ``heal``; A's heartbeat sent at CUT is not
    lost but arrives ``late_delay`` s later (None: lost too)."""

    def link(s: str, r: str, t: float) -> float | None:
        if "a" in (s, r) and t >= CUT - 1e-9 and (heal is None or t < heal - 1e-9):
            return late_delay if (s == "a" and abs(t - CUT) < 1e-9) else None
        return 0.01

    return link


def _three_following_a() -> Sim:
    """A master at term 3 (three elections happened), B and C follow it; running long. A has
    the highest priority, so only the term keeps its stale claim from winning."""
    nodes = [SimNode("a", 3, "a", priority=1), SimNode("b", 3, "a"), SimNode("c", 3, "a")]
    sim = Sim(nodes)
    sim.seed([["a", "b", "c"]])
    return sim


def test_late_claim_of_an_older_term_does_not_flip_the_master():
    """A late message, scripted: A (master, term 3) is cut off from B and C at t=2 s; its heartbeat
    sent at t=2 s is delayed 7 s. B and C time A out after ``peer_timeout``, elect C at term 4
    (``failover_settle`` later), then receive A's stale term-3 claim at t≈9 s: both keep
    following C. At t=12 s the link heals: A hears C's term-4 claim and steps down to follow
    C (it adopts term 4). At t=13.25 s a reordered copy of A's old claim reaches B after A's
    fresh "following C" heartbeats: B still follows C. Every node changes master at most
    once, and all end on (C, 4)."""
    sim = _three_following_a()
    sim.link = _cut_link(late_delay=7.0)
    sim.run(10.0)
    a, b, c = (sim.nodes[x] for x in "abc")
    # the election of C happened before the late message arrived (else the script is moot)
    assert c.master == "c" and c.term == 4 and b.master == "c"
    elected_at = c.claims_at[0]
    assert elected_at < CUT + 7.0
    # A's last heartbeat reached B/C at 1.6 s: timed out 5 s later, C claims failover_settle after
    assert 1.6 + TIMEOUT + SETTINGS.failover_settle - 1e-9 <= elected_at <= 1.6 + TIMEOUT + SETTINGS.failover_settle + 0.2
    assert a.master == "a" and a.term == 3  # cut off, A still thinks it leads (AP: two claims)
    sim.deliver_at(13.25, "b", claim("a", 3))  # reordered stale claim after the heal
    sim.run(20.0)
    assert sim.view() == {("c", 4)}
    assert [n.node_id for n in sim.nodes.values() if n.claims_at] == ["c"] and len(c.claims_at) == 1
    for n in sim.nodes.values():
        assert master_changes(n, "a") <= 1, (n.node_id, n.history)
        terms = [t for _, _, t in n.history]
        assert terms == sorted(terms)
    # A stepped down on hearing C's claim within one heartbeat interval of the heal (+ 2 ticks)
    stepped = [t for t, m, _ in a.history if m == "c"]
    assert stepped and HEAL <= stepped[0] <= HEAL + SETTINGS.heartbeat_interval + 0.2


@settings(max_examples=40, deadline=None)
@given(
    late_at=st.floats(CUT + 0.5, 25.0).map(lambda x: round(x, 1)),
    receivers=st.sets(st.sampled_from(["b", "c"]), min_size=1),
    heal=st.sampled_from([None, HEAL, 20.0]),
)
def test_late_claim_at_any_time_changes_master_at_most_once(late_at, receivers, heal):
    """A late message over arrival times: A's stale term-3 claim arrives at ``late_at`` at any subset
    of B, C (before, during or after the election of C; before or after the heal). Because
    the receiver stamps a heartbeat with its arrival time, a late claim makes A look alive for
    up to ``peer_timeout``, which may delay the election, but never makes a node go back to a
    master it left: each node changes master at most once, and once the late message has
    expired and the link is healed (or stays cut), B and C agree on one (master, term).

    One return is the heal rule at work, not a flip (``election.master_rank``):
    when the late claim reached B just as C claimed, B stayed with A, so at the heal A's side
    (A and B) is the larger one and C, which claimed alone, goes back to A — once."""
    sim = _three_following_a()
    sim.link = _cut_link(late_delay=None, heal=heal)
    for r in receivers:
        sim.deliver_at(late_at, r, claim("a", 3))
    sim.run(max(late_at + TIMEOUT, heal or 0.0) + 6.0)
    for n in sim.nodes.values():
        others_kept_a = [m for m in "bc" if m != n.node_id and master_changes(sim.nodes[m], "a") == 0]
        back_to_majority = heal is not None and n.master == "a" and bool(others_kept_a)
        assert master_changes(n, "a") <= (2 if back_to_majority else 1), (n.node_id, n.history)
        assert back_to_majority or not (n.master == "a" and any(m == "c" for _, m, _ in n.history)), (n.node_id, n.history)
    b, c = sim.nodes["b"], sim.nodes["c"]
    assert (b.master, b.term) == (c.master, c.term) and b.master is not None
    if heal is not None:
        assert len(sim.view()) == 1
    claimants = {n.node_id for n in sim.nodes.values() if n.master == n.node_id}
    assert len(claimants) == 1 or (heal is None and claimants == {"a", "c"})


# --- same-term claims, stale terms ----------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    term=st.integers(1, 9),
    prio_m=st.integers(-1, 2),
    prio_x=st.integers(-1, 2),
    observers=st.lists(st.tuples(st.sampled_from(["m", "x", None]), st.integers(0, 9)), max_size=4),
)
def test_same_term_claims_pick_one_master_for_every_listener(term, prio_m, prio_x, observers):
    """Same-term claims: M leads at term T and X claims the same term T (two cut-off sides both
    claimed T without votes). Every node that holds both claims, whatever it followed before
    and whatever its own term, follows the claim with the larger side (more of the held
    heartbeats follow it: the heal rule), then the higher ``(priority, node_id)``, and takes
    term T; the losing master itself steps down. No campaign state is needed for the second
    claim to be evaluated: ``decide`` sees it on the next pass."""
    m, x = claim("node-m", term, priority=prio_m), claim("node-x", term, priority=prio_x)
    obs = [hb(f"node-o{i}", min(t, term), None if f is None else f"node-{f}") for i, (f, t) in enumerate(observers)]
    side_m = 1 + sum(o.master == "node-m" for o in obs)
    side_x = 1 + sum(o.master == "node-x" for o in obs)
    winner = "node-x" if (side_x, prio_x, "node-x") > (side_m, prio_m, "node-m") else "node-m"
    everyone = [m, x, *obs]
    for own in everyone:
        peers = tuple(p for p in everyone if p is not own)
        d = decide(ElectionView(own, peers, masterless_for=0.0), settle=SETTINGS.failover_settle)
        assert (d.follow, d.term, d.claim) == (winner, term, False)
        # order of the peers does not matter
        assert decide(ElectionView(own, peers[::-1], 0.0), settle=SETTINGS.failover_settle) == d


def test_two_same_term_masters_meet_and_settle_on_one():
    """Same-term claims with the loop: {X, B} and {Y, D} were cut off and both X and Y claimed term 5
    (Y has the higher priority). At t=3 s the sides meet: within one heartbeat interval
    every node follows Y at term 5, X stepped down, and nobody claimed again (a claim would
    have raised the term)."""
    nodes = [SimNode("x", 5, "x"), SimNode("b", 5, "x"), SimNode("y", 5, "y", priority=1), SimNode("d", 5, "y")]
    side = {"x": 0, "b": 0, "y": 1, "d": 1}
    sim = Sim(nodes, link=lambda s, r, t: 0.01 if side[s] == side[r] or t >= 3.0 - 1e-9 else None)
    sim.seed([["x", "b"], ["y", "d"]])
    sim.run(2.9)
    assert sim.view() == {("x", 5), ("y", 5)}
    sim.run(3.0 + SETTINGS.heartbeat_interval + 0.2)
    assert sim.view() == {("y", 5)}
    sim.run(10.0)
    assert sim.view() == {("y", 5)}
    assert all(not n.claims_at for n in nodes)
    assert all(master_changes(n, "xy"[side[n.node_id]]) <= 1 for n in nodes)
    assert [m for _, m, _ in nodes[0].history] == ["y"]  # X stepped down once, straight to Y


@given(stale=st.integers(0, 8), gap=st.integers(1, 5), follows=st.sampled_from([None, "node-old", "node-s"]))
def test_stale_node_adopts_the_live_masters_term(stale, gap, follows):
    """Stale terms, "stale-clock messages get a reply carrying the current term": in this design
    the reply is the live master's heartbeat. A node whose term is stale (following nobody, a
    gone master, or itself as a stale master) that hears a claim at a higher term follows it
    with that term."""
    own = hb("node-s", stale, follows)
    live = claim("node-m", stale + gap, priority=-5)  # a low priority does not matter
    d = decide(ElectionView(own, (live, hb("node-o", stale + gap, "node-m")), 0.0), settle=SETTINGS.settle)
    assert (d.follow, d.term, d.claim) == ("node-m", stale + gap, False)


def test_stale_node_joining_takes_the_current_term_in_the_loop():
    """The same through the loop: E (term 1, just started, ``known_settle`` because its State
    lists others) joins A (master at term 6) and B. Within one heartbeat E follows A and its
    own heartbeat carries term 6; nobody claims."""
    a, b = SimNode("a", 6, "a"), SimNode("b", 6, "a")
    e = SimNode("e", 1, None, priority=9, last_idx=99, started_at=0.0, start_settle=SETTINGS.known_settle,
                masterless_since=0.0)
    sim = Sim([a, b, e])
    sim.seed([["a", "b"]])
    sim.run(0.7)
    assert e.heartbeat().term == 6 and e.master == "a"
    assert not any(n.claims_at for n in (a, b, e))


# --- election determinism (rule 2) ---------------------------------------------------------------
@st.composite
def heartbeat_sets(draw, with_claims: bool | None = None) -> list[Heartbeat]:  # type: ignore[no-untyped-def]
    ids = draw(st.lists(st.text("abxyz019-", min_size=1, max_size=5), min_size=1, max_size=6, unique=True))
    out = []
    for n in ids:
        master = draw(st.one_of(st.none(), st.sampled_from(ids)))
        if with_claims is False and master == n:
            master = None
        out.append(hb(n, draw(st.integers(0, 7)), master, draw(st.integers(-2, 2)), draw(st.integers(0, 30)),
                      draw(st.integers(0, 7)), boot=draw(st.sampled_from(["b1", "b2"]))))
    if with_claims and not any(h.master == h.node_id for h in out):
        i = draw(st.integers(0, len(out) - 1))
        out[i] = msgspec.structs.replace(out[i], master=out[i].node_id)
    return out


def _views(hbs: list[Heartbeat], masterless_for: float, rotate: int) -> list[ElectionView]:
    """Each node's view of the same set of heartbeats (peers in a node-specific order)."""
    views = []
    for i, own in enumerate(hbs):
        peers = [p for p in hbs if p is not own]
        k = (rotate + i) % max(1, len(peers))
        views.append(ElectionView(own, tuple(peers[k:] + peers[:k]), masterless_for))
    return views


@settings(max_examples=200, deadline=None)
@given(hbs=heartbeat_sets(), masterless_for=st.floats(0, 10), settle=st.floats(0.1, 5), rotate=st.integers(0, 5))
def test_every_node_holding_the_same_heartbeats_decides_alike(hbs, masterless_for, settle, rotate):
    """For any set of heartbeats, every node holding that set agrees on whom to follow:
    with live claims, all follow the claim with the highest (side, committed, term,
    priority, node_id) at its term (side: how many held heartbeats follow it); without, nobody acts before ``settle`` s of masterlessness, and after it exactly one
    node (the highest (priority, last_idx, node_id)) claims, with a term above every term
    heard, while the others wait for its claim."""
    decisions = [decide(v, settle=settle) for v in _views(hbs, masterless_for, rotate)]
    claims = [h for h in hbs if h.master == h.node_id]
    if claims:
        def side(h: Heartbeat) -> int:
            return sum(x.master == h.node_id for x in hbs)

        best = max(claims, key=lambda h: (side(h), min(h.commit_idx, h.last_idx), h.term, h.priority, h.node_id))
        assert all((d.follow, d.term, d.claim) == (best.node_id, best.term, False) for d in decisions)
        assert master_rank(best, side(best)) == max(master_rank(c, side(c)) for c in claims)
        return
    if masterless_for < settle:
        assert all(d.follow is None and not d.claim for d in decisions)
        return
    claimants = [h for h, d in zip(hbs, decisions) if d.claim]
    assert len(claimants) == 1
    (winner,) = claimants
    assert (winner.priority, winner.last_idx, winner.node_id) == max((h.priority, h.last_idx, h.node_id) for h in hbs)
    assert candidate_rank(winner) == max(map(candidate_rank, hbs))
    d_win = decisions[hbs.index(winner)]
    assert d_win.follow == winner.node_id and all(d_win.term > h.term for h in hbs)
    assert all(d.follow is None and not d.claim for h, d in zip(hbs, decisions) if h is not winner)


@settings(max_examples=100, deadline=None)
@given(hbs=heartbeat_sets(with_claims=False), settle=st.floats(0.1, 5), frac=st.floats(0, 0.999))
def test_no_node_claims_before_settle(hbs, settle, frac):
    """Rule 2: with no live claim, no node claims while it has been masterless for less
    than ``settle`` seconds, whatever it holds."""
    for v in _views(hbs, settle * frac, 0):
        assert not decide(v, settle=settle).claim


def test_settle_after_start_and_after_a_loss_in_the_loop():
    """The loop's settle: a fresh cluster (nobody master, started at t=0) elects no earlier
    than ``settle``; a node whose State lists others waits ``known_settle``; after the master
    is lost, the others elect ``failover_settle`` after timing it out. In each case exactly
    one node claims."""
    fresh = [SimNode(n, started_at=0.0, masterless_since=0.0) for n in ("a", "b", "c")]
    sim = Sim(fresh)
    sim.run(10.0)
    assert [n.node_id for n in fresh if n.claims_at] == ["c"]
    assert SETTINGS.settle <= fresh[2].claims_at[0] <= SETTINGS.settle + 0.2
    assert sim.view() == {("c", 1)}

    known = [SimNode(n, started_at=0.0, masterless_since=0.0, start_settle=SETTINGS.known_settle) for n in ("a", "b")]
    sim = Sim(known)
    sim.run(10.0)
    assert SETTINGS.known_settle <= known[1].claims_at[0] <= SETTINGS.known_settle + 0.2

    sim = _three_following_a()
    sim.link = lambda s, r, t: None if "a" in (s, r) and t >= 1.0 else 0.01  # A dies at 1 s
    sim.run(12.0)
    gone_at = 0.6 + TIMEOUT  # last heartbeat of A delivered at 0.6 s
    assert [n.node_id for n in sim.nodes.values() if n.claims_at] == ["c"]
    assert gone_at + SETTINGS.failover_settle - 1e-9 <= sim.nodes["c"].claims_at[0] <= gone_at + SETTINGS.failover_settle + 0.2


# --- the real election loop, under trio's MockClock ---------------------------------------------
async def _noop(*_a):  # type: ignore[no-untyped-def]
    return None


def _drive_member(tmp_path: Path, feed: Callable[[int], Heartbeat | None], seconds: float,
                  offset: float = 1000.0) -> ClusterMember:
    """Run the election loop (``RoleKeeper.run``) of node-b alone (no network) for ``seconds`` of
    MockClock time (its clock reads MockClock time + ``offset`` s), feeding it ``feed(k)``
    (A's heartbeat, None: silent) every 0.5 s."""

    async def main() -> ClusterMember:
        replica = Replica(tmp_path / "events.log", sync=False)
        hooks = MasterHooks(start=_noop, stop=_noop, accept_local=_noop, command=_noop, emit=_noop)  # type: ignore[arg-type]
        clock = lambda: trio.current_time() + offset  # noqa: E731
        member = ClusterMember(None, replica, "node-b", "boot-b", hooks, clock=clock)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.roles.run)
            for k in range(int(seconds / 0.5)):
                if (h := feed(k)) is not None:
                    member.liveness.heard(h, clock())
                await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        replica.close()
        return member

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_member_loop_follows_then_elects_after_the_master_goes_silent(tmp_path):
    """Control for the harness below: B follows A's claim (term 3); A goes silent at 2 s;
    B times it out after ``peer_timeout`` and, alone, claims term 4 after ``failover_settle``."""
    m = _drive_member(tmp_path, lambda k: claim("node-a", 3) if k < 4 else None, 12.0)
    assert m.is_master and m.master == "node-b" and m.term == 4


def test_member_stops_following_a_peer_that_no_longer_claims(tmp_path):
    """A late message, a variant: B follows A because A's (possibly stale, late) term-3 claim
    is the only live claim; A's following heartbeats say it is masterless (A stepped down for
    a master that then died, or A restarted within ``disconnect_grace``). A itself waits for
    B, the rule-2 winner of {A, B} (asserted below). Expected: B stops following A and, after
    ``failover_settle``, claims. (Before the fix B followed A forever: master_alive checked
    presence only, and the cluster had no master.)"""
    a_after = hb("node-a", 3, None)
    # A's own view: it waits for B (B ranks higher), so only B can end the deadlock
    d_a = decide(ElectionView(a_after, (hb("node-b", 3, "node-a"),), masterless_for=60.0), settle=SETTINGS.failover_settle)
    assert d_a == election_module.ElectionDecision()
    m = _drive_member(tmp_path, lambda k: claim("node-a", 3) if k < 2 else a_after, 15.0)
    assert m.is_master or m.master != "node-a"


def test_member_fresh_node_elects_when_its_clock_starts_at_zero(tmp_path):
    """A fresh node alone (MockClock starts at 0.0) claims term 1 after ``settle`` (before the
    fix its masterless-since time 0.0 read as unset and it never elected; harmless with
    time.monotonic, fatal for any simulated clock that starts at zero)."""
    m = _drive_member(tmp_path, lambda k: None, 3 * SETTINGS.settle, offset=0.0)
    assert m.is_master and m.term == 1


def test_member_fresh_node_alone_elects_after_settle(tmp_path):
    """Control for the test above: the same node with a clock that does not start at 0.0
    claims term 1 (alone, after ``settle``)."""
    m = _drive_member(tmp_path, lambda k: None, 3 * SETTINGS.settle)
    assert m.is_master and m.term == 1


# --- liveness by the receiver's monotonic clock ---------------------------------------------
def test_heartbeat_carries_no_time():
    """Heartbeats have nothing time-related: only ids, terms, priority, indices and the log's
    chain digest (ints, strings, bytes), so no receiver can ever compare a sender's wall
    clock; its encoding does not depend on the wall clock."""
    fields = msgspec.structs.fields(Heartbeat)
    allowed = {int, str, str | None, bytes}
    assert all(f.type in allowed for f in fields), [(f.name, f.type) for f in fields]
    assert not [f.name for f in fields if any(w in f.name for w in ("time", "clock", "stamp", "wall", "_at", "date"))]
    h = claim("node-a", 3, last_idx=7)
    with mock.patch("time.time", return_value=0.0):
        early = encode(h)
    with mock.patch("time.time", return_value=time.time() + 86400 * 365):
        late = encode(hb("node-a", 3, "node-a", last_idx=7))
    assert early == late


def test_liveness_and_election_read_no_wall_clock():
    """liveness.py and election.py import no clock at all (``now`` is injected)."""
    for mod in (liveness_module, election_module):
        assert not {"time", "datetime"} & _imported_modules(Path(mod.__file__).read_text())


@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.floats(0.01, 2 * TIMEOUT), min_size=1, max_size=30),
    probes=st.lists(st.floats(0, 80), max_size=30),
)
def test_peer_alive_exactly_while_its_last_heartbeat_is_younger_than_timeout(gaps, probes):
    """At any receiver time ``now``, a peer is alive iff ``now - last arrival <
    peer_timeout``, and ``gone`` lists exactly the others; contents of the heartbeats are
    identical throughout (nothing new in them, no time in them). No wall clock is read."""
    arrivals = list(itertools.accumulate(gaps))
    h = hb("node-c", 2, "node-a", last_idx=5)
    with mock.patch("time.time", no_wall_clock), mock.patch("time.time_ns", no_wall_clock):
        for now in sorted([*probes, *arrivals, *(t + TIMEOUT for t in arrivals), *(t + TIMEOUT - 1e-6 for t in arrivals)]):
            live = Liveness(TIMEOUT)
            last = None
            for t in arrivals:
                if t <= now:
                    live.heard(h, t)
                    last = t
            expect_alive = last is not None and now - last < TIMEOUT
            assert (live.alive(now) == [h]) == expect_alive
            assert live.gone(now) == (["node-c"] if last is not None and not expect_alive else [])


def test_slow_profile_with_steady_heartbeats_never_times_out():
    """Over 120 s C sends the same heartbeat every 0.5 s (plus jitter up to
    1.5 s) while its profile updates (which Liveness never sees) come 35 s apart; its wall
    clock jumps +10 min, then -10 min: a receiver checking every 0.1 s never sees it gone."""
    live = Liveness(TIMEOUT)
    h = hb("node-c", 1, "node-a")
    jitter = itertools.cycle([0.5, 0.5, 2.0, 0.5, 1.3])
    next_beat, next_profile, profiles = 0.0, 0.0, 0
    wall = iter(itertools.chain([time.time() + 600] * 600, itertools.repeat(time.time() - 600)))
    with mock.patch("time.time", lambda: next(wall)):
        for k in range(1201):
            now = k * 0.1
            if now >= next_profile:  # a 35 s profile: nothing reaches liveness
                profiles, next_profile = profiles + 1, now + 35.0
            if now >= next_beat - 1e-9:
                live.heard(h, now)
                next_beat = now + next(jitter)
            assert live.alive(now) == [h] and live.gone(now) == [], now
    assert profiles == 4


@settings(max_examples=100, deadline=None)
@given(
    last=st.floats(0, 100),
    check=st.sampled_from([0.1, 0.5, SETTINGS.heartbeat_interval, 1.0]),
    phase=st.floats(0, 1),
)
def test_silent_peer_is_gone_within_timeout_plus_one_check(last, check, phase):
    """A peer whose heartbeats stop at ``last`` is first seen gone by a checker
    polling every ``check`` s at a time in [last + peer_timeout, last + peer_timeout + check]:
    never earlier, never later."""
    live = Liveness(TIMEOUT)
    live.heard(hb("node-c"), last)
    first_gone = None
    for k in range(int((TIMEOUT + 2 * check) / check) + 2):
        now = last + phase * check + k * check
        if live.gone(now):
            first_gone = now
            break
        assert live.alive(now)
    assert first_gone is not None
    assert TIMEOUT <= first_gone - last <= TIMEOUT + check + 1e-9


def test_heard_reports_new_returning_and_restarted_peers():
    """``heard`` is True for a new peer, one back after a timeout, one with a new boot id
    (a restart), and False for a peer that kept beating."""
    live = Liveness(TIMEOUT)
    assert live.heard(hb("node-c"), 0.0)
    assert not live.heard(hb("node-c"), 0.5)
    assert not live.heard(hb("node-c"), 0.5 + TIMEOUT - 0.01)
    assert live.heard(hb("node-c"), 0.5 + 2 * TIMEOUT)
    assert live.heard(hb("node-c", boot="boot-2"), 0.6 + 2 * TIMEOUT)
    live.forget("node-c")
    assert live.get("node-c") is None and live.last_heard("node-c") is None


# --- replay does not depend on the wall clock -------------------------------------------------
def _replay(evs: list[IndexedEvent]) -> State:
    state = State()
    for e in evs:
        state = apply(state, e)
    return state


@settings(max_examples=50, deadline=None)
@given(st.lists(events, max_size=40))
def test_replay_hash_is_the_same_with_the_wall_clock_a_day_ahead(evs):
    """Replaying a recorded log (the same indexed events, as decoded from disk) with
    ``time.time`` a day ahead gives the same State hash; the log's bytes do not change."""
    log = index(evs)
    recorded = msgspec.msgpack.encode(log)
    original = state_hash(_replay(log))
    ahead = time.time() + 86400
    with mock.patch("time.time", return_value=ahead), mock.patch("time.time_ns", return_value=int(ahead * 1e9)):
        replayed = msgspec.msgpack.decode(recorded, type=list[IndexedEvent])
        assert state_hash(_replay(replayed)) == original
        assert msgspec.msgpack.encode(replayed) == recorded


def _imported_modules(source: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_state_modules_read_no_clock():
    """No module of exo_p2p/state imports ``time`` or ``datetime`` (so none calls
    time.time, time.monotonic or datetime.now)."""
    files = sorted(STATE_DIR.glob("*.py"))
    assert len(files) >= 4
    for f in files:
        text = f.read_text()
        assert not {"time", "datetime"} & _imported_modules(text), f.name
        assert "time.time" not in text and "datetime" not in text, f.name


def test_state_and_events_hold_no_wall_clock_field():
    """No field of State or of any event is a date/time type, and no float field has a
    time-like name (docs/architecture.md#log-guarantees: no wall-clock fields in State)."""
    seen: set[int] = set()
    bad: list[str] = []

    def walk(t: mi.Type, where: str) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        if isinstance(t, (mi.DateTimeType, mi.DateType, mi.TimeType, mi.TimeDeltaType)):
            bad.append(where)
        elif isinstance(t, (mi.StructType, mi.DataclassType)):
            for f in t.fields:
                if isinstance(f.type, mi.FloatType) and any(w in f.name for w in ("time", "clock", "stamp", "_at", "when")):
                    bad.append(f"{where}.{f.name}")
                walk(f.type, f"{where}.{f.name}")
        elif isinstance(t, mi.UnionType):
            for u in t.types:
                walk(u, where)
        elif isinstance(t, (mi.ListType, mi.TupleType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
            for u in getattr(t, "item_types", None) or (t.item_type,):
                walk(u, where)
        elif isinstance(t, mi.DictType):
            walk(t.key_type, where)
            walk(t.value_type, where)

    for i, t in enumerate(mi.multi_type_info([State, Event, IndexedEvent])):
        walk(t, ["State", "Event", "IndexedEvent"][i])
    assert len(seen) > 20  # the walk did reach the nested types
    assert bad == []


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(6))))
def test_a_replayed_older_heartbeat_never_turns_a_peers_view_back(order: list[int]) -> None:
    """GossipSub replays recent messages to a peer that just joined, so a master's heartbeat
    from before it was master can arrive after a newer one: in any arrival order the peer's
    view is the latest heartbeat its sender made (``seq``) of its current boot, and a new
    boot always replaces the old one's (a joining node used to drop its master for a pass)."""
    made = [Heartbeat(node_id="m", boot_id="b1", term=0 if k < 2 else 1, master=None if k < 2 else "m",
                      priority=0, last_idx=k, last_term=0, seq=k + 1) for k in range(6)]
    live = Liveness(timeout=5.0)
    for t, k in enumerate(order):
        live.heard(made[k], now=float(t) * 0.1)
    assert live.get("m") == made[5]
    restarted = Heartbeat(node_id="m", boot_id="b2", term=0, master=None, priority=0, last_idx=0, last_term=0, seq=1)
    live.heard(restarted, now=1.0)
    assert live.get("m") == restarted
