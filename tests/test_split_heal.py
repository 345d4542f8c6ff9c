"""A split always heals: two or more live, mutually reachable nodes end with one master within a
bound, whatever their terms and logs (``exo_p2p.cluster.election`` rule 4 beside the claim
admission of ``exo_p2p.cluster.claims``). Pure: the model of tests/support/rules/split_model.py drives the
real rule functions; no process, no socket.

The field case: a 2-node cluster stayed split for 12 minutes, A master at term 7 (log 795),
B master at term 4 (log 753), logs diverged. B refused A's claim (diverged, term more than
one above B's: the defence against forged terms); A admitted B's but outranked it (more
committed events). Neither yielded. Rule 4: a master that outranks an admitted rival which
keeps claiming for ``RIVAL_YIELD_AFTER`` s yields to it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exo_p2p import defaults
from exo_p2p.cluster.election import Seat, election_step
from tests.support.rules.split_model import DT, Fault, Model, ModelNode
from tests.support.rules.election_sim import claim, hb

YIELD_BOUND = defaults.CLAIM_PROBE_TIMEOUT + defaults.RIVAL_YIELD_AFTER + 1.0
"""Seconds two live masters that meet take to become one at most: the slower side's probe
of the other's claim, then rule 4's wait (13 s), then a tick and a heartbeat (1 s slack)."""

HEAL_BOUND = (2 * defaults.PEER_TIMEOUT + defaults.KNOWN_SETTLE + defaults.CLAIM_RECHECK_AFTER
              + defaults.CLAIM_PROBE_TIMEOUT + defaults.RIVAL_YIELD_AFTER + 2.0)
"""Seconds after the last fault until one master at most, whatever happened before: a peer
seen during the faults is forgotten within ``2 × PEER_TIMEOUT`` (one timeout, plus at most
one of grace for its own or this node's loop lag, ``liveness.silence``); a node restarted last waits
``KNOWN_SETTLE``; a refusal made during the faults (no answer) is re-checked after
``CLAIM_RECHECK_AFTER``, with a probe of up to ``CLAIM_PROBE_TIMEOUT``; then rule 4
(``RIVAL_YIELD_AFTER``); 2 s slack for ticks and heartbeats. 38 s with the defaults."""


def _split_pair() -> Model:
    """The field case, scaled down: a shared prefix of 20 events, then A alone to term 7 with
    more events, B alone at term 4; both masters, both live, terms 3 apart."""
    shared = [(1, "a", 0)] + [(1, "a", i) for i in range(1, 20)]
    a = ModelNode("a", log=shared + [(5, "a", 0), (6, "a", 0), (7, "a", 0)] + [(7, "a", i) for i in range(40)],
                  master="a", term=7, masterless_since=None, followed=True)
    b = ModelNode("b", log=shared + [(4, "b", 0)] + [(4, "b", i) for i in range(5)],
                  master="b", term=4, masterless_since=None, followed=True)
    for n in (a, b):
        n.started_at = -100.0
    return Model([a, b])


def _single_master_from(model: Model, t0: float, until: float) -> float | None:
    """Run to ``until``; the first time from which one master was followed by all, without a
    break, to the end (None: never)."""
    since = None
    while model.now <= until:
        model.run(model.now)
        if model.one_master() is None:
            since = None
        elif since is None:
            since = model.now
    return None if since is None else since - t0


def test_the_field_split_heals_within_the_bound():
    model = _split_pair()
    took = _single_master_from(model, 0.0, 60.0)
    assert took is not None and took <= YIELD_BOUND, took
    # A, which admitted B's claim, yielded; B (which refused A: term 7 > 4 + 1) kept its seat
    assert model.one_master() == "b"
    assert [h for h in model.history if h[1] == "b"] == []  # B never changed seat


def test_without_rule_4_the_field_split_never_heals(monkeypatch):
    """The same two nodes with the rival wait set to forever: still two masters after a
    minute (the test above can fail)."""
    import exo_p2p.cluster.election as election

    monkeypatch.setattr(election.defaults, "RIVAL_YIELD_AFTER", float("inf"))
    monkeypatch.setattr(election.election_step, "__kwdefaults__", {"yield_after": float("inf")})
    model = _split_pair()
    model.run(60.0)
    assert model.masters() == {"a", "b"}


def test_a_master_never_yields_a_bigger_side_nor_to_a_refused_claim():
    """Rule 4 pure: A leads B and C; a rival X with side 1 claims for a minute: A keeps its
    seat. A lone master outranking X yields after ``RIVAL_YIELD_AFTER``, not before; a
    refused claim (not in ``peers``) is never yielded to."""
    a = claim("a", 3, last_idx=30, commit_idx=30)
    x = claim("x", 9, last_idx=10, commit_idx=10)
    followers = [hb("b", 3, "a"), hb("c", 3, "a")]
    seat = Seat("a", 3, None)
    for t in range(0, 60):
        step = election_step(seat, a, [x, *followers], (), float(t), settle=0.5)
        assert step.follow is None and not step.yielded
        seat = step.seat
    seat = Seat("a", 3, None)
    lone = election_step(seat, a, [x], (), 0.0, settle=0.5)
    assert lone.follow is None and lone.seat.rival_since == 0.0
    early = election_step(lone.seat, a, [x], (), defaults.RIVAL_YIELD_AFTER - DT, settle=0.5)
    assert early.follow is None
    late = election_step(early.seat, a, [x], (), defaults.RIVAL_YIELD_AFTER, settle=0.5)
    assert late.yielded and late.follow == "x" and late.term == 9
    # the rival went quiet for a pass: the wait starts again
    gap = election_step(early.seat, a, [], (), defaults.RIVAL_YIELD_AFTER - DT / 2, settle=0.5)
    assert gap.seat.rival_since is None
    refused_only = election_step(Seat("a", 3, None, rival_since=0.0), a, [], (), 100.0, settle=0.5)
    assert refused_only.follow is None and not refused_only.yielded


@st.composite
def fault_plans(draw, names: list[str]) -> list[Fault]:  # type: ignore[no-untyped-def]
    """Up to 6 faults in the first 40 s: restarts (down 0.5-8 s), loop lags (0.5-8 s, the
    field case had 3.5 s) and cuts of a group from the rest (1-20 s)."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["restart", "lag", "cut"]))
        at = draw(st.integers(0, 400)) / 10
        if kind == "cut":
            group = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names) - 1, unique=True))
            out.append(Fault(kind, tuple(sorted(group)), at, draw(st.integers(10, 200)) / 10))
        else:
            out.append(Fault(kind, (draw(st.sampled_from(names)),), at, draw(st.integers(5, 80)) / 10))
    return out


@st.composite
def split_starts(draw, names: list[str]) -> list[ModelNode]:  # type: ignore[no-untyped-def]
    """Nodes that were split before: a shared prefix, then each node's own tail (0-40
    events) after a claim of its own at a term drawn from 1-12 (so terms 2+ apart are
    common); each is master of itself or has no master. Running for a long time already."""
    shared = [(1, names[0], 0)] + [(1, names[0], i) for i in range(1, draw(st.integers(1, 20)))]
    out = []
    for x in names:
        term = draw(st.integers(1, 12))
        tail = [(term, x, 0)] + [(term, x, i) for i in range(draw(st.integers(0, 40)))] if term > 1 else []
        lead = draw(st.booleans())
        node = ModelNode(x, log=shared + tail, master=x if lead else None, term=term if lead else shared[-1][0],
                         masterless_since=None if lead else 0.0, followed=lead)
        node.started_at = -100.0
        out.append(node)
    return out


def _heals(n: int, faults: list[Fault], nodes: list[ModelNode] | None = None) -> None:
    names = [chr(ord("a") + i) for i in range(n)]
    model = Model(nodes or [ModelNode(x) for x in names], faults)
    end = max(f.end for f in faults)
    model.run(end + HEAL_BOUND)
    leader = model.one_master()
    assert leader is not None, (model.masters(), {k: (v.master, v.term) for k, v in model.nodes.items()})
    terms = {v.term for v in model.nodes.values()}
    model.run(end + HEAL_BOUND + 10.0)  # and it stays so
    assert model.one_master() == leader and {v.term for v in model.nodes.values()} == terms


@settings(max_examples=60)
@given(st.data())
def test_two_nodes_always_end_with_one_master_after_any_faults(data):
    names = ["a", "b"]
    start = data.draw(st.one_of(st.none(), split_starts(names)))
    _heals(2, data.draw(fault_plans(names)), start)


@settings(max_examples=40)
@given(st.data())
def test_three_nodes_always_end_with_one_master_after_any_faults(data):
    names = ["a", "b", "c"]
    start = data.draw(st.one_of(st.none(), split_starts(names)))
    _heals(3, data.draw(fault_plans(names)), start)


@settings(max_examples=25)
@given(st.data())
def test_five_nodes_always_end_with_one_master_after_any_faults(data):
    names = ["a", "b", "c", "d", "e"]
    start = data.draw(st.one_of(st.none(), split_starts(names)))
    _heals(5, data.draw(fault_plans(names)), start)
