"""A simulated cluster of election rules: nodes, heartbeats and claims in discrete time."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from exo_p2p.cluster.election import Seat, election_step, settle_for
from exo_p2p.cluster.liveness import Liveness
from exo_p2p.cluster.member import ClusterSettings
from exo_p2p.cluster.messages import Heartbeat


SETTINGS = ClusterSettings()
TIMEOUT = SETTINGS.peer_timeout


def hb(node: str, term: int = 0, master: str | None = None, priority: int = 0, last_idx: int = 0,
       last_term: int = 0, boot: str = "boot-1", commit_idx: int = 0, chain: bytes = b"") -> Heartbeat:
    return Heartbeat(node_id=node, boot_id=boot, term=term, master=master, priority=priority,
                     last_idx=last_idx, last_term=last_term, commit_idx=commit_idx, chain=chain)


def claim(node: str, term: int, **kw) -> Heartbeat:  # type: ignore[no-untyped-def]
    return hb(node, term, master=node, **kw)


# --- a small simulator of the election loop ------------------------------------------------------
@dataclass
class SimNode:
    """One node's election state, stepped by ``election_step`` as ``role.RoleKeeper`` does."""

    node_id: str
    term: int = 0
    master: str | None = None
    priority: int = 0
    last_idx: int = 0
    started_at: float = -1000.0
    start_settle: float = SETTINGS.settle
    liveness: Liveness = field(default_factory=lambda: Liveness(TIMEOUT))
    masterless_since: float | None = None
    history: list[tuple[float, str | None, int]] = field(default_factory=list)
    claims_at: list[float] = field(default_factory=list)

    def heartbeat(self) -> Heartbeat:
        return hb(self.node_id, self.term, self.master, self.priority, self.last_idx)

    def _set(self, master: str | None, term: int, now: float) -> None:
        # a follower takes its master's term (``role.RoleKeeper.set_master``)
        new_term = term if master is not None else self.term
        changed = master != self.master or new_term != self.term
        self.master, self.term = master, new_term
        self.masterless_since = None if master is not None else now
        if changed:
            self.history.append((now, self.master, self.term))

    def step(self, now: float) -> bool:
        """One pass of the real election step (``election.election_step``) at ``now`` s, with
        the enactment of ``role.RoleKeeper.enact``; True when master or term changed."""
        before = (self.master, self.term)
        peers = [p for p in self.liveness.alive(now) if p.node_id != self.node_id]
        settle = settle_for(now, self.started_at, self.start_settle, SETTINGS.failover_settle)
        step = election_step(Seat(self.master, self.term, self.masterless_since), self.heartbeat(), peers, (), now, settle=settle)
        self.masterless_since = step.seat.masterless_since
        if step.lost:
            self._set(None, self.term, now)
        if step.claim is not None:
            self.claims_at.append(now)
            self._set(self.node_id, step.claim, now)
        elif step.follow is not None:
            self._set(step.follow, step.term, now)
        return (self.master, self.term) != before


Link = Callable[[str, str, float], "float | None"]
"""``link(sender, receiver, send_time)``: delivery delay in seconds, or None (dropped)."""


class Sim:
    """Nodes exchanging heartbeats every ``heartbeat_interval`` (and at once on a change),
    stepped every ``dt`` s on one injected clock; deliveries stamped with the arrival tick."""

    def __init__(self, nodes: list[SimNode], link: Link | None = None, dt: float = 0.1) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.link = link or (lambda s, r, t: 0.01)
        self.dt = dt
        self.tick = 0
        self._queue: list[tuple[float, int, str, Heartbeat]] = []
        self._seq = itertools.count()

    @property
    def now(self) -> float:
        return round(self.tick * self.dt, 6)

    def seed(self, groups: list[list[str]]) -> None:
        """Every node hears every other node of its group at the current time."""
        for g in groups:
            for r in g:
                for s in g:
                    if s != r:
                        self.nodes[r].liveness.heard(self.nodes[s].heartbeat(), self.now)

    def deliver_at(self, t: float, receiver: str, heartbeat: Heartbeat) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), receiver, heartbeat))

    def _broadcast(self, sender: SimNode) -> None:
        for r in self.nodes:
            if r != sender.node_id and (delay := self.link(sender.node_id, r, self.now)) is not None:
                self.deliver_at(self.now + delay, r, sender.heartbeat())

    def run(self, until: float) -> None:
        beat_every = round(SETTINGS.heartbeat_interval / self.dt)
        while self.now <= until + 1e-9:
            now = self.now
            while self._queue and self._queue[0][0] <= now + 1e-9:
                _, _, r, h = heapq.heappop(self._queue)
                self.nodes[r].liveness.heard(h, now)
            for n in self.nodes.values():
                if n.step(now) or self.tick % beat_every == 0:
                    self._broadcast(n)
            self.tick += 1

    def view(self) -> set[tuple[str | None, int]]:
        return {(n.master, n.term) for n in self.nodes.values()}
