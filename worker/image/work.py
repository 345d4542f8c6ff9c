"""One image model's queue of image tasks, run a denoising step at a time
(docs/images.md#steps): the work behind ``worker.image.engine.ImageEngine``.

Tasks run one at a time in arrival order. ``step()`` starts the next task when none runs
(encoding its prompt and making its seeded latents) and runs one denoising step of the running
one, then sends: an ``ImageProgressChunk`` after every step when the task asks
(``ImageParams.progress``), a partial image after the steps ``partial_steps`` names, the final
image and a ``FinishChunk`` after the last. A cancel ends a task at the next ``step()``: within one
denoising step. A bad request or a failure of the model ends its task with an ``ErrorChunk``
(400 for a request over a bound, 500 for the model's error) and the work goes on.
"""

from __future__ import annotations

import io
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from exo_p2p.images.bounds import ImageBoundError, check_params
from exo_p2p.types import (Chunk, ErrorChunk, ErrorInfo, FinishChunk, ImageChunk, ImageGeneration,
                           ImageProgressChunk, TaskId)
from exo_p2p.types.images import partial_steps

log = logging.getLogger(__name__)

class RankLost(RuntimeError):
    """A collective of an image pipeline failed (a rank is gone): the runner's failure, not a
    task's (``worker.image.ranks``), so it goes out of ``ImageWork.step``."""


RunMaker = Callable[[ImageGeneration], Any]
"""Makes the run of a task (``worker.image.denoise.ImageRun``-like: ``step()``, ``finished``,
``done_steps``, ``steps``, ``preview()``, ``image()``)."""


def png(image: Any) -> bytes:
    """``image`` (PIL) as PNG bytes (no metadata: the same pixels give the same bytes)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


class _Running:
    def __init__(self, task: ImageGeneration, run: Any) -> None:
        self.task, self.run, self.started = task, run, time.monotonic()
        self.partials = partial_steps(task.params.steps, task.params.partial_images)
        self.sent = 0


class ImageWork:
    """The queue and the running image of one model (module docstring); ``make_run`` builds a
    task's run."""

    def __init__(self, make_run: RunMaker) -> None:
        self.make_run = make_run
        self._queue: deque[ImageGeneration] = deque()
        self._running: _Running | None = None
        self._cancelled: set[TaskId] = set()
        self.images = 0
        self.steps_done = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, task: ImageGeneration) -> None:
        self._queue.append(task)

    def cancel(self, task_id: TaskId) -> None:
        self._cancelled.add(task_id)

    def has_work(self) -> bool:
        return bool(self._queue) or self._running is not None or bool(self._cancelled)

    def running(self) -> TaskId | None:
        return None if self._running is None else self._running.task.task_id

    def _drop_cancelled(self) -> list[Chunk]:
        out: list[Chunk] = []
        for task in [t for t in self._queue if t.task_id in self._cancelled]:
            self._queue.remove(task)
            out.append(FinishChunk(task_id=task.task_id, finish_reason="cancelled", prompt_tokens=0, completion_tokens=0))
        if self._running is not None and self._running.task.task_id in self._cancelled:
            r, self._running = self._running, None
            out.append(FinishChunk(task_id=r.task.task_id, finish_reason="cancelled", prompt_tokens=0,
                                   completion_tokens=r.run.done_steps))
        self._cancelled.clear()
        return out

    def _start(self) -> list[Chunk]:
        task = self._queue.popleft()
        try:
            check_params(task.params)
            self._running = _Running(task, self.make_run(task))
        except ImageBoundError as exc:
            return [ErrorChunk(task_id=task.task_id, error=ErrorInfo(400, str(exc), param=exc.param))]
        except Exception as exc:  # noqa: BLE001 - the model's failure ends this task, not the runner
            log.exception("image task %s could not start", task.task_id)
            return [ErrorChunk(task_id=task.task_id, error=ErrorInfo(500, f"the image model failed: {exc}"[:500]))]
        return []

    def step(self) -> list[Chunk]:
        """Cancels first, then one denoising step (module docstring)."""
        out = self._drop_cancelled()
        if self._running is None and self._queue:
            out += self._start()
        r = self._running
        if r is None:
            return out
        try:
            r.run.step()
            self.steps_done += 1
            out += self._progress(r) + self._sends(r)
        except RankLost:
            raise
        except Exception as exc:  # noqa: BLE001 - as in _start
            log.exception("image task %s failed at step %d", r.task.task_id, r.run.done_steps)
            self._running = None
            out.append(ErrorChunk(task_id=r.task.task_id, error=ErrorInfo(500, f"the image model failed: {exc}"[:500])))
        return out

    def _chunk(self, r: _Running, image: Any, partial: bool) -> ImageChunk:
        p = r.task.params
        return ImageChunk(task_id=r.task.task_id, image=png(image), width=p.width, height=p.height,
                          step=r.run.done_steps, steps=p.steps, partial=partial, index=r.sent if partial else 0,
                          seconds=round(time.monotonic() - r.started, 4))

    def _progress(self, r: _Running) -> list[Chunk]:
        if not r.task.params.progress or not getattr(r.run, "emits", True):  # only the rank that sends pictures
            return []
        return [ImageProgressChunk(task_id=r.task.task_id, step=r.run.done_steps, steps=r.task.params.steps,
                                   seconds=round(time.monotonic() - r.started, 4))]

    def _sends(self, r: _Running) -> list[Chunk]:
        settle = getattr(r.run, "settle", None)  # a pipeline's ranks meet after the final image
        if r.run.finished and not getattr(r.run, "emits", True):  # a pipeline rank > 0: no pictures
            self._running = None
            settle()
            return [FinishChunk(task_id=r.task.task_id, finish_reason="stop", prompt_tokens=0,
                                completion_tokens=r.run.done_steps)]
        if r.run.finished:
            self._running = None
            self.images += 1
            try:
                final = self._chunk(r, r.run.image(), partial=False)
            finally:  # the other ranks wait at the barrier even when the decode fails
                if settle is not None:
                    settle()
            return [final, FinishChunk(task_id=r.task.task_id, finish_reason="stop", prompt_tokens=0,
                                       completion_tokens=r.run.done_steps)]
        if r.run.done_steps in r.partials and getattr(r.run, "emits", True):
            chunk = self._chunk(r, r.run.preview(), partial=True)
            r.sent += 1
            return [chunk]
        return []
