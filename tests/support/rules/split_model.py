"""A discrete-time model of a cluster's control plane for property tests of convergence
(tests/test_split_heal.py): N nodes, each running the real pure rules of one election pass
as ``role.RoleKeeper`` does — ``claims.ClaimChecker.status`` admits claims,
``election.election_step`` decides, ``election.settle_for``/``role.start_settle`` pick the
settle time, ``heartbeats.commit_point`` the committed index — over ``Liveness`` with one
injected clock. What is modelled, not run: heartbeat delivery (every ``HEARTBEAT_INTERVAL``
and on a change, ~10 ms), the log (a list of entries; its chain digest is a hash of the
prefix), a claim probe (answered ``EXTENDS`` when the claimer's log holds ours, else
``DIVERGED``; ``NO_ANSWER`` after ``CLAIM_PROBE_TIMEOUT`` when the claimer is cut off or
lagging), the log sync of a follower (takes its master's log, a snapshot when diverged), and
a master sequencing one event per second.

Faults: ``restart`` (a new boot: role, liveness and claim checks forgotten, the log kept),
``lag`` (the node's loop stalls: it neither steps nor beats; what arrives meanwhile is
stamped when the lag ends; the stall is then recorded in the node's ``liveness.Stalls``, so it
does not count as its peers' silence, and reported in its heartbeats' ``lag_ms`` for
``LAG_REPORT_WINDOW``, so its peers give it that much more time), ``cut`` (the links between a group and the rest drop both ways).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from dataclasses import dataclass, field

from exo_p2p import defaults
from exo_p2p.cluster.claims import ClaimChecker, ClaimStatus, ProbeAnswer
from exo_p2p.cluster.election import Seat, election_step, settle_for, support
from exo_p2p.cluster.heartbeats import commit_point, lag_ms
from exo_p2p.cluster.liveness import Liveness, Stalls
from exo_p2p.cluster.messages import Heartbeat
from exo_p2p.cluster.role import start_settle

DT = 0.1
"""Seconds per tick (``ELECTION_TICK``)."""
DELAY = 0.01
"""Seconds a heartbeat or a probe answer takes on a working link."""

Entry = tuple[int, str, int]
"""A log entry: ``(term, origin, seq)``; ``(term, master, 0)`` is a ``MasterElected``."""


def chain(log: list[Entry], idx: int) -> bytes | None:
    """The chain digest of ``log`` at index ``idx`` (1-based; None: past its end)."""
    if idx > len(log):
        return None
    return hashlib.blake2b(repr(log[:idx]).encode(), digest_size=8).digest() if idx else b""


@dataclass(frozen=True)
class Fault:
    """``kind`` in restart/lag/cut; ``nodes``: the node (restart, lag) or the group cut off;
    ``at``: start (s); ``length``: how long (s; a restart's node is down that long)."""

    kind: str
    nodes: tuple[str, ...]
    at: float
    length: float

    @property
    def end(self) -> float:
        return self.at + self.length


@dataclass
class ModelNode:
    node_id: str
    log: list[Entry] = field(default_factory=list)
    master: str | None = None
    term: int = 0
    boot: int = 0
    started_at: float = 0.0
    masterless_since: float | None = 0.0
    rival_since: float | None = None
    followed: bool = False
    stalls: Stalls = field(default_factory=Stalls)
    lagging_since: float | None = None
    liveness: Liveness = field(init=False)
    checker: ClaimChecker = field(default_factory=ClaimChecker)
    probes: list[tuple[float, Heartbeat, ProbeAnswer]] = field(default_factory=list)
    seq: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.liveness = Liveness(defaults.PEER_TIMEOUT, self.stalls.between)

    @property
    def is_master(self) -> bool:
        return self.master == self.node_id

    @property
    def state_term(self) -> int:
        return max((e[0] for e in self.log), default=0)

    def heartbeat(self, now: float) -> Heartbeat:
        last = len(self.log)
        following = [p for p in self.liveness.alive(now) if p.master == self.node_id] if self.is_master else []
        return Heartbeat(node_id=self.node_id, boot_id=f"boot-{self.boot}", term=self.term, master=self.master, priority=0,
                         last_idx=last, last_term=self.log[-1][0] if self.log else 0,
                         commit_idx=commit_point(last, following), chain=chain(self.log, last) or b"",
                         seq=next(self.seq), lag_ms=lag_ms(self.stalls.longest_since(now - defaults.LAG_REPORT_WINDOW)))

    def restart(self, now: float) -> None:
        """A new boot of this node (the log survives)."""
        self.boot += 1
        self.master, self.term = None, self.state_term
        self.started_at, self.masterless_since, self.rival_since, self.followed = now, now, None, False
        self.stalls, self.lagging_since, self.checker, self.probes = Stalls(), None, ClaimChecker(), []
        self.liveness = Liveness(defaults.PEER_TIMEOUT, self.stalls.between)


class Model:
    """The cluster; ``run(until)`` steps every live node every ``DT`` s; ``history`` keeps
    ``(time, node, master, term)`` at each change of a node's seat."""

    def __init__(self, nodes: list[ModelNode], faults: list[Fault] = ()) -> None:  # type: ignore[assignment]
        self.nodes = {n.node_id: n for n in nodes}
        self.faults = list(faults)
        self.tick = 0
        self._queue: list[tuple[float, int, str, Heartbeat]] = []
        self._n = itertools.count()
        self.history: list[tuple[float, str, str | None, int]] = []
        self._down: set[str] = set()

    @property
    def now(self) -> float:
        return round(self.tick * DT, 6)

    def _active(self, kind: str, node: str, now: float) -> bool:
        return any(f.kind == kind and node in f.nodes and f.at <= now < f.end for f in self.faults)

    def running(self, node: str, now: float) -> bool:
        """Whether ``node``'s loop runs at ``now`` (not down after a restart, not lagging)."""
        return not self._active("restart", node, now) and not self._active("lag", node, now)

    def link_up(self, a: str, b: str, now: float) -> bool:
        return not any(f.kind == "cut" and f.at <= now < f.end and ((a in f.nodes) != (b in f.nodes)) for f in self.faults)

    def _send(self, sender: ModelNode, now: float) -> None:
        hb = sender.heartbeat(now)
        for r in self.nodes:
            if r != sender.node_id and self.link_up(sender.node_id, r, now):
                heapq.heappush(self._queue, (now + DELAY, next(self._n), r, hb))

    def _deliver(self, now: float) -> None:
        held = []
        while self._queue and self._queue[0][0] <= now + 1e-9:
            item = heapq.heappop(self._queue)
            receiver = self.nodes[item[2]]
            if self._active("restart", receiver.node_id, now):
                continue  # lost: the process is down
            if self._active("lag", receiver.node_id, now):
                held.append(item)  # read when the loop runs again
                continue
            receiver.liveness.heard(item[3], now)
        for t, n, r, h in held:
            heapq.heappush(self._queue, (now + DT, n, r, h))

    def _probe(self, node: ModelNode, claim: Heartbeat, now: float) -> None:
        """The claimer answers for its log (``role.RoleKeeper._probe_claim`` over the log server)."""
        target = self.nodes[claim.node_id]
        if not self.link_up(node.node_id, target.node_id, now) or not self.running(target.node_id, now):
            node.probes.append((now + defaults.CLAIM_PROBE_TIMEOUT, claim, ProbeAnswer.NO_ANSWER))
            return
        mine = len(node.log)
        extends = len(target.log) >= mine and chain(target.log, mine) == chain(node.log, mine)
        node.probes.append((now + DELAY, claim, ProbeAnswer.EXTENDS if extends else ProbeAnswer.DIVERGED))

    def _admitted(self, node: ModelNode, now: float) -> tuple[list[Heartbeat], list[Heartbeat]]:
        peers = [p for p in node.liveness.alive(now) if p.node_id != node.node_id]
        everyone = [node.heartbeat(now), *peers]
        out, pending = [], []
        for p in peers:
            status = ClaimStatus.ADMITTED if p.master != p.node_id else node.checker.status(
                p, side=support(everyone, p.node_id), following=(node.master, node.term), own_last_idx=len(node.log),
                own_term=max(node.term, node.log[-1][0] if node.log else 0), chain_at=lambda i: chain(node.log, i), now=now)
            if status is ClaimStatus.ADMITTED:
                out.append(p)
            elif status is not ClaimStatus.REFUSED:
                pending.append(p)
                if status is ClaimStatus.PROBE:
                    node.checker.probe_started(p)
                    self._probe(node, p, now)
        return out, pending

    def _set(self, node: ModelNode, master: str | None, term: int, now: float) -> None:
        """``role.RoleKeeper.set_master`` / ``claim``."""
        node.term = term if master is not None else node.term
        node.master = master
        node.followed = node.followed or master is not None
        node.masterless_since = None if master is not None else now
        self.history.append((now, node.node_id, master, node.term))

    def _claim(self, node: ModelNode, term: int, considered: list[Heartbeat], now: float) -> None:
        best = max(considered, key=lambda p: p.last_idx, default=None)
        if best is not None and best.last_idx > len(node.log):
            source = self.nodes[best.node_id]
            if self.link_up(node.node_id, source.node_id, now) and self.running(source.node_id, now):
                node.log = list(source.log)  # catch up (a snapshot when diverged)
            if len(node.log) < best.last_idx:
                return
        self._set(node, node.node_id, max(term, node.state_term + 1), now)
        node.log.append((node.term, node.node_id, 0))

    def step(self, node: ModelNode, now: float) -> bool:
        """One pass of the election (``role.RoleKeeper.step`` + ``enact``); True on a change."""
        for done in [p for p in node.probes if p[0] <= now + 1e-9]:
            node.probes.remove(done)
            node.checker.probe_done(done[1], done[2], now)
        before = (node.master, node.term)
        peers, pending = self._admitted(node, now)
        others = sorted({e[1] for e in node.log} - {node.node_id})
        settle = settle_for(now, node.started_at, start_settle(node.node_id, others, defaults.START_SETTLE, defaults.KNOWN_SETTLE),
                            defaults.FAILOVER_SETTLE, followed=node.followed)
        seat = Seat(node.master, node.term, node.masterless_since, node.rival_since)
        step = election_step(seat, node.heartbeat(now), peers, pending, now, settle=settle)
        node.masterless_since, node.rival_since = step.seat.masterless_since, step.seat.rival_since
        if step.lost:
            self._set(node, None, node.term, now)
        if step.claim is not None:
            self._claim(node, step.claim, peers, now)
        elif step.follow is not None:
            self._set(node, step.follow, step.term, now)
        return (node.master, node.term) != before

    def _sync(self, node: ModelNode, now: float) -> None:
        """A follower's log becomes its master's (``log_sync.LogFollower``); a master sequences."""
        if node.is_master and self.tick % round(1 / DT) == 0:
            node.log.append((node.term, node.node_id, len(node.log) + 1))
        elif node.master not in (None, node.node_id):
            m = self.nodes[node.master]
            if self.link_up(node.node_id, m.node_id, now) and self.running(m.node_id, now) and m.log != node.log:
                node.log = list(m.log)

    def run(self, until: float) -> None:
        beat_every = round(defaults.HEARTBEAT_INTERVAL / DT)
        while self.now <= until + 1e-9:
            now = self.now
            for n in self.nodes.values():
                down = self._active("restart", n.node_id, now)
                if not down and n.node_id in self._down:
                    n.restart(now)
                (self._down.add if down else self._down.discard)(n.node_id)
                lagging = self._active("lag", n.node_id, now)
                if lagging and n.lagging_since is None:
                    n.lagging_since = now
                elif not lagging and n.lagging_since is not None:
                    n.stalls.add(n.lagging_since, now)  # as loop_watch records it when the loop runs again
                    n.lagging_since = None
            self._deliver(now)
            for n in self.nodes.values():
                if not self.running(n.node_id, now):
                    continue
                changed = self.step(n, now)
                self._sync(n, now)
                if changed or self.tick % beat_every == 0:
                    self._send(n, now)
            self.tick += 1

    def masters(self) -> set[str]:
        return {n.node_id for n in self.nodes.values() if n.is_master}

    def one_master(self) -> str | None:
        """The master every node follows, when exactly one node is master (else None)."""
        masters = self.masters()
        if len(masters) != 1:
            return None
        (m,) = masters
        return m if all(n.master == m for n in self.nodes.values()) else None
