"""Network settings and the pure rules derived from them (PSK, mDNS fingerprint).

Cluster secret → PSK: ``HKDF-SHA256(ikm=secret, salt=b"exo-p2p/psk/v1", info=cluster name
(UTF-8), length=32)`` (RFC 5869), hex-encoded to the 64 characters py-libp2p's private network
layer expects. The secret must be 16..4096 bytes (``exo-p2p cluster-secret`` makes 32 random
bytes). Including the cluster name means one secret reused for two clusters still separates them.

mDNS fingerprint: ``"x" + sha256(b"exo-p2p/mdns/v1\\0" + name + b"\\0" + sha256(secret or b""))``
truncated to 10 hex chars, so the service type ``_p2p-x<10 hex>._udp.local.`` stays within the
15-byte DNS-SD service-name limit (RFC 6763 §7.2) and always contains a letter. It separates
clusters on one LAN; it is not security (the PSK is).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from .identity import Identity

MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
MAX_CLUSTER_NAME = 64
PSK_SALT = b"exo-p2p/psk/v1"

OPEN_CLUSTER_NOTICE = (
    "the cluster is open: any host that reaches this node's libp2p port can join it and send it commands. "
    "To close it: `exo-p2p cluster-secret FILE` on one machine, copy FILE to every node and restart each "
    "with --cluster-secret FILE (the secret is then kept in the data dir); new machines join with "
    "`exo-p2p node --join TOKEN` (TOKEN from `exo-p2p invite` on a member)"
)
"""What a node without a cluster secret says at start (docs/cluster.md "Security")."""

MDNS_SALT = b"exo-p2p/mdns/v1\0"


class ConfigError(ValueError):
    """A network setting is invalid (bad secret length, bad cluster name, bad address)."""


@dataclass(frozen=True)
class GossipParams:
    """GossipSub settings for a small LAN cluster (docs/architecture.md#networking-notes, note 2).

    The py-libp2p defaults are for the public internet: a 120 s heartbeat, spam protection
    that silently drops more than 10 msg/s per (peer, topic), and eclipse protection that prunes
    peers sharing an IP (all of them on loopback).
    """

    protocols: tuple[str, ...] = ("/meshsub/1.1.0", "/meshsub/1.0.0")
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 8
    heartbeat_interval: int = 1  # seconds (py-libp2p types it as int)
    heartbeat_initial_delay: float = 0.1  # seconds
    prune_back_off: int = 2  # seconds a pruned peer may not re-graft (py-libp2p: 60)
    unsubscribe_back_off: int = 1  # seconds (py-libp2p: 10)
    """py-libp2p's 60 s prune backoff kept a node that restarted (same peer id) out of its
    peers' meshes for up to a minute: its heartbeats and local events did not reach the
    master, so it could not join for 45 s (scripts/chaos.py). On a LAN cluster of a few nodes graft
    flapping is not a threat worth that."""
    subscription_channel_size: int = 1024  # messages buffered by libp2p per topic
    max_payload_bytes: int = 512 * 1024  # larger messages are refused by publish (RPC cap 1 MiB)
    queue_high_water: int = 24  # publish waits while a peer's outbound queue (32) is this full
    publish_max_wait: float = 2.0  # seconds publish waits for queue room before sending anyway


@dataclass(frozen=True)
class NetConfig:
    """Everything ``open_host`` needs.

    listen_host: "127.0.0.1", "0.0.0.0" (listens on each concrete IPv4 interface so what is
    advertised is dialable, docs/architecture.md#networking-notes, note 7) or a specific IPv4 address.
    listen_port: 0 picks a free port (all interfaces then share it).
    cluster_secret: raw bytes (16..4096) or None for an open cluster.
    bootstrap: multiaddrs ``/ip4/A/tcp/P/p2p/<node_id>`` dialled at start and re-dialled with
    backoff while not connected.
    Timeouts are seconds; sizes are bytes.
    """

    identity: Identity
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    cluster: str = "default"
    cluster_secret: bytes | None = None
    bootstrap: tuple[str, ...] = ()
    mdns: bool = False
    gossip: GossipParams = field(default_factory=GossipParams)
    dial_timeout: float = 5.0
    request_timeout: float = 10.0  # server side: a stream silent this long is dropped
    max_frame_bytes: int = 64 * 1024 * 1024
    health_check_interval: float = 2.0  # ping every connection this often
    health_ping_timeout: float = 2.0  # a ping slower than this closes the connection
    redial_interval: float = 1.0  # how often the re-dialler looks for unconnected peers
    redial_max_backoff: float = 30.0
    forget_peer_after: float = 600.0  # stop re-dialling a non-bootstrap peer gone this long

    def __post_init__(self) -> None:
        validate_cluster_name(self.cluster)
        if self.cluster_secret is not None:
            validate_secret(self.cluster_secret)
        for addr in self.bootstrap:
            if "/p2p/" not in addr:
                raise ConfigError(f"bootstrap address needs /p2p/<node_id>: {addr}")
        if not 0 <= self.listen_port <= 65535:
            raise ConfigError(f"listen_port out of range: {self.listen_port}")


def validate_cluster_name(name: str) -> None:
    """Raise ConfigError unless 1..64 printable characters."""
    if not name or len(name) > MAX_CLUSTER_NAME or not name.isprintable():
        raise ConfigError(f"cluster name must be 1..{MAX_CLUSTER_NAME} printable characters")


def validate_secret(secret: bytes) -> None:
    """Raise ConfigError unless the secret is 16..4096 bytes."""
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"cluster secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes,"
            f" got {len(secret)}"
        )


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF with SHA-256. ``length`` ≤ 8160 bytes."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def derive_psk(secret: bytes, cluster: str) -> str:
    """The libp2p private-network key for (secret, cluster): 64 lowercase hex chars."""
    validate_secret(secret)
    validate_cluster_name(cluster)
    return hkdf_sha256(secret, salt=PSK_SALT, info=cluster.encode(), length=32).hex()


def mdns_fingerprint(cluster: str, secret: bytes | None) -> str:
    """The per-cluster mDNS fingerprint: 11 chars ``x`` + 10 hex (see module docstring)."""
    validate_cluster_name(cluster)
    secret_hash = hashlib.sha256(secret or b"").digest()
    digest = hashlib.sha256(MDNS_SALT + cluster.encode() + b"\0" + secret_hash).hexdigest()
    return "x" + digest[:10]
