"""Indexed events that arrived ahead of a gap, kept until the gap is filled (``exo_p2p.replica``).

Bounded in count and in bytes (``MAX_BUFFERED``, ``MAX_BUFFERED_BYTES``): while a follower
cannot fill a gap (its fetches fail) gossip keeps bringing events after it, and with events of
up to ~130 KiB a count alone would let the buffer take gigabytes. An event beyond either bound
is refused; the follower fetches it again once the gap is filled
(docs/architecture.md#log-guarantees).
"""

from __future__ import annotations

import msgspec

from exo_p2p.types import IndexedEvent

MAX_BUFFERED = 100_000
"""Out-of-order events kept while waiting for a gap to be filled (count)."""
MAX_BUFFERED_BYTES = 32 * 1024 * 1024
"""Bytes (msgpack) of out-of-order events kept while waiting for a gap to be filled: twice what
a node's log holds before it is compacted (``defaults.LOG_COMPACT_BYTES``)."""

_encode = msgspec.msgpack.Encoder().encode


class GapBuffer:
    """Events by index, with their total size. ``add`` refuses an event beyond the bounds
    (returns False); ``pop(idx)`` takes one out; ``drop_through(idx)`` forgets every event at
    or below ``idx``; ``first()`` is the lowest index held (None when empty); ``bytes`` their
    total msgpack size."""

    def __init__(self, max_events: int = MAX_BUFFERED, max_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self._events: dict[int, tuple[IndexedEvent, int]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._events)

    def __bool__(self) -> bool:
        return bool(self._events)

    def add(self, event: IndexedEvent) -> bool:
        """Keep ``event`` (an index already held is kept as it was); False when it would
        exceed ``max_events`` or ``max_bytes``."""
        if event.idx in self._events:
            return True
        size = len(_encode(event))
        if len(self._events) >= self.max_events or self.bytes + size > self.max_bytes:
            return False
        self._events[event.idx] = (event, size)
        self.bytes += size
        return True

    def pop(self, idx: int) -> IndexedEvent | None:
        """The event at ``idx``, taken out (None when not held)."""
        held = self._events.pop(idx, None)
        if held is None:
            return None
        self.bytes -= held[1]
        return held[0]

    def drop_through(self, idx: int) -> None:
        """Forget every event at or below ``idx`` (applied or replaced meanwhile)."""
        for i in [i for i in self._events if i <= idx]:
            self.bytes -= self._events.pop(i)[1]

    def clear(self) -> None:
        self._events.clear()
        self.bytes = 0

    def first(self) -> int | None:
        return min(self._events) if self._events else None
