"""exo_p2p.net — the libp2p layer: identity, host, gossip topics, direct streams, discovery.

Public API: ``load_or_create_identity``, ``new_boot_id``, ``NetConfig``, ``GossipParams``,
``open_host`` (yields a ``Network``), and the errors ``NetError``, ``DialError``,
``RequestError``, ``RemoteError``, ``FrameTooLarge``, ``ConfigError``.
"""

from .config import ConfigError, GossipParams, NetConfig, derive_psk, mdns_fingerprint
from .framing import FrameTooLarge
from .errors import DialError, NetError, RemoteError, RequestError
from .host import Network, open_host
from .identity import Identity, IdentityError, load_or_create_identity, new_boot_id

__all__ = [
    "ConfigError",
    "DialError",
    "FrameTooLarge",
    "GossipParams",
    "Identity",
    "IdentityError",
    "NetConfig",
    "NetError",
    "Network",
    "RemoteError",
    "RequestError",
    "derive_psk",
    "load_or_create_identity",
    "mdns_fingerprint",
    "new_boot_id",
    "open_host",
]
