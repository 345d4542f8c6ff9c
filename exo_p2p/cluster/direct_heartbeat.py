"""Heartbeats over a direct stream to the master (docs/architecture.md#rules "Liveness").

Gossip is the normal path of heartbeats, but GossipSub may keep a restarted peer out of the
master's mesh for a while (prune backoff, a mesh that is full), and the master then hears
nothing from it and times it out. So every follower also sends its heartbeat straight to its
master over ``/exo-p2p/heartbeat/1`` and gets the master's heartbeat back
(``HeartbeatAck``): liveness never depends on gossip alone, in either direction.

``direct_delay`` is the rule for how often (pure): every ``heartbeat_interval`` while the
master says it has not heard this follower by gossip recently (``gossip_fresh`` false: gossip
is quiet), else every ``peer_timeout / 3`` (so even if gossip stops right after an answer,
a direct heartbeat still arrives well within the timeout).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.cluster.messages import (
    HEARTBEAT_PROTOCOL,
    Heartbeat,
    HeartbeatAck,
    encode,
    heartbeat_ack_decoder,
    heartbeat_decoder,
)
from exo_p2p.types import PROTOCOL_VERSION

log = structlog.get_logger(__name__)


def direct_delay(gossip_fresh: bool, *, heartbeat_interval: float, peer_timeout: float) -> float:
    """Seconds until the next direct heartbeat (module docstring)."""
    return peer_timeout / 3 if gossip_fresh else heartbeat_interval


def gossip_fresh(heard_at: float | None, now: float, *, heartbeat_interval: float) -> bool:
    """Whether a gossiped heartbeat heard at ``heard_at`` (None: never) is recent: younger
    than three heartbeat intervals (two may be lost or late)."""
    return heard_at is not None and now - heard_at < 3 * heartbeat_interval


class DirectHeartbeats:
    """Both ends of the direct heartbeat: ``run`` (a follower sending to its master) and
    ``serve`` (the request handler, any node).

    ``own()``: this node's heartbeat now; ``master()``: the node followed (None: none, or
    this node is master); ``on_heartbeat(hb)``: record a heartbeat received (the member's
    liveness path); ``gossip_heard_at(node)``: when that node's last gossiped heartbeat
    arrived (monotonic seconds). ``count(kind)``: count a failure; ``tally(kind)``: count a
    success (``direct_heartbeats_sent``/``direct_heartbeats_received``)."""

    def __init__(
        self,
        net,  # exo_p2p.net.Network
        *,
        own: Callable[[], Heartbeat],
        master: Callable[[], str | None],
        on_heartbeat: Callable[[Heartbeat], None],
        gossip_heard_at: Callable[[str], float | None],
        clock: Callable[[], float],
        heartbeat_interval: float,
        peer_timeout: float,
        count: Callable[[str], None],
        tally: Callable[[str], None] = lambda _kind: None,
    ) -> None:
        self.net = net
        self.own = own
        self.master = master
        self.on_heartbeat = on_heartbeat
        self.gossip_heard_at = gossip_heard_at
        self.clock = clock
        self.heartbeat_interval = heartbeat_interval
        self.peer_timeout = peer_timeout
        self.count = count
        self.tally = tally
        self.heard_by: str | None = None
        """The master whose last answer said it hears this node's gossip (None: none did)."""

    def gossip_reaches(self, master: str) -> bool:
        """Whether ``master`` said in its last answer that this node's gossiped heartbeats
        reach it (False before any answer: a node that just joined is often not yet in the
        master's GossipSub mesh, so what it gossips may be lost)."""
        return self.heard_by == master

    async def run(self) -> None:
        fresh = False
        while True:
            await trio.sleep(direct_delay(fresh, heartbeat_interval=self.heartbeat_interval, peer_timeout=self.peer_timeout))
            master = self.master()
            if master is None:
                fresh = False
                self.heard_by = None
                continue
            ack = await self.exchange(master)
            fresh = ack is not None and ack.gossip_fresh
            self.heard_by = master if fresh else None

    async def exchange(self, peer: str) -> HeartbeatAck | None:
        """Send this node's heartbeat straight to ``peer`` and record its answer's heartbeat
        (when it is ``peer``'s own); None when ``peer`` does not answer within
        ``min(DIRECT_HEARTBEAT_TIMEOUT, peer_timeout / 2)`` s (counted)."""
        try:
            raw = await self.net.request(peer, HEARTBEAT_PROTOCOL, encode(self.own()), timeout=min(defaults.DIRECT_HEARTBEAT_TIMEOUT, self.peer_timeout / 2))
            ack = heartbeat_ack_decoder.decode(raw)
        except Exception as exc:  # noqa: BLE001 - peer unreachable now; gossip may still work
            log.debug("direct heartbeat failed", peer=peer, error=repr(exc))
            self.count("direct_heartbeat_failed")
            return None
        self.tally("direct_heartbeats_sent")
        if ack.version == PROTOCOL_VERSION and ack.heartbeat.node_id == peer and ack.heartbeat.version == PROTOCOL_VERSION:
            self.on_heartbeat(ack.heartbeat)
            return ack
        return None

    async def serve(self, peer: str, data: bytes) -> bytes:
        """Record the asker's heartbeat (it must be its own) and answer with ours.
        Raises ValueError for an undecodable, other-version or forged heartbeat (the
        request layer resets the stream)."""
        try:
            hb = heartbeat_decoder.decode(data)
        except msgspec.DecodeError:
            self.count("heartbeat_undecodable")
            raise ValueError("undecodable heartbeat") from None
        if hb.version != PROTOCOL_VERSION:
            self.count("heartbeat_version")
            raise ValueError(f"unsupported protocol version {hb.version}")
        if hb.node_id != peer:
            self.count("heartbeat_forged")
            raise ValueError("a heartbeat must be the sender's own")
        self.on_heartbeat(hb)
        self.tally("direct_heartbeats_received")
        fresh = gossip_fresh(self.gossip_heard_at(peer), self.clock(), heartbeat_interval=self.heartbeat_interval)
        return encode(HeartbeatAck(self.own(), fresh))
