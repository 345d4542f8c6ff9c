"""What a supervisor says when one of its runner's tasks ends: one log line per task and rank.

The runner's chunks are counted as they pass (``TaskEnds.count``: per task, the completion
tokens already sent and the last chunk; only rank 0 sends chunks) and the task-status message
that ends a task logs them (``TaskEnds.log_end``) and forgets the task, so the record holds
only tasks in flight.
"""

from __future__ import annotations

import structlog

from exo_p2p.types import Chunk, ErrorChunk, FinishChunk, TokenChunk

log = structlog.get_logger(__name__)


class TaskEnds:
    """Per task in flight on one runner: tokens sent as chunks, and the last chunk."""

    def __init__(self, runner_id: str, rank: int) -> None:
        self.runner_id = runner_id
        self.rank = rank
        self._tokens_sent: dict[str, int] = {}
        self._finished: dict[str, FinishChunk | ErrorChunk] = {}

    def count(self, chunk: Chunk) -> None:
        """Note ``chunk``, one the runner sent."""
        if isinstance(chunk, TokenChunk):
            self._tokens_sent[chunk.task_id] = max(self._tokens_sent.get(chunk.task_id, 0), chunk.completion_tokens)
        elif isinstance(chunk, (FinishChunk, ErrorChunk)):
            self._finished[chunk.task_id] = chunk

    def log_end(self, task_id: str, status: str) -> None:
        """One line for ``task_id``, ended here with ``status``: on the rank that sends chunks,
        the completion tokens the runner reports and the tokens it had sent (a cancelled task
        reports at most what it sent plus the steps in flight). Info, except a task that
        completed on a rank that sends no chunks (routine: debug)."""
        last = self._finished.pop(task_id, None)
        sent = self._tokens_sent.pop(task_id, None)
        routine = last is None and sent is None and status == "complete"
        level = log.debug if routine else log.info
        level(
            "runner task ended",
            runner_id=self.runner_id,
            rank=self.rank,
            task_id=task_id,
            status=status,
            finish_reason=last.finish_reason if isinstance(last, FinishChunk) else None,
            completion_tokens=last.completion_tokens if isinstance(last, FinishChunk) else None,
            tokens_sent=sent,
        )
