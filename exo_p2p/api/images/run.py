"""One image task on the cluster, from the API node (docs/images.md#api): submit it, yield its
``ImageChunk``s as they come, end at its ``FinishChunk``; its ``ErrorChunk`` or the master's
refusal is the request's ``ApiError``. Waiting is bounded: ``chunk_timeout`` seconds per
denoising step and two more (the prompt, the decode). A task left unanswered (timeout, a
client gone, an error) is cancelled, so its runner stops within one step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from exo_p2p.api.context import ApiContext
from exo_p2p.api.embed_task import chunk_error, submitted
from exo_p2p.api.errors import ApiError
from exo_p2p.types import ErrorChunk, FinishChunk, ImageChunk, ImageGeneration, ImageProgressChunk


async def image_chunks(ctx: ApiContext, task: ImageGeneration) -> AsyncIterator[ImageChunk | ImageProgressChunk]:
    """The task's image chunks (partials, then the final one) and, when its params ask, its
    ``ImageProgressChunk`` after each step. Raises ``ApiError``: the
    submission's (``exo_p2p.api.embed_task.submitted``: the command bound, the in-flight
    limit, the master's refusal), the runner's error, 504 past the time bound, 502 when the
    runner ends it without an image."""
    bound, final = ctx.config.generation.chunk_timeout * (task.params.steps + 2), False
    async with submitted(ctx, task) as (chunks, ended):
        with trio.move_on_after(bound):
            async for chunk in chunks:
                if isinstance(chunk, (ImageChunk, ImageProgressChunk)):
                    final = final or (isinstance(chunk, ImageChunk) and not chunk.partial)
                    yield chunk
                elif isinstance(chunk, ErrorChunk):
                    ended.done = True
                    raise chunk_error(chunk)
                elif isinstance(chunk, FinishChunk):
                    ended.done = True
                    break
        if not ended.done:
            raise ApiError(504, f"no image from the model within {bound:g} s", code="timeout")
        if not final:
            raise ApiError(502, "the runner ended the image without sending it")
