"""Building a py-libp2p host and its GossipSub router from a ``NetConfig``, with every
setting the library gets wrong for a cluster set right (docs/architecture.md#networking-notes).

Transport security is Noise only (plaintext peers are refused, note 5); a cluster secret adds
a PSK private network (note 9); listening is on concrete interface addresses (note 7);
GossipSub's protections meant for the internet are off (note 2). Nothing here starts a
service: ``exo_p2p.net.host.open_host`` runs what these build.
"""

from __future__ import annotations

import socket

import multiaddr
import libp2p.pubsub.pubsub as pubsub_module
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.utils.address_validation import get_available_interfaces

from exo_p2p import defaults
from exo_p2p.limits import LIBP2P_MAX_CONNECTIONS, LIBP2P_MAX_INBOUND

from .inbound import limit_per_source
from .config import GossipParams, NetConfig, derive_psk


def listen_multiaddrs(host: str, port: int) -> list[multiaddr.Multiaddr]:
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


def connection_config(config: NetConfig) -> ConnectionConfig:
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


def new_libp2p_host(config: NetConfig, listen: list[multiaddr.Multiaddr]) -> IHost:
    """A host (not running yet) with ``config``'s identity, Noise only, the cluster's PSK
    when it has a secret, bounded connections (in all and per source address,
    ``exo_p2p.net.inbound``) and quick dial retries."""
    key_pair = config.identity.key_pair
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    psk = derive_psk(config.cluster_secret, config.cluster) if config.cluster_secret else None
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},  # Noise only: plaintext is refused (docs/architecture.md#networking-notes, note 5)
        listen_addrs=listen,
        psk=psk,
        connection_config=connection_config(config),
    )
    # one quick retry per address: the swarm's default (3 retries, 0.1-0.4 s apart) held a dial
    # to a stale address ~1-2 s, and with it every other dial of that peer (the per-peer lock
    # of ``Dialer.connect``); our re-dialler and mesh keeper back off themselves
    host.get_network().retry_config = RetryConfig(  # type: ignore[attr-defined]
        max_retries=defaults.DIAL_RETRIES, initial_delay=defaults.DIAL_RETRY_DELAY)
    limit_per_source(host.get_network())  # one source cannot hold every inbound slot
    return host


def raise_subscription_queue(params: GossipParams) -> None:
    """Raise the library's per-subscription queue (a process-wide module constant) to
    ``params.subscription_channel_size``; call before any subscribe (docs/architecture.md#networking-notes, note 3)."""
    pubsub_module.SUBSCRIPTION_CHANNEL_SIZE = max(
        pubsub_module.SUBSCRIPTION_CHANNEL_SIZE, params.subscription_channel_size
    )


def gossip_router(params: GossipParams) -> GossipSub:
    """The GossipSub router for ``params``: our degrees and heartbeat, the library's
    adaptive gossip, spam and eclipse protections off (docs/architecture.md#networking-notes, note 2)."""
    return GossipSub(
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
