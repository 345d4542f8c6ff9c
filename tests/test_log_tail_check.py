"""A follower never appends a master's events to a tail that master's log does not hold
(docs/architecture.md#log-guarantees, ``exo_p2p.cluster.log_sync``).

The defect this guards against, seen on a loaded 2-node cluster: node A followed B (term 1)
and had checked its tail; B's heartbeats starved, A claimed term 2 and sequenced events
124..137 of its own while B went on sequencing 124..137 of term 1; A then stepped back down
to B (the majority's master keeps its lower term), still marked "tail checked" from its first
time under B, so B's next gossip (138, term 1) was applied on top of A's term-2 tail and the
two logs diverged from 124 for good. Here the same history runs in process, on real
``Replica``s and ``LogFollower``s, with gossip and fetches delivered by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from exo_p2p.cluster.common import Counters, Role
from exo_p2p.cluster.log_sync import LogFollower, log_answer
from exo_p2p.cluster.messages import IndexedEventBatch, encode, log_request_decoder
from exo_p2p.cluster.settings import ClusterSettings
from exo_p2p.replica import Replica
from exo_p2p.types import IndexedEvent, TaskDeleted

pytestmark = pytest.mark.unit

NODES = "ab"
"""Two nodes are enough for every history of claims and step-downs (and find one fast)."""


class _Net:
    """Log requests answered at once from the named node's replica (no sockets)."""

    def __init__(self, replicas: dict[str, Replica]) -> None:
        self.replicas = replicas

    async def request(self, peer: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        return encode(log_answer(self.replicas[peer], log_request_decoder.decode(data)))


class _Peers:
    liveness: dict = {}

    def live_peers(self) -> list:
        return []


class _Node:
    """One node: its replica, role and log follower."""

    def __init__(self, name: str, root: Path, replicas: dict[str, Replica]) -> None:
        self.name = name
        self.replica = Replica(root / name / "events.log", sync=False)
        replicas[name] = self.replica
        self.role = Role(name)
        self.follower = LogFollower(_Net(replicas), self.replica, self.role, _Peers(), ClusterSettings(), Counters(), _Times())

    def follow(self, master: str, term: int) -> None:
        """What ``RoleKeeper.set_master`` does to the role, then tells the follower."""
        self.role.is_master, self.role.master, self.role.term = False, master, term
        self.follower.master_changed(master)

    def claim(self, term: int) -> None:
        """What ``RoleKeeper.claim`` does to the role, then tells the follower."""
        self.role.is_master, self.role.master, self.role.term = True, self.name, term
        self.follower.master_changed(self.name)

    def sequence(self, n: int) -> list[IndexedEvent]:
        """As master: index ``n`` events of this term (distinct per node and index)."""
        start = self.replica.last_idx + 1
        events = [IndexedEvent(self.role.term, i, TaskDeleted(f"{self.name}-{self.role.term}-{i}")) for i in range(start, start + n)]
        self.replica.offer_many(events)
        return events

    def gossip(self, sender: str, events: list[IndexedEvent]) -> None:
        self.follower.take_gossip(sender, encode(IndexedEventBatch(tuple(events))))

    def fetch(self) -> bool:
        return trio.run(self.follower.fetch_from, self.role.master)


class _Times:
    def received(self, _idx: int) -> None:
        pass


def _agrees(follower: Replica, master: Replica) -> bool:
    """Whether ``follower``'s log is a prefix of ``master``'s (equal chain digests at its last index)."""
    last = follower.last_idx
    return last <= master.last_idx and follower.chain_at(last) == master.chain_at(last)


def _following(tmp_path: Path) -> tuple[_Node, _Node]:
    """Nodes ``a`` and ``b``: ``b`` master of term 1, ``a`` following it (nothing fetched yet)."""
    replicas: dict[str, Replica] = {}
    a, b = _Node("a", tmp_path, replicas), _Node("b", tmp_path, replicas)
    b.claim(1)
    a.follow("b", 1)
    return a, b


def test_a_master_that_stepped_down_does_not_append_the_winners_gossip_to_its_own_tail(tmp_path: Path):
    a, b = _following(tmp_path)
    a.gossip("b", b.sequence(3))
    assert a.fetch() and _agrees(a.replica, b.replica)  # a's tail checked under (b, term 1)

    a.claim(2)  # b's heartbeats starved: a claims term 2 ...
    a.sequence(2)  # ... and sequences 4..5 of its own
    b.sequence(2)  # b, still master of term 1, sequences 4..5 too
    dropped = a.follower.counters.get("global_event_unchecked", 0)
    a.follow("b", 1)  # a meets b again and steps down to it (followers take the master's term)
    a.gossip("b", b.sequence(1))  # b's next event, 6, reaches a by gossip before any fetch

    assert a.replica.last_idx == 5 and a.replica.last_term == 2, "a appended b's event 6 to its own term-2 tail 4..5"
    assert a.follower.counters.get("global_event_unchecked") == dropped + 1 and not a.follower.tail_checked()
    assert a.fetch() and a.replica.last_idx == 6 and _agrees(a.replica, b.replica)
    assert a.replica.hash() == b.replica.hash()


def test_gossip_is_taken_again_once_the_tail_is_checked(tmp_path: Path):
    """The check costs one fetch per change of master, not the gossip path itself."""
    a, b = _following(tmp_path)
    a.gossip("b", b.sequence(2))
    assert a.replica.last_idx == 0 and a.follower.counters.get("global_event_unchecked") == 1
    assert a.fetch() and a.replica.last_idx == 2
    a.gossip("b", b.sequence(3))
    assert a.replica.last_idx == 5 and _agrees(a.replica, b.replica)


class Elections(RuleBasedStateMachine):
    """Two nodes under claims without votes (any node may claim a term at any time, as a
    node whose master's heartbeats starve does), step-downs, gossip delivered or lost and
    fetches. Invariant: a follower's log that took gossip or a fetch from its master since it
    last changed master is a prefix of that master's log."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._dir = tempfile.TemporaryDirectory(prefix="exo-tail-")
        self.replicas: dict[str, Replica] = {}
        self.nodes = {n: _Node(n, Path(self._dir.name), self.replicas) for n in NODES}
        self.term = 0
        self.sent: dict[str, list[IndexedEvent]] = {n: [] for n in NODES}

    @initialize()
    def formed(self) -> None:
        """A formed cluster: ``a`` master of term 1, ``b`` following it with its tail checked."""
        self.claim("a")
        self.nodes["b"].follow("a", 1)
        assert self.nodes["b"].fetch()

    def teardown(self) -> None:
        for r in self.replicas.values():
            r.close()
        self._dir.cleanup()

    def masters(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.role.is_master]

    @rule(node=st.sampled_from(NODES))
    def claim(self, node: str) -> None:
        self.term += 1
        self.nodes[node].claim(max(self.term, self.nodes[node].replica.state.term + 1))
        self.term = self.nodes[node].role.term
        self.sent[node] = self.nodes[node].sequence(1)  # a new master's first event (``MasterElected``)

    @precondition(lambda self: self.masters())
    @rule(data=st.data(), n=st.integers(1, 3))
    def sequence(self, data, n: int) -> None:
        m = data.draw(st.sampled_from(self.masters()))
        self.sent[m] = self.nodes[m].sequence(n)

    @precondition(lambda self: self.masters())
    @rule(data=st.data(), node=st.sampled_from(NODES))
    def follow(self, data, node: str) -> None:
        m = data.draw(st.sampled_from(self.masters()))
        if m != node:
            self.nodes[node].follow(m, self.nodes[m].role.term)

    @rule(node=st.sampled_from(NODES))
    def gossip(self, node: str) -> None:
        n = self.nodes[node]
        if n.role.master and not n.role.is_master and self.sent[n.role.master]:
            n.gossip(n.role.master, self.sent[n.role.master])

    @rule(node=st.sampled_from(NODES))
    def fetch(self, node: str) -> None:
        n = self.nodes[node]
        if n.role.master and not n.role.is_master:
            assert n.fetch()
            assert _agrees(n.replica, self.replicas[n.role.master])

    @invariant()
    def followers_hold_a_prefix_of_their_masters_log(self) -> None:
        for n in self.nodes.values():
            if n.role.master and not n.role.is_master and n.follower.tail_checked():
                assert _agrees(n.replica, self.replicas[n.role.master]), f"{n.name}'s log diverged from {n.role.master}'s"


Elections.TestCase.settings = settings(max_examples=300, stateful_step_count=20, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow], database=None)
test_elections_never_leave_a_follower_on_a_diverged_tail = Elections.TestCase
