"""The seam between a runner and what it runs (docs/architecture.md#how-to-add-a-kind-of-work).

A runner (``worker.runner.main``) holds one shard of one instance and knows nothing of the
model's kind: ``worker.runner.builders.choose_builder`` picks a ``Builder`` by the model's
kind (``exo_p2p.types.kinds.model_kind``), the runner drives its lifecycle (connect → load →
build), then feeds the ``Engine`` it built with tasks and steps it, sending the chunks each
step returns. On a multi-rank instance the runner's agreement rounds (``worker.runner.rounds``)
decide which tasks start and when, at the engine's agreement points.

Both are ``typing.Protocol``s: an implementation subclasses nothing. The text one is
``worker.runner.text_builder.TextBuilder`` → ``worker.engine.text.TextEngine``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from exo_p2p.types import Chunk, TaskId, WorkTask
from exo_p2p.types.observe import EngineStats

Gather = Callable[[np.ndarray], np.ndarray]
"""A ring's all-gather: ``int64 [W] -> [world_size, W]`` in rank order (a collective)."""


class Engine(Protocol):
    """Runs tasks of the kinds its model does, one ``step`` at a time, on the runner's main
    thread. Every rank of a multi-rank instance makes the same calls in the same order."""

    warmup_rate: float
    """Steps per second measured at warm-up (0: unknown); the first pace of the rounds."""

    def submit(self, task: WorkTask) -> None:
        """Queue ``task``; a kind this engine does not do ends at the next step with an
        ``ErrorChunk`` (never an exception: the runner would fail)."""

    def cancel(self, task_id: TaskId) -> None:
        """End ``task_id`` (queued or running) with a cancelled ``FinishChunk`` at the next step."""

    def has_work(self) -> bool:
        """Tasks are queued or running: the runner steps instead of waiting for input."""

    def must_agree(self) -> bool:
        """The agreement point: the next step would start or prefill work, so a multi-rank
        instance's ranks agree what starts (one round) before it. False while it only decodes."""

    def hold_proposal(self) -> bool:
        """This rank's wish to hold long prefills back at the next step (the round's ``hold``)."""

    def agreed_hold(self, hold: bool) -> None:
        """The hold every rank agreed for the next step (multi-rank instances only)."""

    def step(self) -> list[Chunk]:
        """One step: the chunks it produced, each task's last one a ``FinishChunk`` or an
        ``ErrorChunk``. Raises only for a failure of the runner (a collective, the device)."""

    def stats(self) -> EngineStats:
        """What the engine holds and has done now (sent with heartbeats)."""

    def prefixes(self) -> tuple[int, ...] | None:
        """Digests of the prompt prefixes it caches (``exo_p2p.content.prefixes``); None: no cache."""

    def close(self) -> None:
        """Let go of the model and its memory."""


class Builder(Protocol):
    """Makes the ``Engine`` of one shard: the lifecycle tasks in order, each called once."""

    all_gather: Gather | None
    """The ring's all-gather once connected and built (None: one rank)."""
    connected: bool
    """A ring was joined (the runner then exits without waiting on its sockets)."""

    def connect(self, on_timeout: Callable[[str], tuple[int, bytes]]) -> None:
        """Join the instance's ring (multi-rank only; bounded). ``on_timeout(message)``:
        the (fd, bytes) a watchdog writes if the ring does not form in time
        (``worker.engine.distributed.init_ring``)."""

    def load(self) -> Iterator[tuple[int, int]]:
        """Load this rank's share, yielding (done, total) units (layers) as it goes."""

    def build(self, on_step: Callable[[float], None]) -> Engine:
        """The engine, built and warmed up (a collective on a multi-rank instance);
        ``on_step(seconds)`` after each warm-up step (the stuck bound's history)."""

    def peak_memory_bytes(self) -> int:
        """Bytes the loaded share holds at its peak (0: unknown)."""


class OneRankFaces:
    """The ``Engine`` faces of an engine that runs whole on one rank (the embedding and image
    engines): nothing to agree, no hold, no prompt cache. A subclass sets ``work`` (``queued``,
    ``submit``, ``cancel``, ``has_work``, ``step``) and says which tasks it takes (``takes``);
    the others end with a 400 ``unsupported_task`` ``ErrorChunk`` at the next step."""

    warmup_rate = 0.0
    does = "work"
    """What the engine's model does, for the refusal's message."""

    def __init__(self, work: object) -> None:
        self.work: Any = work
        self._refused: list[Chunk] = []

    def takes(self, task: WorkTask) -> bool:
        raise NotImplementedError

    def submit(self, task: WorkTask) -> None:
        if self.takes(task):
            self.work.submit(task)
            return
        from exo_p2p.types import ErrorChunk, ErrorInfo

        message = f"this runner's model {self.does}; it does not do {task.task_kind!r} work"
        self._refused.append(ErrorChunk(task_id=task.task_id, error=ErrorInfo(400, message, code="unsupported_task")))

    def cancel(self, task_id: TaskId) -> None:
        self.work.cancel(task_id)

    def has_work(self) -> bool:
        return bool(self._refused) or bool(self.work.has_work())

    def must_agree(self) -> bool:
        return False  # one rank: nothing to agree

    def hold_proposal(self) -> bool:
        return False

    def agreed_hold(self, hold: bool) -> None:
        pass

    def step(self) -> list[Chunk]:
        refused, self._refused = self._refused, []
        return refused + list(self.work.step())

    def prefixes(self) -> tuple[int, ...] | None:
        return None

    def close(self) -> None:
        self.work = None  # the weights go with the last reference
