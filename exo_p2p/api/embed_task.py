"""One embedding or rerank task on the cluster, from the API node: tokenize the inputs with
the model's tokenizer, submit the task, wait for its ``EmbeddingChunk`` and ``FinishChunk``
(docs/api.md#embeddings-and-reranking). Unlike a generation nothing streams and nothing
moves: a failed task is the request's error (the client may retry; embeddings are pure).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import numpy as np
import trio

from exo_p2p.api.bounds import check_command_size
from exo_p2p.api.context import ApiContext
from exo_p2p.api.demand.placer import waits
from exo_p2p.api.errors import ApiError
from exo_p2p.api.generation.job import new_task_id
from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    EmbeddingChunk,
    ErrorChunk,
    FinishChunk,
    ModelCard,
    ModelId,
    NodeId,
    SubmitTask,
    WorkTask,
    new_id,
)
from exo_p2p.types.kinds import card_tasks


def card_for(ctx: ApiContext, name: str, kind: str) -> ModelCard:
    """The card of model ``name``. Raises ``ApiError``: 404 for an unknown model, 400
    ``unsupported_task`` for one that cannot do ``kind`` (``embed`` or ``rerank``)."""
    card = ctx.card(name)
    if card is None:
        raise ApiError(404, f"unknown model {name[:200]}", param="model", code="model_not_found")
    if kind not in card_tasks(card):
        raise ApiError(400, f"model {card.model_id!r} cannot do {kind!r} work; it can: {', '.join(card_tasks(card))}",
                       param="model", code="unsupported_task")
    return card


async def encode(ctx: ApiContext, model_id: ModelId, texts: list[str]) -> list[tuple[int, ...]]:
    """``texts`` tokenized with this node's copy of the model's tokenizer (special tokens
    added, no template). Raises ``ApiError(404, model_not_local)`` when this node holds no copy."""
    if not texts:
        return []
    try:
        return await ctx.backend.tokenize(model_id, tuple(texts))
    except KeyError:
        raise ApiError(404, f"model {model_id[:200]!r} is not stored on this node, and embedding needs its tokenizer; "
                       "ask a node that holds it", param="model", code="model_not_local") from None


def bound_error(exc: EmbedBoundError) -> ApiError:
    """An input over a bound as the 400 naming its field."""
    return ApiError(400, str(exc), param=exc.param, code="context_length_exceeded" if "context" in str(exc) else None)


class Ended:
    """Whether a submitted task has ended (its error or finish came, or the master refused it):
    ``submitted`` cancels a task that has not when the request leaves."""

    def __init__(self) -> None:
        self.done = False


@asynccontextmanager
async def submitted(ctx: ApiContext, task: WorkTask) -> AsyncIterator[tuple[AsyncIterator[Chunk], Ended]]:
    """Submit ``task`` and give its chunks and its ``Ended`` for the block. Raises
    ``ApiError``: 400 ``request_too_large`` for a command over ``MAX_COMMAND_BYTES`` (it is
    replicated into every node's log), 429 when the API is at its in-flight limit, the master's
    refusal. A task not ended when the block leaves (timeout, client gone) is cancelled."""
    submit = SubmitTask(new_id(), task)
    check_command_size(submit)
    if not ctx.inflight.try_acquire():
        raise ApiError(429, f"too many requests in flight on this node (limit {ctx.inflight.limit}); retry",
                       code="too_many_requests")
    backend, settings, ended = ctx.backend, ctx.config.generation, Ended()
    chunks = backend.open_chunks(task.task_id)
    try:
        result = await backend.command(submit, timeout=ctx.config.command_timeout)
        if result.error is not None and settings.demand is not None and waits(result.error, backend.state(), task.model_id):
            # placed on demand and waited for, then submitted again (exo_p2p.api.demand.placer)
            waited = await settings.demand.ready(backend, task.model_id, None, _nothing)
            if waited is None:  # a fresh route: the first one may have been swept meanwhile
                backend.close_chunks(task.task_id)
                chunks = backend.open_chunks(task.task_id)
                result = await backend.command(msgspec.structs.replace(submit, command_id=new_id()), timeout=ctx.config.command_timeout)
            else:
                result = msgspec.structs.replace(result, error=waited)
        if result.error is not None:
            ended.done = True
            raise ApiError(result.error.status, result.error.message, param=result.error.param, code=result.error.code)
        yield chunks, ended
    finally:
        if not ended.done:
            with trio.CancelScope(shield=True), trio.move_on_after(settings.cancel_timeout):
                await backend.command(CancelGeneration(command_id=new_id(), task_id=task.task_id),
                                      timeout=settings.cancel_timeout)
        backend.close_chunks(task.task_id)
        ctx.inflight.release()


def chunk_error(chunk: ErrorChunk) -> ApiError:
    """The runner's error as the request's."""
    return ApiError(chunk.error.status, chunk.error.message, param=chunk.error.param, code=chunk.error.code)


async def run(ctx: ApiContext, task: WorkTask) -> tuple[np.ndarray, int]:
    """Submit ``task`` and return its rows ``[count, dimensions]`` float32 (joined from the
    runner's parts, ``EMBEDDING_CHUNK_BYTES`` each at most) and the prompt tokens the runner
    counted. Raises ``ApiError``: ``submitted``'s, the runner's error, 502 for parts that do not
    fit together, 504 when no answer comes within the generation chunk timeout."""
    settings = ctx.config.generation
    async with submitted(ctx, task) as (chunks, ended):
        parts: list[np.ndarray] = []
        tokens = 0
        with trio.move_on_after(settings.chunk_timeout):
            async for chunk in chunks:
                if isinstance(chunk, EmbeddingChunk):
                    parts.append(_rows(chunk, parts))
                    tokens = chunk.prompt_tokens
                elif isinstance(chunk, ErrorChunk):
                    ended.done = True
                    raise chunk_error(chunk)
                elif isinstance(chunk, FinishChunk):
                    ended.done = True
                    break
        if not parts or not ended.done:
            raise ApiError(504 if not ended.done else 502, "the runner sent no vectors" if ended.done else
                           f"no answer from the model within {settings.chunk_timeout:g} s", code="timeout")
        return np.concatenate(parts), tokens


def _rows(chunk: EmbeddingChunk, before: list[np.ndarray]) -> np.ndarray:
    """One part of a task's rows, ``[count, dimensions]`` float32. Raises ``ApiError`` 502 when
    its bytes do not hold them, or its width is not the earlier parts' ``before``."""
    if chunk.count < 1 or chunk.dimensions < 1 or len(chunk.vectors) != chunk.count * chunk.dimensions * 4:
        raise ApiError(502, f"the runner's answer of {len(chunk.vectors)} bytes is not {chunk.count} x "
                       f"{chunk.dimensions} float32 values")
    if before and before[0].shape[1] != chunk.dimensions:
        raise ApiError(502, f"the runner's answer changed width from {before[0].shape[1]} to {chunk.dimensions}")
    return np.frombuffer(chunk.vectors, dtype="<f4").reshape(chunk.count, chunk.dimensions).astype(np.float32)


async def _nothing() -> None:
    """No keep-alive while an embedding waits (its answer is one JSON body)."""


def new_ids(ctx: ApiContext) -> tuple[str, NodeId]:
    """A new task id and this API node's id (a task's ``api_node_id``)."""
    return new_task_id(), NodeId(ctx.backend.node_id)
