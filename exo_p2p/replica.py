"""A node's copy of the replicated log and State (design.md §4.4, §5a).

Indexed events are applied strictly in ``idx`` order: a duplicate is ignored, an event
ahead of the next index is buffered until the gap is filled. Every applied event is
appended to the node's on-disk ``EventLog``, so a restarted node reads its State back.
The log is compacted: ``snapshot.msgpack`` holds the State as of some index and the log
holds only the events after it; a node far behind installs a peer's snapshot instead of
replaying every event. Waiters are woken on every change.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
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

    def __init__(self, log_path: Path, *, sync: bool = True, compact_every: int = 20_000) -> None:
        self.log = EventLog(log_path)
        self.snapshot_path = log_path.with_name("snapshot.msgpack")
        self._sync = sync
        self.compact_every = compact_every
        self.snapshot = self._read_snapshot()
        state = self.snapshot
        for e in self.log.events:
            if e.idx == state.last_event_idx + 1:
                state = apply(state, e)
        self.state = state
        self._buffer: dict[int, IndexedEvent] = {}
        self._changed = trio.Event()
        self.listeners: list[Callable[[IndexedEvent, State], None]] = []
        self.snapshot_listeners: list[Callable[[State], None]] = []

    def _read_snapshot(self) -> State:
        if not self.snapshot_path.exists():
            return State()
        try:
            return msgspec.msgpack.decode(self.snapshot_path.read_bytes(), type=State)
        except (msgspec.DecodeError, OSError) as exc:
            log.error("snapshot unreadable; starting from the log alone", path=str(self.snapshot_path), error=str(exc))
            return State()

    def _write_snapshot(self, state: State) -> None:
        tmp = self.snapshot_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.msgpack.encode(state))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.snapshot_path)
        self.snapshot = state

    @property
    def base_idx(self) -> int:
        """Index of the snapshot: events up to it are only in the snapshot."""
        return self.snapshot.last_event_idx

    @property
    def last_term(self) -> int:
        return self.log.events[-1].term if self.log.events else self.snapshot.term

    def term_at(self, idx: int) -> int | None:
        """Term of event ``idx`` if this node has it in its log (None otherwise; the
        snapshot's own index gives the snapshot's term)."""
        if idx == self.base_idx:
            return self.snapshot.term
        pos = idx - self.base_idx - 1
        if 0 <= pos < len(self.log.events) and self.log.events[pos].idx == idx:
            return self.log.events[pos].term
        return None

    def events_from(self, from_idx: int, max_events: int) -> list[IndexedEvent] | None:
        """Applied events ``from_idx..`` (at most ``max_events``), or None when some of them
        were compacted into the snapshot."""
        if from_idx <= self.base_idx:
            return None
        pos = from_idx - self.base_idx - 1
        return list(self.log.events[pos : pos + max_events])

    def compact(self) -> None:
        """Snapshot the current State and empty the log."""
        self._write_snapshot(self.state)
        self.log.clear()

    def install_snapshot(self, state: State) -> None:
        """Replace this node's State and log with a peer's snapshot (it is ahead, or this
        node's tail diverged from the master's log)."""
        self._write_snapshot(state)
        self.log.clear()
        self.state = state
        self._buffer = {i: e for i, e in self._buffer.items() if i > state.last_event_idx}
        for listener in list(self.snapshot_listeners):
            listener(state)
        self._notify()

    def truncate_after(self, idx: int) -> None:
        """Drop applied events after ``idx`` and rebuild State (design.md §5a: a node whose
        log holds indices the master's log does not takes the master's)."""
        if idx < self.base_idx:
            raise ValueError(f"cannot truncate to {idx}: events up to {self.base_idx} are in the snapshot")
        self.log.truncate_after(idx)
        state = self.snapshot
        for e in self.log.events:
            state = apply(state, e)
        self.state = state
        self._buffer.clear()
        for listener in list(self.snapshot_listeners):
            listener(state)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

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
        if len(self.log.events) >= self.compact_every:
            self.compact()
        self._notify()

    async def wait_changed(self) -> None:
        """Return after the next applied event."""
        await self._changed.wait()

    async def wait_for_idx(self, idx: int) -> None:
        """Return once events up to ``idx`` are applied."""
        while self.state.last_event_idx < idx:
            await self.wait_changed()

    def close(self) -> None:
        self.log.close()
