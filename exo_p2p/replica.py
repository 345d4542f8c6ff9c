"""A node's copy of the replicated log and State (docs/architecture.md#request-flow).

Indexed events are applied strictly in ``idx`` order: a duplicate is ignored, an event
ahead of the next index is buffered until the gap is filled. Every applied event is
appended to the node's on-disk ``EventLog`` and fsynced before any listener hears of it
(one fsync per ``offer_many`` call: a group commit), so a restarted node reads its State
back.

While this node is master (``defer_sync``), offers are written to the log at once but fsynced
only by ``sync()``, which the cluster member calls before an event leaves the node (publish,
log fetch, the commit of a lone node): one fsync per burst the master sequences, and nothing
another node or a client sees was not persisted first (docs/architecture.md#log-guarantees).
The log is compacted: ``snapshot.msgpack`` holds the State as of some index and the log
holds only the events after it; a node far behind installs a peer's snapshot instead of
replaying every event. It is compacted after a group commit that leaves it holding
``compact_every`` events or ``compact_bytes`` bytes (``exo_p2p.defaults.LOG_COMPACT_EVENTS``,
``LOG_COMPACT_BYTES``), whichever comes first (``compaction_due``): so ``events.log`` stays
below ``compact_bytes`` plus one group commit, however large the events, and the snapshot is
one State. Waiters are woken on every change.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog
import trio

from exo_p2p import defaults
from exo_p2p.eventlog import EventLog
from exo_p2p.gap_buffer import GapBuffer
from exo_p2p.state import apply, state_hash
from exo_p2p.state.chain import chain_base, chain_step
from exo_p2p.types import IndexedEvent, State

log = structlog.get_logger(__name__)


def compaction_due(events: int, size: int, *, compact_every: int, compact_bytes: int) -> bool:
    """Whether a log of ``events`` events and ``size`` bytes is compacted now (pure): at
    ``compact_every`` events or ``compact_bytes`` bytes, whichever comes first."""
    return events >= compact_every or size >= compact_bytes


class Replica:
    """State + log of one node. ``offer(event)`` returns what happened: ``"applied"``,
    ``"duplicate"``, ``"buffered"`` or ``"dropped"``; applying may drain the buffer.
    ``compact_every`` (events) and ``compact_bytes`` (bytes of ``events.log``): when the log is
    compacted (module docstring)."""

    def __init__(self, log_path: Path, *, sync: bool = True, compact_every: int = defaults.LOG_COMPACT_EVENTS,
                 compact_bytes: int = defaults.LOG_COMPACT_BYTES) -> None:
        self.log = EventLog(log_path)
        self.snapshot_path = log_path.with_name("snapshot.msgpack")
        self._sync = sync
        self.defer_sync = False
        """When True, ``offer_many`` leaves the fsync to the next ``sync()`` (the master's
        group commit); set by the cluster member while this node is master."""
        self._unsynced = False
        self.compact_every = compact_every
        self.compact_bytes = compact_bytes
        self.chain_path = log_path.with_name("snapshot.chain")
        self.snapshot = self._read_snapshot()
        state = self.snapshot
        self._chain = [self._read_base_digest(state)]
        for e in self.log.events:
            if e.idx == state.last_event_idx + 1:
                state = apply(state, e)
                self._chain.append(chain_step(self._chain[-1], e))
        self.state = state
        self._buffer = GapBuffer()
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

    def _read_base_digest(self, snapshot: State) -> bytes:
        """The chain digest at the snapshot's index: from ``snapshot.chain`` (``IDX HEX``)
        when it names that index, else ``chain_base(snapshot)`` (a fresh log, or a crash
        between the two writes: the node's chain then differs from its peers' and the first
        log check replaces its State with the master's, which is safe)."""
        try:
            idx, digest = self.chain_path.read_text().split()
            if int(idx) == snapshot.last_event_idx:
                return bytes.fromhex(digest)
        except (OSError, ValueError):
            pass
        return chain_base(snapshot)

    def _write_snapshot(self, state: State, digest: bytes) -> None:
        for path, data in (
            (self.snapshot_path, msgspec.msgpack.encode(state)),
            (self.chain_path, f"{state.last_event_idx} {digest.hex()}\n".encode()),
        ):
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        self.snapshot = state
        self._chain = [digest]

    def chain_at(self, idx: int) -> bytes | None:
        """The log's chain digest at ``idx`` (``exo_p2p.state.chain``): equal digests at an
        index mean equal logs up to it. None when ``idx`` is before the snapshot or after
        the last applied event."""
        pos = idx - self.base_idx
        return self._chain[pos] if 0 <= pos < len(self._chain) else None

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

    def events_from(self, from_idx: int, max_events: int, max_bytes: int | None = None) -> list[IndexedEvent] | None:
        """Applied events ``from_idx..`` (at most ``max_events``, and at most ``max_bytes``
        bytes of their log frames but at least one event), or None when some of them were
        compacted into the snapshot."""
        if from_idx <= self.base_idx:
            return None
        pos = from_idx - self.base_idx - 1
        end = min(len(self.log.events), pos + max(max_events, 0))
        if max_bytes is not None:
            total, stop = 0, pos
            while stop < end and (stop == pos or total + self.log.sizes[stop] <= max_bytes):
                total += self.log.sizes[stop]
                stop += 1
            end = stop
        return list(self.log.events[pos:end])

    def compact(self) -> None:
        """Snapshot the current State and empty the log (the chain digest carries over)."""
        self._write_snapshot(self.state, self._chain[-1])
        self.log.clear()

    def install_snapshot(self, state: State, digest: bytes | None = None) -> None:
        """Replace this node's State and log with a peer's snapshot (it is ahead, or this
        node's tail diverged from the master's log). ``digest`` is the peer's chain digest
        at the snapshot's index (``chain_base(state)`` when the peer sent none)."""
        self._write_snapshot(state, digest or chain_base(state))
        self.log.clear()
        self.state = state
        self._buffer.drop_through(state.last_event_idx)
        for listener in list(self.snapshot_listeners):
            listener(state)
        self._notify()

    def truncate_after(self, idx: int) -> None:
        """Drop applied events after ``idx`` and rebuild State (docs/architecture.md#log-guarantees: a node whose
        log holds indices the master's log does not takes the master's)."""
        if idx < self.base_idx:
            raise ValueError(f"cannot truncate to {idx}: events up to {self.base_idx} are in the snapshot")
        self.log.truncate_after(idx)
        state = self.snapshot
        for e in self.log.events:
            state = apply(state, e)
        self.state = state
        del self._chain[idx - self.base_idx + 1 :]
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
        """Offer one indexed event; see ``offer_many``."""
        return self.offer_many([event])[0]

    def offer_many(self, events: list[IndexedEvent]) -> list[str]:
        """Offer indexed events (any order, duplicates allowed); returns one outcome per
        event: ``"applied"``, ``"duplicate"``, ``"buffered"`` or ``"dropped"``.

        Every event that becomes applicable (including buffered ones it unblocks) is applied
        to State and appended to the log, then the log is fsynced once for all of them (a
        group commit; with ``sync=True``), and only then are listeners told, in index order:
        a listener never sees an event that a crash of the machine could take back —
        unless ``defer_sync`` is set: then the fsync waits for ``sync()``."""
        outcomes: list[str] = []
        applied: list[tuple[IndexedEvent, State]] = []
        for event in events:
            if event.idx <= self.state.last_event_idx:
                outcomes.append("duplicate")
                continue
            if event.idx > self.state.last_event_idx + 1:
                outcomes.append("buffered" if self._buffer.add(event) else "dropped")
                continue
            applied.append(self._apply(event))
            while (nxt := self._buffer.pop(self.state.last_event_idx + 1)) is not None:
                applied.append(self._apply(nxt))
            outcomes.append("applied")
        if applied:
            self._buffer.drop_through(self.state.last_event_idx)
            self._unsynced = True
            if not self.defer_sync:
                self.sync()
            self._applied(applied)
        return outcomes

    def sync(self) -> None:
        """fsync events applied since the last sync (none: no-op; ``sync=False``: no-op)."""
        if self._unsynced:
            self._unsynced = False
            if self._sync:
                self.log.sync()

    def missing_range(self) -> tuple[int, int] | None:
        """``(first, last)`` indices missing before the earliest buffered event, if any."""
        first = self._buffer.first()
        return None if first is None else (self.state.last_event_idx + 1, first - 1)

    def _apply(self, event: IndexedEvent) -> tuple[IndexedEvent, State]:
        """Apply ``event`` (the next index) to State and write it to the log (not fsynced)."""
        new_state = apply(self.state, event)
        self.log.append(event, sync=False)
        self.state = new_state
        self._chain.append(chain_step(self._chain[-1], event))
        return event, new_state

    def _applied(self, applied: list[tuple[IndexedEvent, State]]) -> None:
        """After the group commit: tell listeners, compact when due, wake waiters."""
        for event, state in applied:
            for listener in list(self.listeners):
                try:
                    listener(event, state)
                except Exception:
                    log.exception("state listener failed", idx=event.idx)
        if compaction_due(len(self.log), self.log.bytes, compact_every=self.compact_every, compact_bytes=self.compact_bytes):
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
        self.sync()
        self.log.close()
