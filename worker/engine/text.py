"""The text-generation engine behind the runner's seam (``worker.engine.base.Engine``).

``TextEngine`` wraps the batching scheduler (``worker.engine.scheduler.Engine``) with what a
runner needs of any engine: tasks as ``WorkTask``s, the agreement point (a step that accepts
or prefills), the long-prefill pacing (``worker.runner.prefill_pace``: on one rank the pacer
holds directly; on a multi-rank instance it proposes and the rounds agree), the tokens sampled
for requests, and its ``EngineStats``. Embedding and rerank tasks go to its pooling branch,
``embed`` (``worker.embed.work.EmbedWork``: prefill then pool, one bounded forward a step after
the decode step, never in the decode batch, paced to ``EMBED_SHARE`` of the time while rows
decode, as long prefills are; on a multi-rank instance, whose ranks must step alike, by the
agreed hold, which any rank's long-prompt or embedding pacer may ask for). Without a pooling
branch or for a kind it does not do, a task ends with a 400 ``ErrorChunk`` at the next step.
"""

from __future__ import annotations

import time
from typing import Any

from exo_p2p.types import Chunk, Embedding, ErrorChunk, ErrorInfo, Rerank, TaskId, TextGeneration, TokenChunk, WorkTask
from exo_p2p.types.observe import EngineStats
from worker.engine.scheduler import Engine
from worker.embed.work import EMBED_SHARE
from worker.runner.prefill_pace import PrefillPacer
from worker.runner.stats import engine_stats


DISK_CLOSE_SECONDS = 10.0
"""Seconds a closing runner waits at most for its prompt cache's queued disk writes."""


class TextEngine:
    """The ``Engine`` of a text-generation shard (see the module docstring). ``agreed``: a
    multi-rank instance's rank (its hold comes from the rounds, ``agreed_hold``);
    ``kv_bytes_per_token``: this rank's, for its stats; ``warmup_rate``: decode steps per
    second at warm-up."""

    def __init__(self, engine: Engine, *, agreed: bool = False, kv_bytes_per_token: int = 0,
                 warmup_rate: float = 0.0, embed: Any = None) -> None:
        self.engine = engine
        self.embed = embed
        """The pooling branch (``worker.embed.work.EmbedWork``), None where the model cannot embed here."""
        self.embed_pacer = PrefillPacer(EMBED_SHARE)  # embeddings' share of the time while rows decode
        self.agreed = agreed
        self.kv_bytes_per_token = kv_bytes_per_token
        self.warmup_rate = warmup_rate
        self.pacer = PrefillPacer()  # long prompts' share of the time while rows decode
        self.generated = 0
        """Tokens sampled for requests (``EngineStats.generated_tokens_total``)."""
        self._refused: list[Chunk] = []

    def submit(self, task: WorkTask) -> None:
        if isinstance(task, TextGeneration):
            self.engine.submit(task.task_id, task.params)
            return
        if isinstance(task, Embedding | Rerank) and self.embed is not None:
            self.embed.submit(task)
            return
        message = f"this runner's engine does text generation, not {task.task_kind!r} work"
        if isinstance(task, Embedding | Rerank):
            message = "this model cannot embed (its pooling files could not be read: see the runner's log)"
        self._refused.append(ErrorChunk(task_id=task.task_id, error=ErrorInfo(400, message, code="unsupported_task")))

    def cancel(self, task_id: TaskId) -> None:
        self.engine.cancel(task_id)
        if self.embed is not None:
            self.embed.cancel(task_id)

    def has_work(self) -> bool:
        return bool(self._refused) or self.engine.has_work() or (self.embed is not None and self.embed.has_work())

    def must_agree(self) -> bool:
        return self.engine.in_prefill

    def hold_proposal(self) -> bool:
        return self.pacer.hold or (self.embed is not None and self.embed_pacer.hold)

    def agreed_hold(self, hold: bool) -> None:
        self.engine.slots.hold_long = hold

    def step(self) -> list[Chunk]:
        refused, self._refused = self._refused, []
        if self.embed is not None and self.embed.has_work():
            decoding = bool(self.engine.batch.rows)
            hold = self.engine.slots.hold_long if self.agreed else self.embed_pacer.hold
            if not (decoding and hold):
                started = time.monotonic()
                refused += self.embed.step()
                self.embed_pacer.note(time.monotonic() - started, True, decoding)
        if not self.engine.has_work():
            return refused
        if not self.agreed:
            self.engine.slots.hold_long = self.pacer.hold
        started = time.monotonic()
        chunks = self.engine.step()
        self.pacer.note(time.monotonic() - started, self.engine.slots.long_fed, bool(self.engine.batch.rows))
        self.embed_pacer.note(time.monotonic() - started, False, bool(self.engine.batch.rows))
        self.generated += sum(1 for c in chunks if isinstance(c, TokenChunk) and c.token_id is not None)
        return refused + chunks

    def stats(self) -> EngineStats:
        return engine_stats(self.engine, self.kv_bytes_per_token, self.generated)

    def prefixes(self) -> tuple[int, ...] | None:
        cache = self.engine.prompt_cache
        return cache.digests() if cache.enabled else None

    def forget_warmup(self) -> None:
        """The warm-up request is not traffic: its prompt cache figures start again."""
        cache = self.engine.prompt_cache
        cache.hits = cache.misses = cache.reused_tokens = self.engine.prefilled_tokens = 0
        cache.disk_hits = cache.restored_tokens = 0
        self.generated = 0

    def close(self) -> None:
        disk = self.engine.prompt_cache.disk if self.engine is not None else None
        if disk is not None:
            disk.close(DISK_CLOSE_SECONDS)  # the blocks of the last requests, written before the runner goes
        self.engine = None  # type: ignore[assignment]  # the weights go with the last reference
