"""The libp2p host of a node: gossip topics, request/response streams, peers, discovery.

``open_host(config)`` is the only way in; it yields a ``Network`` and tears everything down in
the order docs/architecture.md#networking-notes, note 1 requires (Pubsub and GossipSub services entered first, ``host.run``
innermost; on exit, under a shielded scope, the host's addresses are pinned, the swarm's
auto-connector is stopped and its listeners are closed, see ``_quiesce``). Transport security
is Noise only (plaintext peers are refused, docs/architecture.md#networking-notes, note 5); a cluster secret adds a PSK private
network (docs/architecture.md#networking-notes, note 9).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import structlog
import libp2p.pubsub.pubsub as pubsub_module
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetStream, PeerInfo
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.discovery.events.peerDiscovery import peerDiscovery
from libp2p.discovery.mdns.mdns import create_mdns_discovery
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.address_validation import get_available_interfaces

from exo_p2p import defaults
from exo_p2p.limits import LIBP2P_MAX_CONNECTIONS, LIBP2P_MAX_INBOUND

from . import libdrops, yamux_guard
from .config import NetConfig, derive_psk, mdns_fingerprint
from .discovery import MDNS_FALLBACK_DELAY, MdnsDialHook, Redialer, should_dial
from .errors import DialError
from .peers import PeerEvent, PeerTracker
from .reqresp import RequestHandler, send_request, serve_stream

log = structlog.get_logger(__name__)

PEERSTORE_TTL = 600  # seconds a dialled address stays in the peerstore


Message = tuple[str, bytes]  # (sender node id, data)
_Subscriber = tuple[trio.MemorySendChannel[Message], bool]  # (channel, include_own)


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
        self._nursery = nursery
        self._own_counters: dict[str, int] = {}
        self._publish_lock = trio.Lock()
        self._dial_locks: dict[str, trio.Lock] = {}  # one per peer ever dialled (bounded by peers)
        self._peers = PeerTracker(on_change=self._on_peer_change)
        self._redialer: Redialer | None = None
        self._subscribers: dict[str, list[_Subscriber]] = {}
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
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            raise DialError(f"bad multiaddr {addr!r}: {exc}") from exc
        await self._connect(info, timeout)
        return str(info.peer_id)

    async def _dial_known(self, peer_id: str) -> None:
        pid = ID.from_base58(peer_id)
        addrs = self._host.get_peerstore().addrs(pid)
        if not addrs:
            raise DialError(f"no known address for {peer_id}")
        await self._connect(PeerInfo(pid, addrs), self._config.dial_timeout)

    async def _connect(self, info: PeerInfo, timeout: float) -> None:
        if info.peer_id == self._host.get_id():
            # Our own id at one of our own addresses is a dial to ourselves; at a foreign
            # address it is another process using our identity (a copied data dir): connect,
            # so that its heartbeats reveal the duplicate and one side refuses to join.
            own = {str(a).split("/p2p/")[0] for a in self._host.get_transport_addrs()}
            if all(str(a).split("/p2p/")[0] in own for a in info.addrs):
                raise DialError("refusing to dial self")
        # One dial per peer at a time, each with its own addresses: the swarm would make a
        # second dial wait for the one in flight and share its result, so a stale bootstrap
        # address being retried made every dial to the peer's current address (from its
        # State profile) fail with it (a restarted node joined only after 16 s under scripts/chaos.py).
        lock = self._dial_locks.setdefault(str(info.peer_id), trio.Lock())
        async with lock:
            if str(info.peer_id) in self.connected_peers():
                self._host.get_peerstore().add_addrs(info.peer_id, info.addrs, PEERSTORE_TTL)
                return
            await self._connect_now(info, timeout)

    async def _connect_now(self, info: PeerInfo, timeout: float) -> None:
        # The swarm refuses for 60 s to dial a peer whose addresses all failed once (its
        # "negative cache"); our callers keep their own backoff, and a restarted peer must be
        # reachable again within seconds, so lift that block for explicit dials.
        self._host.get_network().unblock_peer(info.peer_id)  # type: ignore[attr-defined]
        # The swarm dials only ONE address per transport class (its "smart address
        # selection"), the first the peerstore lists: after a peer restarted on a new port its
        # stale address comes first and every dial fails. The addresses we are given are
        # current (State profile, bootstrap, mDNS), so they replace what the peerstore held.
        if str(info.peer_id) not in self.connected_peers():
            self._host.get_peerstore().clear_addrs(info.peer_id)
        try:
            with trio.fail_after(timeout):
                await self._host.connect(info)
        except trio.TooSlowError as exc:
            raise DialError(f"dial {info.peer_id} timed out after {timeout} s") from exc
        except Exception as exc:
            raise DialError(f"dial {info.peer_id} failed: {exc!r}") from exc
        self._host.get_peerstore().add_addrs(info.peer_id, info.addrs, PEERSTORE_TTL)

    # -- gossip ---------------------------------------------------------------------------------
    async def publish(self, topic: str, data: bytes) -> bool:
        """Publish ``data`` (bytes, ≤ ``gossip.max_payload_bytes``) on ``topic``.

        Never raises. Publishes are serialised and paced: while any peer's outbound queue holds
        ``gossip.queue_high_water`` of its 32 RPCs, this waits (≤ ``publish_max_wait`` s, then
        sends anyway and counts ``publish_queue_full``). Returns False (and counts
        ``publish_oversize`` / ``publish_failed``) when the message was not handed to pubsub.
        """
        params = self._config.gossip
        if len(data) > params.max_payload_bytes:
            self._count("publish_oversize")
            return False
        try:
            async with self._publish_lock:
                await self._wait_for_queue_room()
                await self._pubsub.publish(topic, data)
            self._count(f"published:{topic}")
            return True
        except trio.Cancelled:
            raise
        except Exception as exc:
            self._count("publish_failed")
            log.warning("publish failed", topic=topic, error=repr(exc))
            return False

    async def _wait_for_queue_room(self) -> None:
        params = self._config.gossip
        deadline = trio.current_time() + params.publish_max_wait
        while True:
            queues = list(self._pubsub.peer_queues.values())
            if all(len(q) < params.queue_high_water for q in queues):
                return
            if trio.current_time() >= deadline:
                self._count("publish_queue_full")
                return
            await trio.sleep(0.002)

    async def subscribe(
        self, topic: str, *, buffer: int = 1024, include_own: bool = False
    ) -> trio.MemoryReceiveChannel[Message]:
        """Receive ``(sender node id, data)`` for every later message on ``topic``.

        One drain task per topic moves messages from libp2p's queue into every subscriber's
        channel, so the library's queue never fills; a subscriber whose ``buffer`` is full loses
        the message (counted ``subscriber_full:<topic>``). Own messages are skipped unless
        ``include_own``. Closing the returned channel unsubscribes that subscriber.
        """
        send, recv = trio.open_memory_channel[Message](buffer)
        subscribers = self._subscribers.get(topic)
        if subscribers is None:
            subscribers = self._subscribers[topic] = []
            subscription = await self._pubsub.subscribe(topic)
            self._nursery.start_soon(self._drain, topic, subscription, subscribers)
        subscribers.append((send, include_own))
        return recv

    async def _drain(
        self,
        topic: str,
        subscription: AsyncIterable[Any],
        subscribers: list[_Subscriber],
    ) -> None:
        own = self._host.get_id().to_bytes()
        try:
            async for msg in subscription:
                try:
                    sender = str(ID(msg.from_id))
                except Exception:
                    self._count(f"invalid_sender:{topic}")
                    continue
                item = (sender, bytes(msg.data))
                is_own = msg.from_id == own
                for entry in list(subscribers):
                    send, include_own = entry
                    if is_own and not include_own:
                        continue
                    try:
                        send.send_nowait(item)
                    except trio.WouldBlock:
                        self._count(f"subscriber_full:{topic}")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        subscribers.remove(entry)
        finally:
            for send, _ in subscribers:
                send.close()

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


def _listen_multiaddrs(host: str, port: int) -> list[multiaddr.Multiaddr]:
    """What to listen on: the given IPv4 address, or every concrete IPv4 interface for 0.0.0.0
    (sharing one port; a free one is picked first when ``port`` is 0)."""
    if host != "0.0.0.0":
        return [multiaddr.Multiaddr(f"/ip4/{host}/tcp/{port}")]
    if port == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
    addrs = [a for a in get_available_interfaces(port) if str(a).startswith("/ip4/")]
    return addrs or [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")]


def _connection_config(config: NetConfig) -> ConnectionConfig:
    """py-libp2p's connection settings. Inbound connections are bounded: at most
    ``LIBP2P_MAX_INBOUND`` at once, handshaking or not (py-libp2p's inbound slots are
    ``max_connections - min_connections``; one beyond is closed on arrival) and ``LIBP2P_MAX_CONNECTIONS``
    established ones; a connection whose Noise/PSK and muxer handshake is not done within
    ``dial_timeout`` s (one that says nothing) is closed. Its accept loop is trio's
    ``serve_listeners``, which pauses on ``EMFILE``/``ENFILE``/``ENOBUFS``/``ENOMEM``."""
    return ConnectionConfig(
        max_connections=LIBP2P_MAX_CONNECTIONS,
        min_connections=LIBP2P_MAX_CONNECTIONS - LIBP2P_MAX_INBOUND,
        dial_timeout=config.dial_timeout,
        # a PSK mismatch stalls the upgrade; do not let the library hold it longer than a dial
        inbound_upgrade_timeout=config.dial_timeout,
        outbound_upgrade_timeout=config.dial_timeout,
        enable_health_monitoring=True,
        health_initial_delay=config.health_check_interval,
        health_warmup_window=0.0,
        health_check_interval=config.health_check_interval,
        ping_timeout=config.health_ping_timeout,
        abort_connection_on_ping_failure=True,
    )


@asynccontextmanager
async def open_host(config: NetConfig) -> AsyncIterator[Network]:
    """Start a libp2p host for ``config`` and yield its ``Network``; stop it on exit.

    Raises ConfigError for invalid settings and OSError if the port is taken.
    """
    libdrops.install()
    yamux_guard.install()  # whole messages on yamux streams (exo_p2p.net.yamux_guard)
    params = config.gossip
    # Raise the library's per-subscription queue before any subscribe (docs/architecture.md#networking-notes, note 3).
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = max(
        pubsub_module.SUBSCRIPTION_CHANNEL_SIZE, params.subscription_channel_size
    )
    key_pair = config.identity.key_pair
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    psk = derive_psk(config.cluster_secret, config.cluster) if config.cluster_secret else None
    listen = _listen_multiaddrs(config.listen_host, config.listen_port)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only: plaintext is refused (docs/architecture.md#networking-notes, note 5)
        listen_addrs=listen,
        psk=psk,
        connection_config=_connection_config(config),
    )
    # one quick retry per address: the swarm's default (3 retries, 0.1-0.4 s apart) held a dial
    # to a stale address ~1-2 s, and with it every other dial of that peer (the per-peer lock
    # of ``Network._connect``); our re-dialler and mesh keeper back off themselves
    host.get_network().retry_config = RetryConfig(  # type: ignore[attr-defined]
        max_retries=defaults.DIAL_RETRIES, initial_delay=defaults.DIAL_RETRY_DELAY)
    gossipsub = GossipSub(
        protocols=[TProtocol(p) for p in params.protocols],
        degree=params.degree,
        degree_low=params.degree_low,
        degree_high=params.degree_high,
        heartbeat_interval=params.heartbeat_interval,
        heartbeat_initial_delay=params.heartbeat_initial_delay,
        prune_back_off=params.prune_back_off,
        unsubscribe_back_off=params.unsubscribe_back_off,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
        eclipse_protection_enabled=False,
    )
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    mdns_hook: MdnsDialHook | None = None
    mdns_send, mdns_recv = trio.open_memory_channel[PeerInfo](256)
    if config.mdns:
        mdns_hook = MdnsDialHook(
            own_id=str(host.get_id()), token=trio.lowlevel.current_trio_token(), send=mdns_send
        )
        peerDiscovery.register_peer_discovered_handler(mdns_hook.handler)
        host.mDNS = create_mdns_discovery(  # type: ignore[attr-defined]
            host.get_network(),
            port=int(listen[0].value_for_protocol("tcp")),
            private_network_fingerprint=mdns_fingerprint(config.cluster, config.cluster_secret),
            host=host,
        )

    swarm = host.get_network()
    try:
        async with background_trio_service(pubsub), background_trio_service(gossipsub):
            async with host.run(listen_addrs=listen), trio.open_nursery() as nursery:
                net = Network(host, pubsub, config, nursery)
                try:
                    with trio.fail_after(10):
                        await pubsub.wait_until_ready()
                    redialer = Redialer(
                        dial_addr=lambda a: net.dial(a, timeout=config.dial_timeout),
                        dial_peer=net._dial_known,
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
                        nursery.start_soon(_mdns_dialer, net, mdns_recv, config.dial_timeout)
                    log.info("host up", node_id=net.node_id, addrs=net.listen_addrs())
                    yield net
                finally:
                    if mdns_hook is not None:
                        net._count("mdns_discovery_dropped", mdns_hook.dropped)
                    net._peers.close()
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True), trio.move_on_after(5):
                        await _quiesce(host, swarm)
                        listeners = list(swarm.listeners.values())  # type: ignore[attr-defined]
                        for listener in listeners:
                            try:
                                await listener.close()
                            except Exception as exc:
                                log.debug("listener close failed", error=repr(exc))
    finally:
        if mdns_hook is not None:  # also when start-up failed (e.g. the port is taken)
            peerDiscovery.unregister_peer_discovered_handler(mdns_hook.handler)


async def _quiesce(host: IHost, swarm) -> None:  # type: ignore[no-untyped-def]
    """Stop what dials and pin the host's addresses before the listeners close.

    Beyond networking note 1 (docs/architecture.md): GossipSub reads the host's addresses for every message it forwards
    (``env_to_send_in_RPC`` → ``get_addrs`` → ``getsockname`` of each listener socket). A
    message forwarded while a listener is closing hits a closed socket (EBADF), which fails the
    Pubsub service and the whole ``trio.run`` (seen in 1 of ~20 shutdowns under traffic). The
    Pubsub services must keep running until the swarm is gone (stopping them first brings back
    "Nursery is closed to new arrivals"), so the addresses are frozen instead: the instance
    attributes shadow the methods for the rest of this host's life.
    """
    transport_addrs = list(host.get_transport_addrs())
    addrs = list(host.get_addrs())
    host.get_transport_addrs = lambda: list(transport_addrs)  # type: ignore[method-assign]
    host.get_addrs = lambda: list(addrs)  # type: ignore[method-assign]
    await swarm.auto_connector.stop()


async def _mdns_dialer(
    net: Network, discovered: trio.MemoryReceiveChannel[PeerInfo], timeout: float
) -> None:
    """Dial peers found by mDNS (docs/architecture.md#networking-notes, note 6): the smaller peer id at once, the other side after
    ``MDNS_FALLBACK_DELAY`` s if the pair is still apart. Failed peers go to the re-dialler."""
    async with trio.open_nursery() as nursery:
        async for info in discovered:
            peer = str(info.peer_id)
            if peer in net.connected_peers() or not net.peer_addrs(peer):
                continue  # connected already, or another host's discovery (shared singleton)
            log.debug("mdns discovered", peer=peer, addrs=[str(a) for a in info.addrs])
            delay = 0.0 if should_dial(net.node_id, peer) else MDNS_FALLBACK_DELAY
            nursery.start_soon(_dial_discovered, net, info, timeout, delay)


async def _dial_discovered(net: Network, info: PeerInfo, timeout: float, delay: float) -> None:
    await trio.sleep(delay)
    peer = str(info.peer_id)
    if peer in net.connected_peers():
        return
    try:
        await net._connect(info, timeout)
    except DialError as exc:
        net._count("mdns_dial_failed")
        log.debug("mdns dial failed", peer=peer, error=str(exc))
        if net._redialer is not None:
            net._redialer.note_peer(peer, False)
