"""The engine's queue: submitted requests waiting to be accepted, in submission order.

Which is accepted next is the fairness rule's choice (``fair_share``: round-robin across
clients, each client's in submission order), not always the head. A request may be prepared
(tokenized and checked into a ``Sequence``) and still wait when its KV does not fit beside
the batch's yet; it is prepared once. Not thread-safe by itself: the engine calls
it under its lock (``submit`` and ``cancel`` come from any thread).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from exo_p2p.types.common import TaskId
from exo_p2p.types.tasks import GenerationParams
from worker.engine.sequence import Sequence


@dataclass
class Queued:
    """A submitted request: its task id, parameters, submission time (seconds of the
    engine's clock), submission order (the engine's counter) and, once prepared, its
    ``Sequence``."""

    task_id: TaskId
    params: GenerationParams
    submitted_at: float
    order: int = 0
    prepared: Sequence | None = None


class TaskQueue:
    """Requests in submission order."""

    def __init__(self) -> None:
        self._items: deque[Queued] = deque()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def task_ids(self) -> list[TaskId]:
        """The waiting requests' task ids, head first."""
        return [q.task_id for q in self._items]

    def push(self, item: Queued) -> None:
        self._items.append(item)

    @property
    def items(self) -> list[Queued]:
        """The waiting requests, head first."""
        return list(self._items)

    def find(self, task_id: TaskId) -> Queued | None:
        return next((q for q in self._items if q.task_id == task_id), None)

    def pop(self, item: Queued) -> bool:
        """Remove ``item`` when it still waits (a cancel may have removed it meanwhile)."""
        for i, q in enumerate(self._items):
            if q is item:
                del self._items[i]
                return True
        return False

    def head(self) -> Queued | None:
        return self._items[0] if self._items else None

    def pop_head(self, item: Queued) -> bool:
        """Remove ``item`` when it is still the head (a cancel may have removed it meanwhile)."""
        if self._items and self._items[0] is item:
            self._items.popleft()
            return True
        return False

    def remove(self, task_id: TaskId) -> bool:
        """Remove the request of ``task_id``; False when none waits."""
        for item in self._items:
            if item.task_id == task_id:
                self._items.remove(item)
                return True
        return False
