"""Token streams checked end to end: positions, in-order delivery, duplicates, gaps.

Rank 0's node numbers every chunk of a task ``1, 2, 3, …`` (``ChunkNumbering``) before it
leaves for the node that owns the request; that node's ``ChunkOrder`` (one per task)
delivers the chunks in position order, drops the ones it already has, and holds the ones that
came early. The rule, as a guarantee: what a request's client receives is always a prefix
of what rank 0 sent, in order, each chunk once. A chunk that waits for an earlier one longer
than ``GAP_BOUND`` seconds (or more than ``MAX_HELD`` waiting chunks) means the earlier one is
lost: the caller ends the request with an error (``overdue``), never with text that silently
lacks a piece. The chunk sender sends one batch at a time per destination, in order, so
without a fault a gap never forms; a batch given up after its retries makes one that never
fills.

Pure: no clock (callers pass ``now``, seconds on any monotonic clock), no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

from exo_p2p.types import Chunk, ErrorChunk, FinishChunk

GAP_BOUND = 5.0
"""Seconds a chunk may wait for an earlier one of its task before the request ends with an
error: longer than one delivery attempt of the chunk sender plus its pause (the sender
sends in order; a reordered stream only comes from a fault), short against the 10 s
request-error bound of a dead runner."""

MAX_HELD = 4096
"""Chunks of one task held waiting for an earlier one at most; one more is an overdue gap."""

MAX_NUMBERED_TASKS = 100_000
"""Tasks whose next position ``ChunkNumbering`` remembers at most (oldest forgotten first)."""


class ChunkNumbering:
    """Sender side: the next position of each task's chunks (1 for its first chunk).

    A task is forgotten after its last chunk (``FinishChunk`` or ``ErrorChunk``); a chunk of a
    task after that starts at 1 again, which the receiver drops as a duplicate (its request
    already ended)."""

    def __init__(self) -> None:
        self._next: OrderedDict[str, int] = OrderedDict()

    def number(self, chunk: Chunk) -> int:
        """The position of ``chunk`` in its task's stream (1, 2, 3, …)."""
        seq = self._next.pop(chunk.task_id, 1)
        if not isinstance(chunk, (FinishChunk, ErrorChunk)):
            self._next[chunk.task_id] = seq + 1
            while len(self._next) > MAX_NUMBERED_TASKS:
                self._next.popitem(last=False)
        return seq


class ChunkOrder:
    """Receiver side, one task: reassembles its stream from chunks in any order.

    ``offer(seq, chunk, now)`` returns the chunks that can be delivered now, in order
    (``chunk`` itself and any held ones it unblocks); a position already delivered or held
    is counted in ``duplicates`` and dropped. ``overdue(now)`` says the oldest held chunk has
    waited ``GAP_BOUND`` seconds (or ``MAX_HELD`` are held): the missing ones are lost."""

    def __init__(self, *, bound: float = GAP_BOUND, max_held: int = MAX_HELD) -> None:
        self.next_seq = 1
        """The position delivered next (everything before it was delivered)."""
        self.duplicates = 0
        self._held: dict[int, tuple[Chunk, float]] = {}
        self.bound = bound
        """Seconds a held chunk waits for the earlier ones before the gap counts as lost."""
        self._max_held = max_held

    def offer(self, seq: int, chunk: Chunk, now: float) -> list[Chunk]:
        """Take the chunk at position ``seq`` (≥ 1) received at ``now``; returns what to
        deliver now, in position order."""
        if seq < self.next_seq or seq in self._held:
            self.duplicates += 1
            return []
        if seq > self.next_seq:
            self._held[seq] = (chunk, now)
            return []
        out = [chunk]
        self.next_seq += 1
        while (held := self._held.pop(self.next_seq, None)) is not None:
            out.append(held[0])
            self.next_seq += 1
        return out

    @property
    def held(self) -> int:
        """Chunks waiting for an earlier one."""
        return len(self._held)

    def waiting_since(self) -> float | None:
        """When the oldest held chunk arrived (None: nothing is held)."""
        return min((at for _, at in self._held.values()), default=None)

    def missing(self) -> tuple[int, int] | None:
        """The first gap, ``(first, last)`` positions missing, or None when nothing is held."""
        if not self._held:
            return None
        return self.next_seq, min(self._held) - 1

    def overdue(self, now: float) -> bool:
        """Whether the gap before the held chunks will be taken as lost: the oldest held one
        has waited ``bound`` seconds, or ``max_held`` chunks are held."""
        since = self.waiting_since()
        return since is not None and (now - since >= self.bound or len(self._held) >= self._max_held)
