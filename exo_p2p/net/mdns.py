"""mDNS for one host: start and stop py-libp2p's listener, and dial the peers it finds.

docs/architecture.md#networking-notes, note 6: the swarm itself connects to discovered peers
only every 10 s, so each discovery is dialled here at once by the side with the smaller peer
id, and by the other side after ``MDNS_FALLBACK_DELAY`` s if the pair is still apart (the
rule and the hand-over from zeroconf's thread: ``exo_p2p.net.discovery``). The service type
carries the cluster's fingerprint, so clusters on one LAN stay apart (note 8).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import structlog
import trio
from libp2p.abc import IHost, PeerInfo
from libp2p.discovery.events.peerDiscovery import peerDiscovery
from libp2p.discovery.mdns.mdns import create_mdns_discovery

from .config import NetConfig, mdns_fingerprint
from .dialer import Dialer
from .discovery import MDNS_FALLBACK_DELAY, MdnsDialHook, Redialer, should_dial
from .errors import DialError

log = structlog.get_logger(__name__)


def start_mdns(
    host: IHost, config: NetConfig, listen: list[multiaddr.Multiaddr],
    send: trio.MemorySendChannel[PeerInfo],
) -> MdnsDialHook:
    """Register a discovery handler posting to ``send``, then create the host's mDNS
    listener advertising the first listen address's port. Call ``stop_mdns`` with the hook
    returned, also when the host fails to start (``peerDiscovery`` is process-wide)."""
    hook = MdnsDialHook(
        own_id=str(host.get_id()), token=trio.lowlevel.current_trio_token(), send=send
    )
    peerDiscovery.register_peer_discovered_handler(hook.handler)
    host.mDNS = create_mdns_discovery(  # type: ignore[attr-defined]
        host.get_network(),
        port=int(listen[0].value_for_protocol("tcp")),
        private_network_fingerprint=mdns_fingerprint(config.cluster, config.cluster_secret),
        host=host,
    )
    return hook


def stop_mdns(hook: MdnsDialHook) -> None:
    """Unregister ``hook``'s handler from the process-wide ``peerDiscovery``."""
    peerDiscovery.unregister_peer_discovered_handler(hook.handler)


@dataclass
class MdnsDialer:
    """Dials the peers mDNS found: the smaller peer id at once, the other side after
    ``MDNS_FALLBACK_DELAY`` s if the pair is still apart. Each dial is bounded by
    ``timeout`` s; a failed peer is counted (``mdns_dial_failed``) and handed to the
    re-dialler."""

    dialer: Dialer
    redialer: Redialer
    own_id: str
    is_connected: Callable[[str], bool]
    peer_addrs: Callable[[str], list[str]]
    count: Callable[[str], None]
    timeout: float

    async def run(self, discovered: trio.MemoryReceiveChannel[PeerInfo]) -> None:
        """Dial every discovery from ``discovered`` until it closes (or cancelled)."""
        async with trio.open_nursery() as nursery:
            async for info in discovered:
                peer = str(info.peer_id)
                if self.is_connected(peer) or not self.peer_addrs(peer):
                    continue  # connected already, or another host's discovery (shared singleton)
                log.debug("mdns discovered", peer=peer, addrs=[str(a) for a in info.addrs])
                delay = 0.0 if should_dial(self.own_id, peer) else MDNS_FALLBACK_DELAY
                nursery.start_soon(self._dial, info, delay)

    async def _dial(self, info: PeerInfo, delay: float) -> None:
        await trio.sleep(delay)
        peer = str(info.peer_id)
        if self.is_connected(peer):
            return
        try:
            await self.dialer.connect(info, self.timeout)
        except DialError as exc:
            self.count("mdns_dial_failed")
            log.debug("mdns dial failed", peer=peer, error=str(exc))
            self.redialer.note_peer(peer, False)
