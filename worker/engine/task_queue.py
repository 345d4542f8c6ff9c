"""The engine's queue: submitted requests waiting to be accepted, first come, first served.

A request is accepted from the head only (later ones wait behind it). The head may be
prepared (tokenized and checked into a ``Sequence``) and still wait there when its KV does not
fit beside the batch's yet; it is prepared once. Not thread-safe by itself: the engine calls
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
    engine's clock) and, once prepared, its ``Sequence``."""

    task_id: TaskId
    params: GenerationParams
    submitted_at: float
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
