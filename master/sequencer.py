"""Per-origin de-duplication of local events (docs/architecture.md#request-flow).

Each node numbers the events it produces ``1, 2, 3, …`` per boot and re-sends every event
until it sees it come back indexed, so the master receives duplicates and, after a loss,
later events before earlier ones. ``OriginSeqs`` accepts an event only when it is the next
one from its origin; everything else is dropped (the origin will re-send in order).
The table is rebuilt after a failover from the new master's State (``State.origin_seqs``,
which ``apply`` keeps for every indexed event with an origin, and which a snapshot carries
under the State hash), so a new master de-duplicates alike even when the last event of an
origin was compacted into the snapshot long ago. (Rebuilding it from the log alone forgot
such origins: their next event looked like a gap and was dropped for good.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from exo_p2p.types import IndexedEvent, LocalEvent, State

Verdict = Literal["accept", "duplicate", "gap"]


class OriginSeqs:
    """Last accepted ``origin_seq`` per ``(origin, origin_boot)``."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}

    @classmethod
    def from_log(cls, events: Iterable[IndexedEvent]) -> "OriginSeqs":
        """Rebuild the table from indexed events (their origin fields)."""
        table = cls()
        for e in events:
            if e.origin:
                key = (e.origin, e.origin_boot)
                table._last[key] = max(table._last.get(key, 0), e.origin_seq)
        return table

    @classmethod
    def from_state(cls, state: State) -> "OriginSeqs":
        """The table as of ``state`` (``State.origin_seqs``: every event indexed up to
        ``state.last_event_idx``, snapshot or log). Equals ``from_log`` of the whole log."""
        table = cls()
        for origin, boots in state.origin_seqs.items():
            for boot, seq in boots.items():
                table._last[(origin, boot)] = seq
        return table

    def as_dict(self) -> dict[tuple[str, str], int]:
        """A copy of the table: ``(origin, origin_boot) -> last accepted origin_seq``."""
        return dict(self._last)

    def check(self, event: LocalEvent) -> Verdict:
        """``accept`` if ``event`` is the next from its origin, ``duplicate`` if already
        accepted, ``gap`` if an earlier one is missing."""
        last = self._last.get((event.origin, event.origin_boot), 0)
        if event.origin_seq <= last:
            return "duplicate"
        if event.origin_seq > last + 1:
            return "gap"
        return "accept"

    def record(self, event: LocalEvent) -> None:
        """Mark ``event`` accepted (call after ``check`` said ``accept``)."""
        self._last[(event.origin, event.origin_boot)] = event.origin_seq

    def last(self, origin: str, boot: str) -> int:
        return self._last.get((origin, boot), 0)
