"""The engine and builder of an encoder embedding model behind the runner's seam
(``worker.engine.base``; docs/architecture.md#how-to-add-a-kind-of-work).

An encoder is small and runs whole on one node (placement never splits it: its card has no
tensor sharding and one layer group), so ``EncoderBuilder.connect`` refuses a ring and the
engine never needs an agreement round. Its engine is ``EmbedWork`` (one forward batch a step)
with the ``Engine`` protocol's other faces; generation tasks get a 400 ``ErrorChunk``. A cross-encoder
(``…ForSequenceClassification``) loads with its relevance head (``worker.embed.cross``) and reranks only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.model_json import model_json_file
from exo_p2p.types import Chunk, Embedding, ErrorChunk, ErrorInfo, Rerank, TaskId, WorkTask
from exo_p2p.types.observe import EngineStats
from worker.embed.work import EmbedWork
from worker.runner.faults import STAGE_LOADING, STAGE_WARMUP, RunnerFaults
from worker.runner.protocol import RunnerSetup

WARMUP_TEXT_TOKENS = (1, 2, 3, 4)
"""The token ids of the warm-up embedding (discarded), so the first request pays no first-use cost."""


def cross_encoder(model_dir: str) -> str | None:
    """The ``…ForSequenceClassification`` architecture of the model in ``model_dir``, or None
    (also for a ``config.json`` that cannot be read: the load then says why)."""
    from pathlib import Path

    try:
        archs = model_json_file(Path(model_dir) / "config.json", "config.json").get("architectures") or []
    except (OSError, UnsupportedModelError, AttributeError):
        return None
    if not isinstance(archs, list):
        return None
    return next((str(a) for a in archs if str(a).endswith("ForSequenceClassification")), None)


class EmbedEngine:
    """The ``Engine`` of an embedding model (see the module docstring)."""

    warmup_rate = 0.0

    def __init__(self, work: EmbedWork) -> None:
        self.work = work
        self._refused: list[Chunk] = []

    def submit(self, task: WorkTask) -> None:
        if isinstance(task, Embedding | Rerank):
            self.work.submit(task)
            return
        message = f"this runner's model embeds; it does not do {task.task_kind!r} work"
        self._refused.append(ErrorChunk(task_id=task.task_id, error=ErrorInfo(400, message, code="unsupported_task")))

    def cancel(self, task_id: TaskId) -> None:
        self.work.cancel(task_id)

    def has_work(self) -> bool:
        return bool(self._refused) or self.work.has_work()

    def must_agree(self) -> bool:
        return False  # one rank: nothing to agree

    def hold_proposal(self) -> bool:
        return False

    def agreed_hold(self, hold: bool) -> None:
        pass

    def step(self) -> list[Chunk]:
        refused, self._refused = self._refused, []
        return refused + self.work.step()

    def stats(self) -> EngineStats:
        return EngineStats(queued=self.work.queued, batch_rows=int(self.work.has_work()),
                           prefilled_tokens_total=self.work.tokens)

    def prefixes(self) -> tuple[int, ...] | None:
        return None

    def close(self) -> None:
        self.work = None  # type: ignore[assignment]  # the weights go with the last reference


class EncoderBuilder:
    """Load an encoder with ``mlx_embeddings`` and build its ``EmbedEngine`` (one rank)."""

    all_gather = None
    connected = False

    def __init__(self, setup: RunnerSetup, faults: RunnerFaults) -> None:
        self.setup, self.faults = setup, faults
        self.embedder: Any = None

    def connect(self, on_timeout: Callable[[str], tuple[int, bytes]]) -> None:
        raise RuntimeError("an encoder runs whole on one node; it is never split into ranks")

    def load(self) -> Iterator[tuple[int, int]]:
        from worker.embed.build import cross_embedder, encoder_embedder

        self.faults.at(STAGE_LOADING)
        yield 0, 1
        cross = cross_encoder(self.setup.model_dir)
        if cross:
            self.embedder = cross_embedder(self.setup.model_dir, cross)  # a relevance head: reranks only
        else:
            self.embedder, _ = encoder_embedder(self.setup.model_dir)
        yield 1, 1

    def peak_memory_bytes(self) -> int:
        import mlx.core as mx

        return int(mx.get_peak_memory())

    def build(self, on_step: Callable[[float], None]) -> EmbedEngine:
        import time

        if self.embedder is None:
            raise RuntimeError("build before load")
        self.faults.at(STAGE_WARMUP)
        started = time.monotonic()
        self.embedder.pooled([WARMUP_TEXT_TOKENS])  # a cross-encoder's too (no head: nothing to rank)
        on_step(time.monotonic() - started)
        return EmbedEngine(EmbedWork(self.embedder))
