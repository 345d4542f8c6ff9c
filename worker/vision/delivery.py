"""A task's images, sent to its runner before the task itself (docs/architecture.md#request-flow).

The log carries an image's digest, never its bytes; the node of each runner of the instance
(rank 0 runs the vision tower, every rank the processor) takes the bytes from the node whose API read
them (``exo_p2p.vision.peer.image_bytes``: its own store, else the API node over the peer
protocol) and writes each as an ``ImageData`` frame on the runner's pipe, then the task. The
fetch runs beside the worker's loop (a slow peer delays only this task), bounded by
``DELIVERY_SECONDS``; an image not obtained is simply not sent, and the runner ends the task
with a clear error (``worker.vision.inbox``), so nothing waits on it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from exo_p2p.types import TextGeneration, WorkTask
from worker.runner.protocol import ImageData

log = structlog.get_logger(__name__)

ImageBytes = Callable[[str, str], Awaitable[bytes | None]]
"""``(api_node_id, digest) -> bytes or None``: the node's way to an image's bytes."""
DELIVERY_SECONDS = 30.0
"""Seconds the images of one task may take to reach its runner in all (then the task goes
without the missing ones and ends with an error)."""


def task_digests(task: WorkTask) -> list[str]:
    """The distinct image digests of ``task`` in order of first appearance (none for a task
    that is not a generation)."""
    if not isinstance(task, TextGeneration):
        return []
    return list(dict.fromkeys(ref.digest for m in task.params.messages for ref in m.images))


async def forward_work(sup: Any, task: WorkTask, image_bytes: ImageBytes | None, nursery: trio.Nursery) -> None:
    """Send ``task`` to ``sup``'s runner (a ``RunnerSupervisor``); a task with images is
    marked sent at once and delivered in ``nursery``, images first (module docstring). Every
    rank gets them: a pipeline's ranks all run the processor (``worker.vision.ranks``)."""
    digests = task_digests(task)
    if not digests or image_bytes is None:
        await sup.send(task, task.task_id)
        return
    sup.sent.add(task.task_id)  # planned once: the delivery below is under way
    nursery.start_soon(_deliver, sup, task, digests, image_bytes)


async def _deliver(sup: Any, task: TextGeneration, digests: list[str], image_bytes: ImageBytes) -> None:
    with trio.move_on_after(DELIVERY_SECONDS):
        for digest in digests:
            data = await image_bytes(task.api_node_id, digest)
            if data is None:
                log.warning("image not available for its task", task_id=task.task_id, digest=digest[:12])
                continue
            await sup.send(ImageData(digest=digest, data=data), task.task_id)
    await sup.send(task, task.task_id)
