"""Per-peer connect/disconnect notifications (docs/architecture.md#networking-notes, note 11).

libp2p notifies per *connection*; a peer may hold several. ``PeerTracker`` turns that into
one ``(peer_id, True)`` when a peer's first connection opens and one ``(peer_id, False)`` when
its last one closes, fanned out to every listener channel. A listener that does not keep up
loses events (counted in ``dropped``), it never blocks libp2p.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from multiaddr import Multiaddr

PeerEvent = tuple[str, bool]


class PeerTracker(INotifee):
    """Tracks which peers have at least one live connection."""

    def __init__(self, on_change: Callable[[str, bool], None] | None = None) -> None:
        self._conns: dict[str, set[int]] = {}
        self._listeners: list[trio.MemorySendChannel[PeerEvent]] = []
        self._on_change = on_change
        self.dropped = 0

    def connected_peers(self) -> set[str]:
        return set(self._conns)

    def open_listener(self, buffer: int = 256) -> trio.MemoryReceiveChannel[PeerEvent]:
        """A new channel that first holds ``(peer, True)`` for every peer connected now, then
        every later change (so a late listener misses nothing)."""
        send, recv = trio.open_memory_channel[PeerEvent](max(buffer, len(self._conns)))
        for peer_id in self._conns:
            send.send_nowait((peer_id, True))
        self._listeners.append(send)
        return recv

    def close(self) -> None:
        for send in self._listeners:
            send.close()
        self._listeners.clear()

    def _emit(self, peer_id: str, up: bool) -> None:
        if self._on_change is not None:
            self._on_change(peer_id, up)
        for send in list(self._listeners):
            try:
                send.send_nowait((peer_id, up))
            except trio.WouldBlock:
                self.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._listeners.remove(send)

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = str(conn.muxed_conn.peer_id)
        conns = self._conns.setdefault(peer_id, set())
        first = not conns
        conns.add(id(conn))
        if first:
            self._emit(peer_id, True)

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = str(conn.muxed_conn.peer_id)
        conns = self._conns.get(peer_id)
        if conns is None:
            return
        conns.discard(id(conn))
        if not conns:
            del self._conns[peer_id]
            self._emit(peer_id, False)

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        pass
