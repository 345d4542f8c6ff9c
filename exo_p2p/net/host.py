"""The libp2p host of a node: gossip topics, request/response streams, peers, discovery.

``open_host(config)`` is the only way in; it yields a ``Network`` and tears everything down in
the order docs/architecture.md#networking-notes, note 1 requires (Pubsub and GossipSub services entered first, ``host.run``
innermost; on exit, under a shielded scope, the host's addresses are pinned, the swarm's
auto-connector is stopped and its listeners are closed, see ``exo_p2p.net.shutdown``). Transport security
is Noise only (plaintext peers are refused, docs/architecture.md#networking-notes, note 5); a cluster secret adds a PSK private
network (docs/architecture.md#networking-notes, note 9); how the host is built: ``exo_p2p.net.host_build``.
``Network`` is a facade: gossip is ``exo_p2p.net.gossip``, dialling ``exo_p2p.net.dialer``,
request streams ``exo_p2p.net.reqresp``, peers ``exo_p2p.net.peers``, re-dialling
``exo_p2p.net.discovery`` and mDNS ``exo_p2p.net.mdns``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
import trio
from libp2p.abc import IHost, INetStream, PeerInfo
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from . import libdrops, yamux_guard
from .config import NetConfig
from .dialer import Dialer
from .discovery import MdnsDialHook, Redialer
from .gossip import GossipTopics, Message
from .host_build import gossip_router, listen_multiaddrs, new_libp2p_host, raise_subscription_queue
from .mdns import MdnsDialer, start_mdns, stop_mdns
from .peers import PeerEvent, PeerTracker
from .reqresp import RequestHandler, send_request, serve_stream
from .shutdown import close_listeners, quiesce

log = structlog.get_logger(__name__)


class Network:
    """A running libp2p host as the node sees it. Created by ``open_host`` only.

    Guarantees: ``publish`` never raises and never blocks longer than
    ``gossip.publish_max_wait`` seconds; every dial and request is bounded by its timeout;
    undecodable or oversized input is dropped and counted in ``counters``, never raised into
    the node. Gossip is lossy (docs/architecture.md#networking-notes, note 3): anything that must arrive needs an acknowledgement or a
    request/response stream.
    """

    def __init__(
        self, host: IHost, pubsub: Pubsub, config: NetConfig, nursery: trio.Nursery
    ) -> None:
        self._host = host
        self._pubsub = pubsub
        self._config = config
        self._own_counters: dict[str, int] = {}
        self._peers = PeerTracker(on_change=self._on_peer_change)
        self._redialer: Redialer | None = None
        self._dialer = Dialer(host, lambda p: p in self.connected_peers(), config.dial_timeout)
        self._gossip = GossipTopics(pubsub, host.get_id().to_bytes(), config.gossip, nursery, self._count)
        host.get_network().register_notifee(self._peers)

    @property
    def bootstrap_failures(self) -> dict[str, str]:
        """Bootstrap addresses that cannot be dialled now, with the last error of each."""
        return dict(self._redialer.failing) if self._redialer is not None else {}

    # -- identity and addresses -------------------------------------------------------------
    @property
    def node_id(self) -> str:
        return str(self._host.get_id())

    def listen_addrs(self) -> list[str]:
        """Dialable multiaddrs ``/ip4/A/tcp/P/p2p/<node_id>`` (real port when 0 was asked)."""
        suffix = f"/p2p/{self.node_id}"
        out = []
        for addr in self._host.get_transport_addrs():
            text = str(addr)
            out.append(text if text.endswith(suffix) else text + suffix)
        return out

    @property
    def max_payload_bytes(self) -> int:
        """The largest gossip message ``publish`` accepts (bytes)."""
        return self._config.gossip.max_payload_bytes

    # -- counters -----------------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """Dropped/invalid messages by kind (a snapshot). ``lib_*`` kinds are process-wide."""
        merged = dict(self._own_counters)
        merged["peer_event_dropped"] = self._peers.dropped
        merged.update(libdrops.snapshot())
        return merged

    def _count(self, kind: str, n: int = 1) -> None:
        self._own_counters[kind] = self._own_counters.get(kind, 0) + n

    # -- peers ----------------------------------------------------------------------------------
    def connected_peers(self) -> set[str]:
        """Node ids with at least one live connection."""
        return self._peers.connected_peers()

    def peer_events(self, buffer: int = 256) -> trio.MemoryReceiveChannel[PeerEvent]:
        """A new channel of ``(peer_id, connected)``: first the peers connected now, then one
        event per peer change (not per connection, docs/architecture.md#networking-notes, note 11). A consumer that falls ``buffer``
        events behind loses events (counted as ``peer_event_dropped``)."""
        return self._peers.open_listener(buffer)

    def peer_addrs(self, peer_id: str) -> list[str]:
        """Addresses the peerstore holds for a peer (empty if none)."""
        try:
            return [str(a) for a in self._host.get_peerstore().addrs(ID.from_base58(peer_id))]
        except Exception:
            return []

    def _on_peer_change(self, peer_id: str, connected: bool) -> None:
        if self._redialer is not None:
            self._redialer.note_peer(peer_id, connected)

    async def dial(self, addr: str, *, timeout: float) -> str:
        """Connect to ``/ip4/A/tcp/P/p2p/<node_id>``; returns the node id.

        Raises DialError on a bad address, a refused or failed connection, or when ``timeout``
        seconds pass (a PSK mismatch hangs ~40 s without this bound, docs/architecture.md#networking-notes, note 9).
        """
        return await self._dialer.dial(addr, timeout=timeout)

    # -- gossip ---------------------------------------------------------------------------------
    async def publish(self, topic: str, data: bytes) -> bool:
        """Publish ``data`` (bytes, ≤ ``gossip.max_payload_bytes``) on ``topic``.

        Never raises. Publishes are serialised and paced: while any peer's outbound queue holds
        ``gossip.queue_high_water`` of its 32 RPCs, this waits (≤ ``publish_max_wait`` s, then
        sends anyway and counts ``publish_queue_full``). Returns False (and counts
        ``publish_oversize`` / ``publish_failed``) when the message was not handed to pubsub.
        """
        return await self._gossip.publish(topic, data)

    async def subscribe(
        self, topic: str, *, buffer: int = 1024, include_own: bool = False
    ) -> trio.MemoryReceiveChannel[Message]:
        """Receive ``(sender node id, data)`` for every later message on ``topic``.

        One drain task per topic moves messages from libp2p's queue into every subscriber's
        channel, so the library's queue never fills; a subscriber whose ``buffer`` is full loses
        the message (counted ``subscriber_full:<topic>``). Own messages are skipped unless
        ``include_own``. Closing the returned channel unsubscribes that subscriber.
        """
        return await self._gossip.subscribe(topic, buffer=buffer, include_own=include_own)

    # -- request / response --------------------------------------------------------------------
    def set_request_handler(
        self, protocol: str, handler: RequestHandler, *, timeout: float | None = None
    ) -> None:
        """Serve ``protocol`` (e.g. ``/exo-p2p/log/1``): ``handler(peer_id, request) -> reply``.

        A peer that opens a stream and does not send a whole request frame within
        ``config.request_timeout`` s is dropped (stream reset, counted ``request_idle_dropped``);
        a frame above ``config.max_frame_bytes`` is refused (``request_too_large``). The handler
        runs at most ``timeout`` s (default ``config.request_timeout``); if it raises or times
        out the requester gets a RemoteError with the reason.
        """
        cfg = self._config
        handler_timeout = timeout if timeout is not None else cfg.request_timeout

        async def on_stream(stream: INetStream) -> None:
            await serve_stream(
                stream,
                handler,
                read_timeout=cfg.request_timeout,
                handler_timeout=handler_timeout,
                max_frame_bytes=cfg.max_frame_bytes,
                count=self._count,
            )

        self._host.set_stream_handler(TProtocol(protocol), on_stream)

    async def request(self, peer_id: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        """Send ``data`` to ``peer_id`` on ``protocol`` over a new stream; return the reply.

        The whole exchange (dial if needed, negotiate, write, read) is bounded by ``timeout``
        seconds. Raises RequestError (timeout, stream or frame error), RemoteError (the handler
        raised), FrameTooLarge if ``data`` exceeds ``max_frame_bytes``.
        """
        limit = self._config.max_frame_bytes
        return await send_request(
            self._host, peer_id, protocol, data, timeout=timeout, max_frame_bytes=limit
        )


@asynccontextmanager
async def open_host(config: NetConfig) -> AsyncIterator[Network]:
    """Start a libp2p host for ``config`` and yield its ``Network``; stop it on exit.

    Raises ConfigError for invalid settings and OSError if the port is taken.
    """
    libdrops.install()
    yamux_guard.install()  # whole messages on yamux streams (exo_p2p.net.yamux_guard)
    # Raise the library's per-subscription queue before any subscribe (docs/architecture.md#networking-notes, note 3).
    raise_subscription_queue(config.gossip)
    listen = listen_multiaddrs(config.listen_host, config.listen_port)
    host = new_libp2p_host(config, listen)
    gossipsub = gossip_router(config.gossip)
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    mdns_send, mdns_recv = trio.open_memory_channel[PeerInfo](256)
    mdns_hook = start_mdns(host, config, listen, mdns_send) if config.mdns else None
    swarm = host.get_network()
    try:
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            async with host.run(listen_addrs=listen), trio.open_nursery() as nursery:
                net = Network(host, pubsub, config, nursery)
                try:
                    with trio.fail_after(10):
                        await pubsub.wait_until_ready()
                    _start_dialling(net, config, nursery, mdns_recv)
                    log.info("host up", node_id=net.node_id, addrs=net.listen_addrs())
                    yield net
                finally:
                    await _stop(net, host, swarm, nursery, mdns_hook)
    finally:
        if mdns_hook is not None:  # also when start-up failed (e.g. the port is taken)
            stop_mdns(mdns_hook)


def _start_dialling(
    net: Network, config: NetConfig, nursery: trio.Nursery,
    mdns_discovered: trio.MemoryReceiveChannel[PeerInfo],
) -> None:
    """Start the re-dialler (bootstrap and once-seen peers) and, with mDNS, the dialler of
    discovered peers, in the host's nursery."""
    dialer = net._dialer
    redialer = Redialer(
        dial_addr=lambda a: dialer.dial(a, timeout=config.dial_timeout),
        dial_peer=dialer.dial_known,
        is_connected=lambda p: p in net.connected_peers(),
        bootstrap=config.bootstrap,
        interval=config.redial_interval,
        max_backoff=config.redial_max_backoff,
        forget_after=config.forget_peer_after,
        counters=net._own_counters,
    )
    net._redialer = redialer
    nursery.start_soon(redialer.run)
    if config.mdns:
        mdns_dialer = MdnsDialer(
            dialer=dialer, redialer=redialer, own_id=net.node_id,
            is_connected=lambda p: p in net.connected_peers(), peer_addrs=net.peer_addrs,
            count=net._count, timeout=config.dial_timeout,
        )
        nursery.start_soon(mdns_dialer.run, mdns_discovered)


async def _stop(
    net: Network, host: IHost, swarm: Any, nursery: trio.Nursery, mdns_hook: MdnsDialHook | None
) -> None:
    """Stop the host's own tasks, then (shielded, within 5 s) quiesce the swarm and close its
    listeners, while the Pubsub services and ``host.run`` still run (note 1)."""
    if mdns_hook is not None:
        net._count("mdns_discovery_dropped", mdns_hook.dropped)
    net._peers.close()
    nursery.cancel_scope.cancel()
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        await quiesce(host, swarm)
        await close_listeners(swarm)
