"""Dialling peers: one dial per peer at a time, to the addresses given, bounded in time.

py-libp2p 0.8.1's swarm makes three choices that are wrong for a cluster whose peers restart
on new ports, and each is undone here before a dial (the comments in ``Dialer`` say how): it
shares one dial in flight among every caller for a peer, it refuses for 60 s a peer whose
addresses all failed once, and it dials only the first address the peerstore lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import multiaddr
import trio
from libp2p.abc import IHost, PeerInfo
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr

from .errors import DialError

PEERSTORE_TTL = 600  # seconds a dialled address stays in the peerstore


def without_peer_id(addr: str) -> str:
    """A multiaddr without its ``/p2p/<peer id>`` part: ``/ip4/A/tcp/P``."""
    return addr.split("/p2p/")[0]


def dials_self(own_addrs: Iterable[str], target_addrs: Iterable[str]) -> bool:
    """Whether a dial of our own peer id is a dial to ourselves: every address it targets is
    one we listen on (``/p2p/`` parts ignored). Our id at a foreign address is another
    process using our identity (a copied data dir), which is dialled so that its heartbeats
    reveal the duplicate and one side refuses to join."""
    own = {without_peer_id(a) for a in own_addrs}
    return all(without_peer_id(a) in own for a in target_addrs)


class Dialer:
    """Connects this host to peers.

    Guarantees: every dial ends within its ``timeout`` seconds and raises ``DialError`` on any
    failure; two dials of one peer never overlap (the second sees the first's connection and
    only records its addresses); the addresses of a successful dial replace what the peerstore
    held for an unconnected peer.
    """

    def __init__(self, host: IHost, is_connected: Callable[[str], bool], dial_timeout: float) -> None:
        self._host = host
        self._is_connected = is_connected
        self._dial_timeout = dial_timeout
        self._locks: dict[str, trio.Lock] = {}  # one per peer ever dialled (bounded by peers)

    async def dial(self, addr: str, *, timeout: float) -> str:
        """See ``Network.dial``."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:
            raise DialError(f"bad multiaddr {addr!r}: {exc}") from exc
        await self.connect(info, timeout)
        return str(info.peer_id)

    async def dial_known(self, peer_id: str) -> None:
        """Dial ``peer_id`` at the addresses the peerstore holds for it, within the host's
        dial timeout. Raises DialError (none known, or the dial failed)."""
        pid = ID.from_base58(peer_id)
        addrs = self._host.get_peerstore().addrs(pid)
        if not addrs:
            raise DialError(f"no known address for {peer_id}")
        await self.connect(PeerInfo(pid, addrs), self._dial_timeout)

    async def connect(self, info: PeerInfo, timeout: float) -> None:
        """Connect to ``info.peer_id`` at ``info.addrs`` within ``timeout`` seconds (nothing
        to do when connected already). Raises DialError, also for a dial to ourselves."""
        if info.peer_id == self._host.get_id():
            own = [str(a) for a in self._host.get_transport_addrs()]
            if dials_self(own, [str(a) for a in info.addrs]):
                raise DialError("refusing to dial self")
        # One dial per peer at a time, each with its own addresses: the swarm would make a
        # second dial wait for the one in flight and share its result, so a stale bootstrap
        # address being retried made every dial to the peer's current address (from its
        # State profile) fail with it (a restarted node joined only after 16 s under scripts/chaos.py).
        lock = self._locks.setdefault(str(info.peer_id), trio.Lock())
        async with lock:
            if self._is_connected(str(info.peer_id)):
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
        if not self._is_connected(str(info.peer_id)):
            self._host.get_peerstore().clear_addrs(info.peer_id)
        try:
            with trio.fail_after(timeout):
                await self._host.connect(info)
        except trio.TooSlowError as exc:
            raise DialError(f"dial {info.peer_id} timed out after {timeout} s") from exc
        except Exception as exc:
            raise DialError(f"dial {info.peer_id} failed: {exc!r}") from exc
        self._host.get_peerstore().add_addrs(info.peer_id, info.addrs, PEERSTORE_TTL)
