"""Small pieces the cluster collaborators share: the role every one reads, counters of
dropped messages, and the two wake-up idioms of trio (``Pulse``, ``Wake``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import structlog
import trio

log = structlog.get_logger(__name__)

ROUTINE_DROPS = frozenset({"global_event_not_from_master", "global_event_duplicate", "global_event_stale_term"})
"""Drop kinds expected while joining or after a master change: logged at debug, not warning."""


@dataclass
class Role:
    """What this node is in the cluster now: the master it follows (itself when it is master,
    None: none), the term, and whether it sequences. Written only by ``role.RoleKeeper``."""

    node_id: str
    term: int = 0
    master: str | None = None
    is_master: bool = False


class Counters(dict[str, int]):
    """Counts by kind (``/state``'s ``counters``): dropped messages, fault injections, successes."""

    def add(self, kind: str, n: int = 1) -> int:
        """Add ``n`` to ``kind``; returns the new count."""
        self[kind] = self.get(kind, 0) + n
        return self[kind]

    def drop(self, kind: str) -> None:
        """Count a dropped message of ``kind``; the first of each kind is logged (drops that
        happen in normal operation, ``ROUTINE_DROPS``, at debug level)."""
        if self.add(kind) == 1:
            level = log.debug if kind in ROUTINE_DROPS else log.warning
            level("message dropped (further drops of this kind are only counted)", kind=kind)


class Pulse:
    """Wakes every task waiting right now (``fire``); a later ``wait`` waits for the next fire."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        await self._event.wait()


class Wake:
    """A latch one loop waits on: ``set`` by anyone, cleared when the loop's ``wait`` returns
    (set or not, after ``timeout`` seconds)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout: float = math.inf) -> None:
        with trio.move_on_after(timeout):
            await self._event.wait()
        self._event = trio.Event()
