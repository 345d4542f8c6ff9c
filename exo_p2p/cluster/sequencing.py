"""The master's side of the replicated log: local events in, indexed events out, timeouts.

Rules:
- ``own_events``: a peer's local events are taken only for its own origin and this protocol
  version (others are counted forged and dropped); only the master takes any.
- ``first_batch``: the outbox leaves in index order, up to ``max_global_batch`` events a
  gossip message, halved while the message exceeds the payload limit (one oversize event goes
  alone; publish drops it, counted, and followers fetch it over a stream). The log is fsynced
  before a message leaves (one fsync per message: group commit).
- ``committed``: an event is committed once a live node *following this master* applied it
  (followers fsync before they apply and report it in their heartbeat; a follower applies this
  master's events only on a tail it checked against this master's log, ``log_sync.takes_gossip``),
  or, alone, once persisted here. A live peer following no one or another master does not
  count, whatever its last index: its log may hold other events at the same indices (two
  masters meeting after a starved heartbeat, docs/architecture.md#log-guarantees).
- ``peer_timeouts.timed_out``: a node in State unheard for ``peer_timeout`` s is timed out,
  never before a full timeout of this node's mastership — once confirmed: a node still
  connected is first sent a direct heartbeat (``DirectHeartbeats.exchange``), and one that
  answers is live (its heartbeats were late: a starved host), not timed out. Timing out a
  live node fails its instances and re-places them, killing its runners.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.common import Counters, Pulse, Role, Wake
from exo_p2p.cluster.event_times import EventTimes
from exo_p2p.cluster.heartbeats import PeerView
from exo_p2p.cluster.liveness import reported_lag
from exo_p2p.cluster.messages import GLOBAL_EVENTS_TOPIC, Heartbeat, IndexedEventBatch, LocalEventBatch, encode, local_batch_decoder
from exo_p2p.cluster.peer_timeouts import last_sign_of_life, timed_out
from exo_p2p.cluster.settings import ClusterSettings, MasterHooks
from exo_p2p.replica import Replica
from exo_p2p.types import PROTOCOL_VERSION, IndexedEvent, LocalEvent, NodeTimedOut

log = structlog.get_logger(__name__)


def own_events(batch: LocalEventBatch, sender: str) -> tuple[list[LocalEvent], int]:
    """The events of ``batch`` that ``sender`` may send (its own), and how many it may not."""
    ok = [e for e in batch.events if e.origin == sender and e.version == PROTOCOL_VERSION]
    return ok, len(batch.events) - len(ok)


def first_batch(outbox: Sequence[IndexedEvent], max_events: int, max_bytes: int) -> tuple[int, bytes]:
    """How many events of ``outbox`` go in the next gossip message, and its bytes."""
    n = min(len(outbox), max_events)
    data = encode(IndexedEventBatch(tuple(outbox[:n])))
    while n > 1 and len(data) > max_bytes:
        n //= 2
        data = encode(IndexedEventBatch(tuple(outbox[:n])))
    return n, data


def committed(idx: int, peers: Sequence[Heartbeat], master: str) -> bool | None:
    """Whether event ``idx`` of ``master``'s log is committed by ``peers`` (live): applied by
    one that follows ``master``; None when there are no live peers (alone: committed once
    persisted)."""
    if not peers:
        return None
    return any(p.master == master and p.last_idx >= idx for p in peers)


class MasterLink:
    """``publish_indexed`` / ``run`` (publish, take local events, time out nodes) /
    ``serve_local_events`` / ``wait_committed``. Acts only while ``role.is_master``."""

    def __init__(self, net, replica: Replica, role: Role, peers: PeerView, hooks: MasterHooks,  # type: ignore[no-untyped-def]
                 settings: ClusterSettings, counters: Counters, event_times: EventTimes,
                 master_since: Callable[[], float], clock: Callable[[], float],
                 lost_master: Callable[[], str | None] = lambda: None) -> None:
        self.net, self.replica, self.role, self.peers, self.hooks = net, replica, role, peers, hooks
        self.settings, self.counters, self.event_times, self.clock = settings, counters, event_times, clock
        self.master_since = master_since
        self.lost_master = lost_master
        self.outbox: list[IndexedEvent] = []
        self.events_heard: dict[str, float] = {}
        """Per node: when this master last received local events of its own (gossip or direct)."""
        self.wake = Wake()
        self.room = Pulse()

    async def publish_indexed(self, indexed: IndexedEvent) -> None:
        """Queue ``indexed`` (already applied here) for gossip; returns at once unless
        ``max_outbox`` events wait (then it waits for room): the events the master sequences in
        one go leave as one message, and sequencing never waits for gossip. The probe's publish
        time is taken here, so time in the outbox counts as publish→apply latency."""
        self.event_times.published(indexed.idx)
        while len(self.outbox) >= self.settings.max_outbox:
            await self.room.wait()
        self.outbox.append(indexed)
        self.wake.set()

    async def run(self, local_events) -> None:  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._receive_local_events, local_events)
            nursery.start_soon(self.timeout_loop)

    async def _publish_loop(self) -> None:
        while True:
            await self.wake.wait()
            while self.outbox:
                n, data = first_batch(self.outbox, self.settings.max_global_batch, self.net.max_payload_bytes)
                del self.outbox[:n]
                self.room.fire()
                self.replica.sync()  # persisted before any other node can see it
                await self.net.publish(GLOBAL_EVENTS_TOPIC, data)

    async def _accept(self, batch: LocalEventBatch, sender: str) -> None:
        events, forged = own_events(batch, sender)
        for _ in range(forged):
            self.counters.drop("local_event_forged")
        if events:
            self.events_heard[sender] = self.clock()  # a sign of life (peer_timeouts)
        for local in events:
            await self.hooks.accept_local(local)

    async def _receive_local_events(self, channel) -> None:  # type: ignore[no-untyped-def]
        async for sender, data in channel:
            if not self.role.is_master:
                continue
            try:
                batch = local_batch_decoder.decode(data)
            except msgspec.DecodeError:
                self.counters.drop("local_event_undecodable")
                continue
            if batch.version != PROTOCOL_VERSION:
                self.counters.drop("local_event_version")
                continue
            await self._accept(batch, sender)

    async def serve_local_events(self, peer: str, data: bytes) -> bytes:
        """As master: accept a peer's re-sent local events (its own only)."""
        batch = local_batch_decoder.decode(data)
        if batch.version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported protocol version {batch.version}")
        if not self.role.is_master:
            return b"not_master"
        await self._accept(batch, peer)
        return b"ok"

    def _last_heard(self, node_id: str) -> float | None:
        return last_sign_of_life(self.peers.liveness.last_heard(node_id), self.events_heard.get(node_id))

    def _disconnected_since(self, node_id: str) -> float | None:
        """Since when this node has had no connection to ``node_id`` (None: connected, or no
        network to ask)."""
        if self.net is None or node_id in self.net.connected_peers():
            return None
        return self.peers.disconnected_at.get(node_id, self.peers.started_at)

    def _peer_lag(self, node_id: str) -> float:
        """The loop lag ``node_id``'s last heartbeat reported (seconds; 0.0: none held)."""
        hb = self.peers.liveness.get(node_id)
        return 0.0 if hb is None else reported_lag(hb)

    async def timeout_loop(self) -> None:
        while True:
            await trio.sleep(defaults.TIMEOUT_CHECK_INTERVAL)
            if not self.role.is_master:
                continue
            gone = timed_out(
                list(self.replica.state.nodes), self_id=self.role.node_id, last_heard=self._last_heard,
                master_since=self.master_since(), now=self.clock(), timeout=self.settings.peer_timeout,
                lost_master=self.lost_master(), disconnected_since=self._disconnected_since,
                stalled=self.settings.stalled, peer_lag=self._peer_lag,
            )
            for node_id in gone:
                connected = self.net is not None and node_id in self.net.connected_peers()
                if connected and await self.peers.direct.exchange(node_id) is not None:
                    log.warning("node late but answering: not timed out", node=node_id)
                    self.counters.add("timeout_averted")
                    continue
                if not self.role.is_master:
                    break
                log.warning("node timed out", node=node_id)
                await self.hooks.emit([NodeTimedOut(node_id)])  # type: ignore[arg-type]

    async def wait_committed(self, idx: int) -> None:
        """Return once event ``idx`` is committed (``committed``); woken by every heartbeat
        received, checked at least every ``COMMIT_POLL`` s."""
        while True:
            verdict = committed(idx, self.peers.live_peers(), self.role.node_id)
            if verdict is None:
                self.replica.sync()  # alone: committed once persisted
                return
            if verdict:
                return
            with trio.move_on_after(defaults.COMMIT_POLL):
                await self.peers.heard.wait()
