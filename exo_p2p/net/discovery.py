"""Finding peers: bootstrap/known-peer re-dialling with backoff, and mDNS dial-on-discover.

Re-dialling makes clusters form where multicast is blocked: every bootstrap address, and every
peer this node was once connected to, is dialled again while not connected, first after
``interval`` seconds, then with doubling backoff up to ``max_backoff``; a success resets it.
A non-bootstrap peer gone for ``forget_after`` seconds is dropped from the list (no stale
address lingers). Each dial is bounded by the dialler's own timeout; at most
``MAX_PARALLEL_DIALS`` run at once.

mDNS (docs/architecture.md#networking-notes, note 6): py-libp2p's discovery callback runs on zeroconf's thread; it is handed
to trio with ``TrioToken.run_sync_soon`` (non-blocking: zeroconf's thread never waits on trio,
so stopping zeroconf from trio cannot deadlock). Only the side with the smaller peer id dials
at once, so a pair gets one connection; the other side dials too if still unconnected after
``MDNS_FALLBACK_DELAY`` seconds (a lost announcement must not leave a pair apart).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
import trio
from libp2p.abc import PeerInfo

log = structlog.get_logger(__name__)

MAX_PARALLEL_DIALS = 4
MDNS_FALLBACK_DELAY = 3.0  # seconds


def next_backoff(previous: float, *, initial: float, maximum: float) -> float:
    """Delay before the next attempt after a failure: double, within [initial, maximum]."""
    return min(maximum, max(initial, previous * 2))


def should_dial(own_id: str, other_id: str) -> bool:
    """Whether this node dials a discovered peer: only the smaller peer id dials."""
    return own_id < other_id


@dataclass
class _Target:
    addr: str | None  # bootstrap multiaddr, or None to use the peerstore's addresses
    next_at: float
    backoff: float
    gone_since: float | None
    warned: bool = False  # a failure of this bootstrap address was logged as a warning


class Redialer:
    """Keeps bootstrap and once-seen peers connected.

    ``dial_addr(multiaddr) -> peer_id`` and ``dial_peer(peer_id)`` must raise on failure and be
    bounded in time.
    """

    def __init__(
        self,
        *,
        dial_addr: Callable[[str], Awaitable[str]],
        dial_peer: Callable[[str], Awaitable[None]],
        is_connected: Callable[[str], bool],
        bootstrap: tuple[str, ...],
        interval: float,
        max_backoff: float,
        forget_after: float,
        counters: dict[str, int],
    ) -> None:
        self._dial_addr = dial_addr
        self._dial_peer = dial_peer
        self._is_connected = is_connected
        self._interval = interval
        self._max_backoff = max_backoff
        self._forget_after = forget_after
        self._counters = counters
        self._targets: dict[str, _Target] = {}  # key: peer id
        self._in_flight: set[str] = set()
        self.failing: dict[str, str] = {}
        """Bootstrap address → the error of its last dial, while it fails (for ``doctor``)."""
        for addr in bootstrap:
            self._targets[peer_of(addr)] = _Target(addr, 0.0, 0.0, None)

    def note_peer(self, peer_id: str, connected: bool) -> None:
        """Record a peer's connection change (from the PeerTracker)."""
        now = trio.current_time()
        target = self._targets.get(peer_id)
        if target is None:
            target = self._targets[peer_id] = _Target(None, now, 0.0, None)
        if connected:
            target.backoff = 0.0
            target.gone_since = None
        else:
            target.gone_since = now
            target.next_at = now + self._interval

    def known_peers(self) -> set[str]:
        return set(self._targets)

    async def run(self) -> None:
        """Loop forever (cancel to stop): dial due, unconnected targets."""
        limiter = trio.CapacityLimiter(MAX_PARALLEL_DIALS)
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                for key, target in list(self._targets.items()):
                    if self._is_connected(key) or key in self._in_flight:
                        continue
                    if target.addr is None and target.gone_since is not None:
                        if now - target.gone_since > self._forget_after:
                            del self._targets[key]
                            continue
                    if now >= target.next_at:
                        self._in_flight.add(key)
                        nursery.start_soon(self._attempt, key, target, limiter)
                await trio.sleep(self._interval)

    async def _attempt(self, key: str, target: _Target, limiter: trio.CapacityLimiter) -> None:
        try:
            async with limiter:
                if target.addr is not None:
                    await self._dial_addr(target.addr)
                else:
                    await self._dial_peer(key)
            if target.warned:
                log.info("bootstrap peer reached", addr=target.addr)
                target.warned = False
            if target.addr is not None:
                self.failing.pop(target.addr, None)
            target.backoff = 0.0
        except Exception as exc:  # any dial failure: back off and retry later
            self._counters["redial_failed"] = self._counters.get("redial_failed", 0) + 1
            if target.addr is not None:
                self.failing[target.addr] = str(exc)[:300] or type(exc).__name__
            if target.addr is not None and not target.warned:
                # a wrong --bootstrap (dead port, another node's id, another cluster's secret)
                # is said once, loudly; the node keeps retrying with backoff
                log.warning("bootstrap peer unreachable; retrying with backoff", addr=target.addr, error=str(exc)[:300])
                target.warned = True
            target.backoff = next_backoff(
                target.backoff, initial=self._interval, maximum=self._max_backoff
            )
            target.next_at = trio.current_time() + target.backoff
            log.debug("redial failed", target=key, error=repr(exc), retry_in=target.backoff)
        finally:
            self._in_flight.discard(key)


def peer_of(multiaddr: str) -> str:
    """The peer id at the end of ``/.../p2p/<peer id>``. Raises ValueError if there is none."""
    if "/p2p/" not in multiaddr:
        raise ValueError(f"multiaddr has no /p2p/<peer id>: {multiaddr}")
    peer = multiaddr.rsplit("/p2p/", 1)[1].split("/", 1)[0]
    if not peer:
        raise ValueError(f"multiaddr has no /p2p/<peer id>: {multiaddr}")
    return peer


class MdnsDialHook:
    """The peerDiscovery handler for one host (register ``handler``; unregister on close).

    Register it *before* the mDNS listener is created: zeroconf starts browsing at once, and a
    discovery that finds no handler is lost (the peer that should have dialled never does).
    Discoveries are posted to a trio channel (dropped and counted if it is full), so they wait
    there until the host is up.

    ``peerDiscovery`` is a process-wide singleton, so with several hosts in one process every
    handler hears every host's discoveries; the consumer filters with the host's peerstore
    (its own listener wrote the addresses).
    """

    def __init__(
        self,
        *,
        own_id: str,
        token: trio.lowlevel.TrioToken,
        send: trio.MemorySendChannel[PeerInfo],
    ) -> None:
        self._own_id = own_id
        self._token = token
        self._send = send
        self.dropped = 0

    def handler(self, peer_info: PeerInfo) -> None:
        """Called on zeroconf's thread; never blocks it."""
        if str(peer_info.peer_id) == self._own_id:
            return
        try:
            self._token.run_sync_soon(self._post, peer_info)
        except trio.RunFinishedError:
            pass

    def _post(self, peer_info: PeerInfo) -> None:
        try:
            self._send.send_nowait(peer_info)
        except trio.WouldBlock:
            self.dropped += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
