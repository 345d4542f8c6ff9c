"""The libp2p host of a node: gossip topics, request/response streams, peers, discovery.

``open_host(config)`` is the only way in; it yields a ``Network`` and tears everything down in
the order libp2p-notes §1 requires (Pubsub and GossipSub services entered first, ``host.run``
innermost; on exit, under a shielded scope, the swarm's auto-connector is stopped and its
listeners are closed before the services go). Transport security is Noise only (plaintext peers
are refused, notes §5); a cluster secret adds a PSK private network (notes §9).
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import multiaddr
import structlog
import trio
import libp2p.pubsub.pubsub as pubsub_module
from libp2p import new_host
from libp2p.abc import IHost, PeerInfo
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.discovery.events.peerDiscovery import peerDiscovery
from libp2p.discovery.mdns.mdns import create_mdns_discovery
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.address_validation import get_available_interfaces

from . import libdrops
from .config import NetConfig, derive_psk, mdns_fingerprint
from .discovery import MdnsDialHook, Redialer
from .framing import STATUS_ERROR, STATUS_OK, FrameError, read_frame, write_frame
from .peers import PeerEvent, PeerTracker

log = structlog.get_logger(__name__)

RequestHandler = Callable[[str, bytes], Awaitable[bytes]]
PEERSTORE_TTL = 600  # seconds a dialled address stays in the peerstore


class NetError(Exception):
    """Base of the errors ``Network`` raises (dial and request failures)."""


class DialError(NetError):
    """A dial failed or did not finish within its timeout (e.g. a PSK mismatch)."""


class RequestError(NetError):
    """A request failed: timeout, stream error, bad frame, or the remote handler raised."""


class RemoteError(RequestError):
    """The remote handler raised; the message is the remote's description of the error."""


class Network:
    """A running libp2p host as the node sees it. Created by ``open_host`` only.

    Guarantees: ``publish`` never raises and never blocks longer than
    ``gossip.publish_max_wait`` seconds; every dial and request is bounded by its timeout;
    undecodable or oversized input is dropped and counted in ``counters``, never raised into
    the node. Gossip is lossy (notes §3): anything that must arrive needs an acknowledgement or a
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
        self._peers = PeerTracker(on_change=self._on_peer_change)
        self._redialer: Redialer | None = None
        host.get_network().register_notifee(self._peers)

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
        event per peer change (not per connection, notes §11). A consumer that falls ``buffer`` events behind loses events (counted as
        ``peer_event_dropped``)."""
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
        seconds pass (a PSK mismatch hangs ~40 s without this bound, notes §9).
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
            raise DialError("refusing to dial self")
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
    ) -> trio.MemoryReceiveChannel[tuple[str, bytes]]:
        """Receive ``(sender node id, data)`` for every message on ``topic``.

        A drain task moves messages from libp2p's queue into the returned channel so the
        library's 32-slot queue never fills; if this channel's ``buffer`` is full the message is
        dropped and counted (``subscriber_full:<topic>``). Own messages are skipped unless
        ``include_own``. Closing the channel ends delivery for this subscriber.
        """
        subscription = await self._pubsub.subscribe(topic)
        send, recv = trio.open_memory_channel[tuple[str, bytes]](buffer)
        self._nursery.start_soon(self._drain, topic, subscription, send, include_own)
        return recv

    async def _drain(self, topic, subscription, send, include_own: bool) -> None:  # type: ignore[no-untyped-def]
        own = self._host.get_id().to_bytes()
        async with send:
            async for msg in subscription:
                if msg.from_id == own and not include_own:
                    continue
                try:
                    sender = str(ID(msg.from_id))
                except Exception:
                    self._count(f"invalid_sender:{topic}")
                    continue
                try:
                    send.send_nowait((sender, bytes(msg.data)))
                except trio.WouldBlock:
                    self._count(f"subscriber_full:{topic}")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

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
        handler_timeout = timeout if timeout is not None else self._config.request_timeout

        async def on_stream(stream) -> None:  # type: ignore[no-untyped-def]
            await self._serve_stream(stream, handler, handler_timeout)

        self._host.set_stream_handler(TProtocol(protocol), on_stream)

    async def _serve_stream(self, stream, handler: RequestHandler, handler_timeout: float) -> None:  # type: ignore[no-untyped-def]
        cfg = self._config
        peer_id = str(stream.muxed_conn.peer_id)
        try:
            with trio.move_on_after(cfg.request_timeout) as scope:
                request = await read_frame(stream, cfg.max_frame_bytes)
            if scope.cancelled_caught:
                self._count("request_idle_dropped")
                log.info("dropped silent request stream", peer=peer_id)
                await _reset(stream)
                return
            status, reply = STATUS_OK, b""
            with trio.move_on_after(handler_timeout) as hscope:
                try:
                    reply = await handler(peer_id, request)
                except Exception as exc:
                    self._count("request_handler_error")
                    status, reply = STATUS_ERROR, repr(exc).encode()
            if hscope.cancelled_caught:
                self._count("request_handler_timeout")
                status, reply = STATUS_ERROR, f"handler timed out after {handler_timeout} s".encode()
            with trio.fail_after(cfg.request_timeout):
                await write_frame(stream, bytes([status]) + reply, cfg.max_frame_bytes + 1)
                await stream.close()
        except FrameError as exc:
            self._count("request_too_large" if "exceeds" in str(exc) else "request_bad_frame")
            await _reset(stream)
        except trio.TooSlowError:
            self._count("response_write_timeout")
            await _reset(stream)
        except trio.Cancelled:
            raise
        except Exception as exc:
            self._count("request_stream_error")
            log.debug("request stream failed", peer=peer_id, error=repr(exc))
            await _reset(stream)

    async def request(self, peer_id: str, protocol: str, data: bytes, *, timeout: float) -> bytes:
        """Send ``data`` to ``peer_id`` on ``protocol`` over a new stream; return the reply.

        The whole exchange (dial if needed, negotiate, write, read) is bounded by ``timeout``
        seconds. Raises RequestError (timeout, stream or frame error), RemoteError (the handler
        raised), FrameTooLarge if ``data`` exceeds ``max_frame_bytes``.
        """
        cfg = self._config
        if len(data) > cfg.max_frame_bytes:
            from .framing import FrameTooLarge

            raise FrameTooLarge(f"request of {len(data)} bytes exceeds {cfg.max_frame_bytes}")
        stream = None
        try:
            with trio.fail_after(timeout):
                stream = await self._host.new_stream(ID.from_base58(peer_id), [TProtocol(protocol)])
                await write_frame(stream, data, cfg.max_frame_bytes)
                reply = await read_frame(stream, cfg.max_frame_bytes + 1)
                await stream.close()
                stream = None
        except trio.TooSlowError as exc:
            raise RequestError(f"request {protocol} to {peer_id} timed out after {timeout} s") from exc
        except (FrameError, NetError) as exc:
            raise RequestError(f"request {protocol} to {peer_id}: {exc}") from exc
        except trio.Cancelled:
            raise
        except Exception as exc:
            raise RequestError(f"request {protocol} to {peer_id} failed: {exc!r}") from exc
        finally:
            if stream is not None:
                await _reset(stream)
        if not reply:
            raise RequestError(f"empty reply from {peer_id}")
        if reply[0] != STATUS_OK:
            raise RemoteError(reply[1:].decode(errors="replace"))
        return reply[1:]


async def _reset(stream) -> None:  # type: ignore[no-untyped-def]
    with trio.CancelScope(shield=True), trio.move_on_after(1.0):
        try:
            await stream.reset()
        except Exception:
            pass


def _listen_multiaddrs(host: str, port: int) -> list[multiaddr.Multiaddr]:
    """What to listen on: the given IPv4 address, or every concrete IPv4 interface for 0.0.0.0
    (sharing one port; a free one is picked first when ``port`` is 0)."""
    if host != "0.0.0.0":
        return [multiaddr.Multiaddr(f"/ip4/{host}/tcp/{port}")]
    if port == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
    addrs = [a for a in get_available_interfaces(port) if a.value_for_protocol("ip4")]
    return addrs or [multiaddr.Multiaddr(f"/ip4/127.0.0.1/tcp/{port}")]


def _connection_config(config: NetConfig) -> ConnectionConfig:
    return ConnectionConfig(
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
    params = config.gossip
    # Raise the library's per-subscription queue before any subscribe (notes §3).
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = max(
        pubsub_module.SUBSCRIPTION_CHANNEL_SIZE, params.subscription_channel_size
    )
    key_pair = config.identity.key_pair
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    psk = derive_psk(config.cluster_secret, config.cluster) if config.cluster_secret else None
    listen = _listen_multiaddrs(config.listen_host, config.listen_port)
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only: plaintext is refused (notes §5)
        listen_addrs=listen,
        psk=psk,
        connection_config=_connection_config(config),
    )
    gossipsub = GossipSub(
        protocols=[TProtocol(p) for p in params.protocols],
        degree=params.degree,
        degree_low=params.degree_low,
        degree_high=params.degree_high,
        heartbeat_interval=params.heartbeat_interval,
        heartbeat_initial_delay=params.heartbeat_initial_delay,
        adaptive_gossip_enabled=False,
        spam_protection_enabled=False,
        eclipse_protection_enabled=False,
    )
    pubsub = Pubsub(host, gossipsub, strict_signing=True)
    mdns_hook: MdnsDialHook | None = None
    if config.mdns:
        host.mDNS = create_mdns_discovery(  # type: ignore[attr-defined]
            host.get_network(),
            port=int(listen[0].value_for_protocol("tcp")),
            private_network_fingerprint=mdns_fingerprint(config.cluster, config.cluster_secret),
            host=host,
        )

    swarm = host.get_network()
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
                    mdns_hook = _start_mdns_hook(net, host, nursery, config)
                log.info("host up", node_id=net.node_id, addrs=net.listen_addrs())
                yield net
            finally:
                if mdns_hook is not None:
                    peerDiscovery.unregister_peer_discovered_handler(mdns_hook.handler)
                net._peers.close()
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await swarm.auto_connector.stop()  # type: ignore[attr-defined]
                    for listener in list(swarm.listeners.values()):  # type: ignore[attr-defined]
                        try:
                            await listener.close()
                        except Exception as exc:
                            log.debug("listener close failed", error=repr(exc))


def _start_mdns_hook(
    net: Network, host: IHost, nursery: trio.Nursery, config: NetConfig
) -> MdnsDialHook:
    def on_discovered(info: PeerInfo) -> None:
        peer = str(info.peer_id)
        if peer in net.connected_peers():
            return
        nursery.start_soon(_dial_discovered, net, info, config.dial_timeout)

    def is_own(info: PeerInfo) -> bool:
        return bool(net.peer_addrs(str(info.peer_id)))

    hook = MdnsDialHook(
        own_id=net.node_id,
        token=trio.lowlevel.current_trio_token(),
        on_discovered=on_discovered,
        is_own_discovery=is_own,
    )
    peerDiscovery.register_peer_discovered_handler(hook.handler)
    return hook


async def _dial_discovered(net: Network, info: PeerInfo, timeout: float) -> None:
    try:
        await net._connect(info, timeout)
    except DialError as exc:
        net._count("mdns_dial_failed")
        log.debug("mdns dial failed", peer=str(info.peer_id), error=str(exc))
