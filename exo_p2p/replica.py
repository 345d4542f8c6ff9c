"""A node's copy of the replicated log and State (design.md §4.4).

Indexed events are applied strictly in ``idx`` order: a duplicate is ignored, an event
ahead of the next index is buffered until the gap is filled. Every applied event is
appended to the node's on-disk ``EventLog`` first, so a restarted node reads its State
back. Waiters are woken on every change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
import trio

from exo_p2p.eventlog import EventLog
from exo_p2p.state import apply, state_hash
from exo_p2p.types import IndexedEvent, State

log = structlog.get_logger(__name__)

MAX_BUFFERED = 100_000
"""Out-of-order events kept while waiting for a gap to be filled; beyond this the furthest
ones are dropped (they will be fetched again)."""


class Replica:
    """State + log of one node. ``offer(event)`` returns what happened: ``"applied"``,
    ``"duplicate"``, ``"buffered"`` or ``"dropped"``; applying may drain the buffer."""

    def __init__(self, log_path: Path, *, sync: bool = True) -> None:
        self.log = EventLog(log_path)
        self._sync = sync
        state = State()
        for e in self.log.events:
            state = apply(state, e)
        self.state = state
        self._buffer: dict[int, IndexedEvent] = {}
        self._changed = trio.Event()
        self.listeners: list[Callable[[IndexedEvent, State], None]] = []

    @property
    def last_idx(self) -> int:
        return self.state.last_event_idx

    def hash(self) -> str:
        return state_hash(self.state)

    def offer(self, event: IndexedEvent) -> str:
        if event.idx <= self.state.last_event_idx:
            return "duplicate"
        if event.idx > self.state.last_event_idx + 1:
            if len(self._buffer) >= MAX_BUFFERED:
                return "dropped"
            self._buffer.setdefault(event.idx, event)
            return "buffered"
        self._apply(event)
        while (nxt := self._buffer.pop(self.state.last_event_idx + 1, None)) is not None:
            self._apply(nxt)
        self._buffer = {i: e for i, e in self._buffer.items() if i > self.state.last_event_idx}
        return "applied"

    def missing_range(self) -> tuple[int, int] | None:
        """``(first, last)`` indices missing before the earliest buffered event, if any."""
        if not self._buffer:
            return None
        return self.state.last_event_idx + 1, min(self._buffer) - 1

    def _apply(self, event: IndexedEvent) -> None:
        new_state = apply(self.state, event)
        self.log.append(event, sync=self._sync)
        self.state = new_state
        for listener in list(self.listeners):
            try:
                listener(event, new_state)
            except Exception:
                log.exception("state listener failed", idx=event.idx)
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return after the next applied event."""
        await self._changed.wait()

    async def wait_for_idx(self, idx: int) -> None:
        """Return once events up to ``idx`` are applied."""
        while self.state.last_event_idx < idx:
            await self.wait_changed()

    def close(self) -> None:
        self.log.close()
