"""Delivers chunks to the API requests waiting for them, and guarantees an end.

The API registers a task before submitting it (``open``) and reads its channel until a
``FinishChunk`` or ``ErrorChunk``. Chunks come from runners (locally, or over a direct
stream from rank 0's node). Because a runner or node can die without a last chunk, the
router also watches the replicated State: a task of ours whose instance failed gets an
``ErrorChunk`` (503) naming the reason at once; a task a runner failed, or one that
disappears, gets it when its own last chunk has not arrived within ``failed_grace`` /
``grace`` seconds (the runner's error chunk, e.g. a 400 for a prompt longer than the
context, may arrive after the event) — so no request waits forever (docs/architecture.md#instance-lifecycle).

Chunks from another node carry their position in the task's stream; they pass through the
task's ``exo_p2p.chunks.order.ChunkOrder`` (in order, each once) and a gap that does not fill
within ``GAP_BOUND`` seconds ends the request with a 503 naming the lost positions (a lost
last chunk: the task's removal from State ends the request after ``grace``, as above).
Either way a client never gets a response that silently lacks a piece.

A task can also vanish from State without any event saying so: when this node's log is
replaced by the one of the master that won a heal or a failover, a task that only the losing
side's log held (its ``TaskCreated`` was accepted, and acknowledged, by a master whose
divergent tail was then dropped) is simply not in the new State, and no runner will ever
run it. ``watch`` sweeps the open requests every ``SWEEP_INTERVAL`` seconds and ends each
one whose task is lost (``task_lost``) with a 503 the API may move (``exo_p2p.api.generation.resume``; scripts/chaos.py provokes it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import structlog
import trio

from exo_p2p.chunks.order import ChunkOrder
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

SWEEP_INTERVAL = 1.0
"""Seconds between two sweeps of the open requests for lost tasks (``ChunkRouter.watch``)."""

LOST_GRACE = 10.0
"""Seconds a task seen in State may be missing from it, with no chunk of it arriving,
before its request ends as lost: twice the router's ``grace`` for a deleted task's last
chunk, so a task that ended normally is always ended by its own last chunk or that rule."""

UNSEEN_BOUND = 45.0
"""Seconds a request may wait, with no chunk, for its task to appear in State at all: the
API opens the route before it submits, the submission takes up to 30 s (a failover
included) and the accepted event is applied here within 5 s after that."""


def task_lost(*, opened_at: float, last_seen: float | None, last_chunk: float | None, now: float,
              grace: float = LOST_GRACE, unseen_bound: float = UNSEEN_BOUND) -> bool:
    """Whether an open request's task is lost (pure; seconds on one monotonic clock).

    ``opened_at``: when the request registered; ``last_seen``: the last sweep that found its
    task in State (None: never found); ``last_chunk``: when its last chunk arrived (None:
    none yet). Lost when no chunk came for ``grace`` seconds and the task has been missing
    from State for ``grace`` seconds since it was last seen — or, never seen, for
    ``unseen_bound`` seconds since the request registered. A stream whose chunks keep
    coming is never lost, whatever this node's State says (it may lag)."""
    if last_chunk is not None and now - last_chunk < grace:
        return False
    if last_seen is None:
        return now - opened_at >= unseen_bound
    return now - last_seen >= grace


class _Route:
    def __init__(self) -> None:
        send, receive = trio.open_memory_channel[Chunk](math.inf)
        self.send = send
        self.receive = receive
        self.done = False
        self.instance_id: str | None = None
        self.order = ChunkOrder()
        self.watching = False
        """A gap watch is scheduled for this route (``ChunkRouter._watch_gap``)."""
        self.opened_at = trio.current_time()
        self.last_seen: float | None = None
        """The last sweep that found the task in State (``ChunkRouter.sweep``)."""
        self.last_chunk: float | None = None


class ChunkRouter:
    """Per-task channels of chunks; ``deliver`` never blocks."""

    def __init__(self, *, grace: float = 5.0, failed_grace: float = 2.0) -> None:
        self._routes: dict[str, _Route] = {}
        self._grace = grace
        self._failed_grace = failed_grace
        self._nursery: trio.Nursery | None = None
        self.undeliverable = 0
        self.duplicates = 0
        """Numbered chunks dropped because their position was already received."""
        self.gaps = 0
        """Requests ended because chunks of their stream were lost."""
        self.lost = 0
        """Requests ended because their task vanished from State (``sweep``)."""

    def bind(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def open(self, task_id: str) -> trio.MemoryReceiveChannel[Chunk]:
        route = _Route()
        self._routes[task_id] = route
        return route.receive

    def open_task_ids(self) -> frozenset[str]:
        """Task ids with a request registered here (``open`` and not yet ``close``)."""
        return frozenset(self._routes)

    def close(self, task_id: str) -> None:
        route = self._routes.pop(task_id, None)
        if route is not None:
            route.send.close()

    def deliver(self, chunk: Chunk, seq: int | None = None) -> None:
        """Hand ``chunk`` to its task's channel; chunks after the last one are dropped.

        ``seq``: the chunk's position in its task's stream (chunks from another node); it is
        delivered once, after every earlier one (``ChunkOrder``). None: delivered as it comes
        (this node's own runner, or an error this node makes)."""
        route = self._routes.get(chunk.task_id)
        if route is None or route.done:
            self.undeliverable += 1
            return
        if seq is None:
            self._send(route, chunk)
            return
        before = route.order.duplicates
        for ready in route.order.offer(seq, chunk, trio.current_time()):
            self._send(route, ready)
        self.duplicates += route.order.duplicates - before
        if route.done or not route.order.held:
            return
        if route.order.overdue(trio.current_time()):
            self._fail_gap(chunk.task_id, route)
        elif self._nursery is not None and not route.watching:
            route.watching = True
            self._nursery.start_soon(self._watch_gap, chunk.task_id, route)

    def _send(self, route: _Route, chunk: Chunk) -> None:
        if route.done:
            return
        route.last_chunk = trio.current_time()
        route.send.send_nowait(chunk)
        if isinstance(chunk, (FinishChunk, ErrorChunk)):
            route.done = True
            route.send.close()

    def _fail_gap(self, task_id: str, route: _Route) -> None:
        missing = route.order.missing()
        self.gaps += 1
        log.warning("token stream lost chunks", task_id=task_id, missing=missing)
        first, last = missing or (route.order.next_seq, route.order.next_seq)
        where = f"chunk {first} was" if first == last else f"chunks {first}-{last} were"
        self.fail(task_id, 503, f"generation failed: {where} lost on the way from the model's node; retry")

    async def _watch_gap(self, task_id: str, route: _Route) -> None:
        """End ``task_id`` when the chunks its held ones wait for do not come in time."""
        try:
            while not route.done and self._routes.get(task_id) is route and route.order.held:
                since = route.order.waiting_since()
                assert since is not None
                await trio.sleep_until(since + route.order.bound)
                if not route.done and route.order.overdue(trio.current_time()):
                    self._fail_gap(task_id, route)
        finally:
            route.watching = False

    def sweep(self, state: State, now: float) -> list[str]:
        """End every open request whose task is lost (``task_lost``) with a 503
        ``generation_failed``; returns their task ids."""
        lost = []
        for task_id, route in list(self._routes.items()):
            if route.done:
                continue
            if task_id in state.tasks:
                route.last_seen = now
                continue
            if task_lost(opened_at=route.opened_at, last_seen=route.last_seen, last_chunk=route.last_chunk, now=now):
                lost.append(task_id)
                log.warning("task lost from State; ending its request", task_id=task_id, seen=route.last_seen is not None)
                self.lost += 1
                self.fail(task_id, 503, "generation failed: the task is no longer in the cluster's State (its log was replaced after a failover)")
        return lost

    async def watch(self, state: Callable[[], State]) -> None:
        """Sweep (``sweep``) every ``SWEEP_INTERVAL`` seconds until cancelled."""
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            self.sweep(state(), trio.current_time())

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
        route = self._routes.get(task_id)
        if route is not None and not route.done and route.order.held:
            self._fail_gap(task_id, route)  # the more precise reason: chunks were lost
        else:
            self.fail(task_id, 503, reason)
