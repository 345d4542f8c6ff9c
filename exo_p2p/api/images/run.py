"""One image task on the cluster, from the API node (docs/images.md#api): submit it, yield its
``ImageChunk``s as they come, end at its ``FinishChunk``; its ``ErrorChunk`` or the master's
refusal is the request's ``ApiError``. Waiting is bounded: ``chunk_timeout`` seconds per
denoising step and two more (the prompt, the decode). A task left unanswered (timeout, a
client gone, an error) is cancelled, so its runner stops within one step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from exo_p2p.api.bounds import check_command_size
from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError
from exo_p2p.types import CancelGeneration, ErrorChunk, FinishChunk, ImageChunk, ImageGeneration, SubmitTask, new_id


async def image_chunks(ctx: ApiContext, task: ImageGeneration) -> AsyncIterator[ImageChunk]:
    """The task's image chunks (partials, then the final one). Raises ``ApiError``: the
    master's refusal, the runner's error, 504 past the time bound, 502 when the runner ends
    it without an image, 429 at the node's in-flight limit, 400 for a command over the bound."""
    submit = SubmitTask(new_id(), task)
    check_command_size(submit)
    if not ctx.inflight.try_acquire():
        raise ApiError(429, f"too many requests in flight on this node (limit {ctx.inflight.limit}); retry",
                       code="too_many_requests")
    backend, settings = ctx.backend, ctx.config.generation
    chunks = backend.open_chunks(task.task_id)
    done, final = False, False
    bound = settings.chunk_timeout * (task.params.steps + 2)
    try:
        result = await backend.command(submit, timeout=ctx.config.command_timeout)
        if result.error is not None:
            done = True
            raise ApiError(result.error.status, result.error.message, param=result.error.param, code=result.error.code)
        with trio.move_on_after(bound):
            async for chunk in chunks:
                if isinstance(chunk, ImageChunk):
                    final = final or not chunk.partial
                    yield chunk
                elif isinstance(chunk, ErrorChunk):
                    done = True
                    raise ApiError(chunk.error.status, chunk.error.message, param=chunk.error.param,
                                   code=chunk.error.code)
                elif isinstance(chunk, FinishChunk):
                    done = True
                    break
        if not done:
            raise ApiError(504, f"no image from the model within {bound:g} s", code="timeout")
        if not final:
            raise ApiError(502, "the runner ended the image without sending it")
    finally:
        if not done:
            with trio.CancelScope(shield=True), trio.move_on_after(settings.cancel_timeout):
                await backend.command(CancelGeneration(command_id=new_id(), task_id=task.task_id),
                                      timeout=settings.cancel_timeout)
        backend.close_chunks(task.task_id)
        ctx.inflight.release()
