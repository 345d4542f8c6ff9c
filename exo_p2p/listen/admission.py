"""Admission of connections that have not proven who they are yet, per source address.

A node's ticketed TCP ports (the model-transfer port ``exo_p2p.models.transfer.bulk``, the link probe
port ``exo_p2p.links.probe_server``) give a serving slot only to a connection that presents a
one-time ticket issued over libp2p, i.e. to a cluster member. Until it does, a connection
*waits*: at most ``wait`` s (its handshake deadline), in a :class:`WaitingRoom` of at most
``capacity`` places, of which one source address holds at most ``per_source``. A connection
arriving when its source already holds ``per_source`` places closes that source's oldest
waiting one; one arriving when the room is full closes the oldest waiting connection of the
source holding the most places (:func:`victim`). So a crowd of idle connections evicts
itself: a member's connection, which sends its token as soon as it is accepted, is read
before any eviction reaches it, and no host can take the places of another.

The per-source caps of the listeners that serve before any proof (the HTTP API, libp2p's
handshakes) are :func:`per_source_cap`: one source address may hold all but a reserve of the
listener's connections (``exo_p2p.listen.accept.serve_bounded``, ``exo_p2p.net.inbound``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import trio

SOURCE_RESERVE_SHARE = 8
"""One source address may hold all but 1/``SOURCE_RESERVE_SHARE`` of a listener's
connections: the rest stay for every other source."""


def per_source_cap(total: int) -> int:
    """Connections one source address may hold at once of a listener serving ``total``: all
    but ``total // SOURCE_RESERVE_SHARE``, at least 1 (4,096 → 3,584; 256 → 224). Pure."""
    return max(1, total - total // SOURCE_RESERVE_SHARE)


def victim(waiting: Iterable[tuple[object, str]], source: str, capacity: int, per_source: int) -> object | None:
    """Which waiting connection a new one from ``source`` closes, given ``waiting`` (key,
    source address) oldest first: ``source``'s oldest when it holds ``per_source`` places,
    else when ``capacity`` are taken the oldest of the source holding the most (the earliest
    such source on a tie), else None. Pure."""
    entries = list(waiting)
    counts = Counter(src for _, src in entries)
    if counts[source] >= per_source:
        return next(key for key, src in entries if src == source)
    if len(entries) < capacity:
        return None
    most = max(counts.values())
    return next(key for key, src in entries if counts[src] == most)


def peer_ip(stream: trio.SocketStream) -> str:
    """The remote IP address of ``stream`` ("" when the socket has none any more)."""
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, AttributeError, IndexError, TypeError):  # closed, or not an IP socket
        return ""


class Place:
    """One connection's place in a :class:`WaitingRoom`: its ``source`` address, the ``scope``
    its waiting runs in (cancelled at the deadline or on eviction) and whether it was
    ``evicted``."""

    def __init__(self, source: str, deadline: float) -> None:
        self.source, self.scope, self.evicted = source, trio.CancelScope(deadline=deadline), False


class WaitingRoom:
    """Connections waiting (at most ``wait`` s each) to prove themselves (module docstring):
    at most ``capacity``, ``per_source`` of one address. ``counts``: ``evicted`` (closed to
    make room), ``timed_out`` (nothing within ``wait`` s)."""

    def __init__(self, *, capacity: int, per_source: int, wait: float) -> None:
        if not 1 <= per_source <= capacity:
            raise ValueError(f"per_source {per_source} must be in 1..capacity {capacity}")
        self.capacity, self.per_source, self.wait = capacity, per_source, wait
        self._waiting: dict[Place, None] = {}  # oldest first
        self._sources: Counter[str] = Counter()
        self.counts = {"evicted": 0, "timed_out": 0}

    def __len__(self) -> int:
        return len(self._waiting)

    def crowded(self) -> bool:
        """True when ``capacity`` connections wait, or ``per_source`` from one address: the
        next arrival evicts one (a listener paces its accepts then)."""
        return len(self._waiting) >= self.capacity or any(n >= self.per_source for n in self._sources.values())

    def by_source(self) -> dict[str, int]:
        """Waiting connections per source address."""
        return {src: n for src, n in self._sources.items() if n}

    @contextmanager
    def enter(self, source: str) -> Iterator[Place]:
        """Wait in the room as a connection from ``source``: closes a victim first when needed
        (:func:`victim`), yields the :class:`Place`, whose ``scope`` the waiting must run in."""
        out = victim(((p, p.source) for p in self._waiting), source, self.capacity, self.per_source)
        if isinstance(out, Place):
            self._leave(out)
            out.evicted = True
            out.scope.cancel()
            self.counts["evicted"] += 1
        place = Place(source, trio.current_time() + self.wait)
        self._waiting[place] = None
        self._sources[source] += 1
        try:
            yield place
        finally:
            if place in self._waiting:
                self._leave(place)
                if place.scope.cancelled_caught:
                    self.counts["timed_out"] += 1

    def _leave(self, place: Place) -> None:
        del self._waiting[place]
        self._sources[place.source] -= 1
        if not self._sources[place.source]:
            del self._sources[place.source]
