"""The peer view: this node's heartbeat, the peers' heartbeats, who is live and reachable.

Rules (pure, below the class):
- ``heartbeat_verdict``: a gossiped heartbeat is dropped when its version is unknown or it
  names another node than its sender; one naming this node with another boot id means a
  second node runs with this identity (the member then stops: a copied data dir).
- ``commit_point``: the master's committed index is the highest index a live follower
  applied (followers fsync before they apply), at most its own; alone, its own last index.
- ``acks_commits``: after applying an event a follower heartbeats at once only when it is
  one of the ``COMMIT_ACKERS`` live followers with the smallest ids (commit needs one; every
  follower doing it was a fan-out of N heartbeats to N nodes per event).
- A peer is live for ``peer_timeout`` s after its last heartbeat (``Liveness``, by this
  node's monotonic clock); reachable while live and not disconnected for ``disconnect_grace``
  s (``disconnected_for``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters, Pulse, Role, Wake
from exo_p2p.cluster.direct_heartbeat import DirectHeartbeats
from exo_p2p.cluster.faults import HOOK_HEARTBEAT_GOSSIP_OFF
from exo_p2p.cluster.liveness import Liveness
from exo_p2p.cluster.messages import HEARTBEATS_TOPIC, Heartbeat, encode, heartbeat_decoder
from exo_p2p.cluster.settings import ClusterSettings
from exo_p2p.replica import Replica
from exo_p2p.types import PROTOCOL_VERSION

log = structlog.get_logger(__name__)

DUPLICATE = "duplicate_identity"
OWN = "own"


def heartbeat_verdict(hb: Heartbeat, sender: str, node_id: str, boot_id: str) -> str | None:
    """None to accept ``hb`` gossiped by ``sender``; else why not: a drop kind
    (``heartbeat_version``, ``heartbeat_forged``), ``OWN`` (our own, echoed) or ``DUPLICATE``."""
    if hb.version != PROTOCOL_VERSION:
        return "heartbeat_version"
    if hb.node_id != sender:
        return "heartbeat_forged"
    if hb.node_id == node_id:
        return OWN if hb.boot_id == boot_id else DUPLICATE
    return None


def commit_point(last_idx: int, following: Sequence[Heartbeat]) -> int:
    """The committed index of a master whose log ends at ``last_idx``, followed by the live
    peers ``following`` (module docstring)."""
    if not following:
        return last_idx
    return min(last_idx, max(p.last_idx for p in following))


def acks_commits(node_id: str, master: str | None, live: Iterable[str], ackers: int) -> bool:
    """Whether ``node_id``, following ``master`` and hearing the peers ``live`` (ids), is one
    of the ``ackers`` followers with the smallest ids (itself counted; the master never), so
    it heartbeats at once after applying an event (module docstring). Pure."""
    if master is None or master == node_id:
        return False
    below = 0
    for peer in live:
        if peer < node_id and peer != master:
            below += 1
            if below >= ackers:
                return False
    return True


def lag_ms(seconds: float) -> int:
    """``Heartbeat.lag_ms`` for an own loop stall of ``seconds``: milliseconds, at most
    ``MAX_REPORTED_LAG_MS`` (receivers cap the grace at one peer timeout anyway)."""
    return max(0, min(defaults.MAX_REPORTED_LAG_MS, round(seconds * 1000)))


_HEARTBEAT_SEQ = itertools.count(1)
"""``Heartbeat.seq`` of the next heartbeat made in this process: one counter for the process,
so it only grows for a boot id even if its peer view were made again."""


def disconnected_for(since: float | None, now: float, grace: float) -> bool:
    """Whether a peer disconnected at ``since`` (None: connected) has been so ``grace`` s."""
    return since is not None and now - since >= grace


class PeerView:
    """Heartbeats in and out, and what they say. ``run(channel)`` sends this node's heartbeat
    every ``heartbeat_interval`` s (at once after ``beat_now.set()``, at most every
    ``HEARTBEAT_MIN_GAP`` s) and records those received by gossip or direct stream."""

    def __init__(self, net, replica: Replica, role: Role, boot_id: str, priority: int,  # type: ignore[no-untyped-def]
                 settings: ClusterSettings, counters: Counters, clock: Callable[[], float]) -> None:
        self.net, self.replica, self.role, self.boot_id, self.priority = net, replica, role, boot_id, priority
        self.settings, self.counters, self.clock = settings, counters, clock
        self.node_id = role.node_id
        self.liveness = Liveness(settings.peer_timeout, settings.stalled)
        self.started_at = clock()
        self.disconnected_at: dict[str, float] = {}
        """When each disconnected peer lost its last connection (written by ``mesh.MeshKeeper``)."""
        self.gossip_heard_at: dict[str, float] = {}
        self.heard = Pulse()
        """Fired on every peer heartbeat received."""
        self.beat_now = Wake()
        self._acker: tuple[float, str | None, bool] = (-math.inf, None, False)
        """(decided until, for which master, whether this node acks commits): ``ack_applied``."""
        self.on_master_ahead: Callable[[], None] = lambda: None
        """Called when the followed master's heartbeat shows events this node lacks."""
        self.on_duplicate: Callable[[], None] = lambda: None
        self.duplicate_identity: str | None = None
        self.direct = DirectHeartbeats(
            net, own=self.own_heartbeat, master=lambda: None if role.is_master else role.master,
            on_heartbeat=self.record, gossip_heard_at=self.gossip_heard_at.get, clock=clock,
            heartbeat_interval=settings.heartbeat_interval, peer_timeout=settings.peer_timeout,
            count=counters.drop, tally=counters.add,
        )

    def own_heartbeat(self) -> Heartbeat:
        last = self.replica.last_idx
        following = [p for p in self.live_peers() if p.master == self.node_id] if self.role.is_master else []
        return Heartbeat(
            node_id=self.node_id, boot_id=self.boot_id, term=self.role.term, master=self.role.master,
            priority=self.priority, last_idx=last, last_term=self.replica.last_term,
            commit_idx=commit_point(last, following), followers=len(following),
            chain=(self.replica.chain_at(last) or b"") if last else b"",
            seq=next(_HEARTBEAT_SEQ), lag_ms=lag_ms(self.settings.longest_stall(self.clock() - defaults.LAG_REPORT_WINDOW)),
        )

    def live_peers(self) -> list[Heartbeat]:
        return [hb for hb in self.liveness.alive(self.clock()) if hb.node_id != self.node_id]

    def ack_applied(self) -> None:
        """A follower applied an event: heartbeat at once when it acks commits (``acks_commits``,
        decided again at most every heartbeat interval: a burst of events costs one look at
        the live peers, not one per event)."""
        now = self.clock()
        until, master, acks = self._acker
        if now >= until or master != self.role.master:
            acks = acks_commits(self.node_id, self.role.master, (p.node_id for p in self.live_peers()), defaults.COMMIT_ACKERS)
            self._acker = (now + self.settings.heartbeat_interval, self.role.master, acks)
        if acks:
            self.beat_now.set()

    def disconnected_for(self, peer: str | None, now: float) -> bool:
        """Whether ``peer`` has had no connection for ``disconnect_grace`` seconds."""
        return peer is not None and disconnected_for(self.disconnected_at.get(peer), now, self.settings.disconnect_grace)

    def reachable_peers(self, now: float) -> list[Heartbeat]:
        """Live peers not disconnected for ``disconnect_grace`` s (a killed master is noticed
        in ~1.2 s, not ``peer_timeout``)."""
        return [p for p in self.live_peers() if not self.disconnected_for(p.node_id, now)]

    def reachable_nodes(self) -> set[str]:
        """This node and every peer it hears now (live heartbeat, connection not lost)."""
        return {self.node_id, *(p.node_id for p in self.reachable_peers(self.clock()))}

    def alone_for(self) -> float | None:
        """Seconds this node has had no connected peer (since it started, or since its last
        peer left), or None while it has one."""
        if self.net.connected_peers():
            return None
        return self.clock() - max([self.started_at, *self.disconnected_at.values()])

    def last_seen(self, node_id: str) -> float | None:
        """Seconds since the last heartbeat of ``node_id`` (0 for this node; None: never)."""
        if node_id == self.node_id:
            return 0.0
        t = self.liveness.last_heard(node_id)
        return None if t is None else max(0.0, self.clock() - t)

    def record(self, hb: Heartbeat) -> None:
        """Record a peer's heartbeat, received by gossip or over a direct stream."""
        if hb.node_id == self.node_id:
            return
        self.heard.fire()
        if self.liveness.heard(hb, self.clock()):
            log.info("peer up", peer=hb.node_id, master=hb.master, term=hb.term, last_idx=hb.last_idx)
            self.beat_now.set()
        if hb.node_id == self.role.master and hb.last_idx > self.replica.last_idx:
            self.on_master_ahead()

    async def run(self, channel) -> None:  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send_loop)
            nursery.start_soon(self.direct.run)
            nursery.start_soon(self._receive_loop, channel)

    async def _send_loop(self) -> None:
        gossip = self.settings.fault_hooks.get(HOOK_HEARTBEAT_GOSSIP_OFF) is None
        if not gossip:
            log.warning("heartbeat gossip off (tests only): heartbeats go over direct streams only")
        last_sent = -math.inf
        while True:
            await self.beat_now.wait(self.settings.heartbeat_interval)
            wait = defaults.HEARTBEAT_MIN_GAP - (self.clock() - last_sent)
            if wait > 0:
                await trio.sleep(wait)
            if gossip:
                await self.net.publish(HEARTBEATS_TOPIC, encode(self.own_heartbeat()))
            last_sent = self.clock()

    async def _receive_loop(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            try:
                hb = heartbeat_decoder.decode(data)
            except msgspec.DecodeError:
                self.counters.drop("heartbeat_undecodable")
                continue
            verdict = heartbeat_verdict(hb, sender, self.node_id, self.boot_id)
            if verdict == DUPLICATE:
                self._duplicate(hb)
            elif verdict is None:
                self.gossip_heard_at[hb.node_id] = self.clock()
                self.record(hb)
            elif verdict != OWN:
                self.counters.drop(verdict)

    def _duplicate(self, hb: Heartbeat) -> None:
        if self.duplicate_identity is None:
            self.duplicate_identity = (
                f"another running node uses this node's identity {self.node_id} (boot {hb.boot_id}); "
                "a copied data dir? start one of them with --new-identity"
            )
            log.error("duplicate identity: refusing to join", detail=self.duplicate_identity)
            self.on_duplicate()
