"""Embedding and rerank tasks stepped beside other work (docs/api.md#embeddings-and-reranking).

``EmbedWork`` keeps the embedding tasks a runner was given and runs one forward batch of at
most ``step_tokens`` padded tokens per ``step``: a request of 64 inputs is a few steps, so an
engine that also decodes (a decoder's ``TextEngine``) keeps decoding between them, and an
embedding never joins the decode batch nor holds KV. A task's answer is one
``EmbeddingChunk`` (its vectors; a rerank's scores, width 1) and a ``FinishChunk``; a bad
input is a 400 ``ErrorChunk``, a failed forward a 500 one (the engine goes on; on a split
model a ``StageFailed`` raises on and fails the runner).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import structlog

from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.types import Chunk, Embedding, EmbeddingChunk, ErrorChunk, ErrorInfo, FinishChunk, Rerank, TaskId
from exo_p2p.types.chunks import EMBEDDING_CHUNK_BYTES
from worker.embed.embedder import Embedder
from worker.engine.pipeline import StageFailed

log = structlog.get_logger(__name__)

EMBED_SHARE = 0.15
"""Share of a decoder runner's time embedding batches may take while chat rows decode (the
streams keep ~0.85 of their rate; the API node's own work for the requests comes on top):
``worker.engine.text`` paces them with a ``worker.runner.prefill_pace.PrefillPacer`` of this
share; with no row decoding they run every step."""

STEP_TOKENS = 1024
"""Padded tokens one step forwards at most (the prefill budget's counterpart: 256 tokens a
row, ``worker.engine.fair_share``); an input longer than it is one step alone."""


@dataclass
class _Running:
    task: Embedding | Rerank
    rows: list[tuple[int, ...]]
    groups: list[list[int]]
    vectors: dict[int, np.ndarray] = field(default_factory=dict)


class EmbedWork:
    """The embedding tasks of one ``Embedder``, stepped one forward batch at a time, in
    submission order."""

    def __init__(self, embedder: Embedder, step_tokens: int = STEP_TOKENS) -> None:
        self.embedder = embedder
        self.step_tokens = step_tokens
        self._tasks: OrderedDict[TaskId, Embedding | Rerank] = OrderedDict()
        self._running: _Running | None = None
        self._ended: list[Chunk] = []
        self.done = 0
        """Tasks answered (vectors or error), for stats."""
        self.tokens = 0
        """Tokens forwarded (``EngineStats.prefilled_tokens_total``)."""

    @property
    def queued(self) -> int:
        """Tasks waiting (the running one not counted)."""
        return len(self._tasks)

    def submit(self, task: Embedding | Rerank) -> None:
        """Queue ``task``."""
        self._tasks[task.task_id] = task

    def cancel(self, task_id: TaskId) -> None:
        """End ``task_id`` with a cancelled ``FinishChunk`` at the next step (unknown: nothing)."""
        if self._tasks.pop(task_id, None) is not None or (self._running and self._running.task.task_id == task_id):
            if self._running and self._running.task.task_id == task_id:
                self._running = None
            self._ended.append(FinishChunk(task_id=task_id, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0))

    def has_work(self) -> bool:
        return bool(self._tasks or self._running or self._ended)

    def step(self) -> list[Chunk]:
        """Cancelled tasks' ends, then one forward batch of the running task (taking the next
        queued one when none runs); the chunks of what ended."""
        out, self._ended = self._ended, []
        if self._running is None and self._tasks:
            _, task = self._tasks.popitem(last=False)
            try:
                rows = self.embedder.task_rows(task)
                self._running = _Running(task, rows, self.embedder.plan(rows, self.step_tokens))
            except EmbedBoundError as exc:
                return [*out, self._error(task, 400, str(exc), exc.param)]
        if self._running is not None:
            out.extend(self._advance(self._running))
        return out

    def _advance(self, run: _Running) -> list[Chunk]:
        idx = run.groups.pop(0)
        try:
            p = run.task.params
            mode, norm = (p.pooling, p.normalize) if isinstance(run.task, Embedding) else (None, None)
            for i, v in zip(idx, self.embedder.forward(run.rows, idx, mode, norm)):
                run.vectors[i] = v
            self.tokens += sum(len(run.rows[i]) for i in idx)
            if run.groups:
                return []
            self._running = None
            return self._answer(run)
        except EmbedBoundError as exc:
            self._running = None
            return [self._error(run.task, 400, str(exc), exc.param)]
        except StageFailed:
            raise  # the ranks are out of step: the runner fails (worker.embed.ring)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails its request, the engine goes on
            log.exception("embedding failed", task_id=run.task.task_id)
            self._running = None
            return [self._error(run.task, 500, f"embedding failed: {type(exc).__name__}: {exc}", None)]

    def _answer(self, run: _Running) -> list[Chunk]:
        vecs = np.stack([run.vectors[i] for i in range(len(run.rows))])
        tokens = sum(len(r) for r in run.rows)
        if isinstance(run.task, Rerank):
            vecs = self.embedder.scores(vecs)[:, None]
        else:
            vecs = self.embedder.shorten(vecs, run.task.params.dimensions, run.task.params.normalize)
        self.done += 1
        data = np.ascontiguousarray(vecs, dtype="<f4")
        step = max(1, EMBEDDING_CHUNK_BYTES // (4 * data.shape[1]))
        parts: list[Chunk] = [EmbeddingChunk(task_id=run.task.task_id, vectors=data[i:i + step].tobytes(),
                                             count=len(data[i:i + step]), dimensions=data.shape[1],
                                             prompt_tokens=tokens) for i in range(0, data.shape[0], step)]
        return [*parts,
                FinishChunk(task_id=run.task.task_id, finish_reason="stop", prompt_tokens=tokens, completion_tokens=0)]

    def _error(self, task: Embedding | Rerank, status: int, message: str, param: str | None) -> ErrorChunk:
        self.done += 1
        kind = "invalid_request_error" if status < 500 else "server_error"
        return ErrorChunk(task_id=task.task_id, error=ErrorInfo(status, message, type=kind, param=param))
