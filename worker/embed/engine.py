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
from exo_p2p.types import Embedding, Rerank, WorkTask
from exo_p2p.types.observe import EngineStats
from worker.engine.base import OneRankFaces
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


class EmbedEngine(OneRankFaces):
    """The ``Engine`` of an embedding model (see the module docstring)."""

    does = "embeds"

    def __init__(self, work: EmbedWork) -> None:
        super().__init__(work)

    def takes(self, task: WorkTask) -> bool:
        return isinstance(task, Embedding | Rerank)

    def stats(self) -> EngineStats:
        return EngineStats(queued=self.work.queued, batch_rows=int(self.work.has_work()),
                           prefilled_tokens_total=self.work.tokens)


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
