"""Delivers chunks to the API requests waiting for them, and guarantees an end.

The API registers a task before submitting it (``open``) and reads its channel until a
``FinishChunk`` or ``ErrorChunk``. Chunks come from runners (locally, or over a direct
stream from rank 0's node). Because a runner or node can die without a last chunk, the
router also watches the replicated State: a task of ours whose instance failed gets an
``ErrorChunk`` (503) naming the reason at once; a task a runner failed, or one that
disappears, gets it when its own last chunk has not arrived within ``failed_grace`` /
``grace`` seconds (the runner's error chunk, e.g. a 400 for a prompt longer than the
context, may arrive after the event) — so no request waits forever (design.md §5b, §5c).
"""

from __future__ import annotations

import math

import structlog
import trio

from exo_p2p.types import (
    Chunk,
    ErrorChunk,
    ErrorInfo,
    Event,
    FinishChunk,
    IndexedEvent,
    State,
    TaskDeleted,
    TaskStatusUpdated,
)

log = structlog.get_logger(__name__)


class _Route:
    def __init__(self) -> None:
        send, receive = trio.open_memory_channel[Chunk](math.inf)
        self.send = send
        self.receive = receive
        self.done = False
        self.instance_id: str | None = None


class ChunkRouter:
    """Per-task channels of chunks; ``deliver`` never blocks."""

    def __init__(self, *, grace: float = 5.0, failed_grace: float = 2.0) -> None:
        self._routes: dict[str, _Route] = {}
        self._grace = grace
        self._failed_grace = failed_grace
        self._nursery: trio.Nursery | None = None
        self.undeliverable = 0

    def bind(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def open(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        route = _Route()
        self._routes[task_id] = route
        return route.receive

    def close(self, task_id: str) -> None:
        route = self._routes.pop(task_id, None)
        if route is not None:
            route.send.close()

    def deliver(self, chunk: Chunk) -> None:
        """Hand ``chunk`` to its task's channel; chunks after the last one are dropped."""
        route = self._routes.get(chunk.task_id)
        if route is None or route.done:
            self.undeliverable += 1
            return
        route.send.send_nowait(chunk)
        if isinstance(chunk, (FinishChunk, ErrorChunk)):
            route.done = True
            route.send.close()

    def fail(self, task_id: str, status: int, message: str) -> None:
        """End ``task_id`` with an error chunk unless it already ended."""
        route = self._routes.get(task_id)
        if route is None or route.done:
            return
        self.deliver(ErrorChunk(task_id=task_id, error=ErrorInfo(status, message, "server_error", code="generation_failed")))  # type: ignore[arg-type]

    def on_event(self, indexed: IndexedEvent, state: State) -> None:
        """State listener: end the requests whose task failed or vanished."""
        event: Event = indexed.event
        if isinstance(event, TaskStatusUpdated) and event.task_id in self._routes:
            record = state.tasks.get(event.task_id)
            if record is not None:
                self._routes[event.task_id].instance_id = record.task.instance_id
            if event.status == "failed":
                route = self._routes[event.task_id]
                instance = state.instances.get(route.instance_id) if route.instance_id else None
                if (instance is None or instance.failed_reason) or self._nursery is None:
                    self.fail(event.task_id, 503, self._reason(state, event.task_id))
                else:
                    # a runner failed the task itself (prompt too long, out of memory, ...)
                    # and sent its error chunk, which may arrive after this event (another
                    # node's direct stream vs gossip): give it ``failed_grace`` seconds
                    self._nursery.start_soon(self._fail_later, event.task_id, self._reason(state, event.task_id), self._failed_grace)
        elif isinstance(event, TaskDeleted) and event.task_id in self._routes:
            route = self._routes[event.task_id]
            if not route.done and self._nursery is not None:
                self._nursery.start_soon(self._fail_later, event.task_id, self._reason(state, event.task_id))

    def _reason(self, state: State, task_id: str) -> str:
        route = self._routes.get(task_id)
        instance = state.instances.get(route.instance_id) if route and route.instance_id else None
        if instance is not None and instance.failed_reason:
            return f"generation failed: {instance.failed_reason}"
        if route and route.instance_id and instance is None:
            return "generation failed: its instance was deleted"
        return "generation failed: the task ended without a result"

    async def _fail_later(self, task_id: str, reason: str, delay: float | None = None) -> None:
        await trio.sleep(self._grace if delay is None else delay)
        self.fail(task_id, 503, reason)
