"""What a runner sends its node (``worker.runner.protocol``): framed messages on its out pipe,
a step's chunks with each task's status, and the engine's figures and prefix digests when due.

Thread-safe sending (the heartbeat thread sends too); the rest is called from the main thread.
Rank 0 alone sends chunks and prefix digests (``emits``: every rank holds the same tokens,
so rank 0's output is the instance's); every rank reports task status.
"""

from __future__ import annotations

import threading

from exo_p2p.types import Chunk, ErrorChunk, FinishChunk, TaskId
from worker.engine.base import Engine
from worker.runner.protocol import ChunkMsg, PrefixesMsg, TaskStatusMsg, frame, write_all
from worker.runner.pulse import Pulse
from worker.runner.stats import PrefixPublisher, StatsClock


class Outbox:
    """The runner's out pipe ``out_fd``; ``emits``: this rank sends chunks (rank 0)."""

    def __init__(self, out_fd: int, emits: bool = True) -> None:
        self.out_fd, self.emits = out_fd, emits
        self._lock = threading.Lock()
        self._running: set[TaskId] = set()
        self._clock = StatsClock()
        self._prefixes = PrefixPublisher()

    def of_rank(self, rank: int) -> None:
        """This runner is ``rank`` of its instance: rank 0 alone sends chunks and digests."""
        self.emits = rank == 0

    def send(self, message: object) -> None:
        with self._lock:
            write_all(self.out_fd, frame(message))

    def chunks(self, chunks: list[Chunk]) -> list[TaskId]:
        """Send ``chunks`` (rank 0) and the status each implies: ``running`` at a task's first
        chunk, then ``complete`` / ``cancelled`` / ``failed`` at its last. Returns the ids of
        the tasks that ended."""
        ended: list[TaskId] = []
        for chunk in chunks:
            last = isinstance(chunk, (FinishChunk, ErrorChunk))
            if chunk.task_id not in self._running and not last:
                self._running.add(chunk.task_id)
                self.send(TaskStatusMsg(chunk.task_id, "running"))
            if self.emits:
                self.send(ChunkMsg(chunk))
            if not last:
                continue
            self._running.discard(chunk.task_id)
            ended.append(chunk.task_id)
            if isinstance(chunk, FinishChunk):
                self.send(TaskStatusMsg(chunk.task_id, "cancelled" if chunk.finish_reason == "cancelled" else "complete"))
            else:
                self.send(TaskStatusMsg(chunk.task_id, "failed"))
        return ended

    def cancelled(self, task_id: TaskId) -> None:
        """End a task cancelled by agreement before it started here."""
        if self.emits:
            self.send(ChunkMsg(FinishChunk(task_id=task_id, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0)))
        self.send(TaskStatusMsg(task_id, "cancelled"))

    def note_stats(self, engine: Engine, pulse: Pulse, force: bool = False) -> None:
        """The engine's figures for the next heartbeat (``worker.runner.stats``), when due;
        rank 0's prefix digests when they changed (sent before the step's chunks, so the
        master knows them before the request's client does)."""
        if self._clock.due(force):
            pulse.report(engine.stats())
        if not self.emits:
            return
        digests = engine.prefixes() if force else None
        offered = self._prefixes.offer(digests) if digests is not None else self._prefixes.flush()
        if offered is not None:
            self.send(PrefixesMsg(offered))
