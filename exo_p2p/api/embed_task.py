"""One embedding or rerank task on the cluster, from the API node: tokenize the inputs with
the model's tokenizer, submit the task, wait for its ``EmbeddingChunk`` and ``FinishChunk``
(docs/api.md#embeddings-and-reranking). Unlike a generation nothing streams and nothing
moves: a failed task is the request's error (the client may retry; embeddings are pure).
"""

from __future__ import annotations

import numpy as np
import trio

from exo_p2p.api.bounds import check_command_size
from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError
from exo_p2p.api.generation.job import new_task_id
from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.types import (
    CancelGeneration,
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


async def run(ctx: ApiContext, task: WorkTask) -> tuple[np.ndarray, int]:
    """Submit ``task`` and return its rows ``[count, dimensions]`` float32 and the prompt
    tokens the runner counted. Raises ``ApiError``: the master's refusal, the runner's error,
    504 when no answer comes within the generation chunk timeout, 429 when the API is at its
    in-flight limit, 400 ``request_too_large`` for a command over ``MAX_COMMAND_BYTES`` (its
    token ids are replicated into every node's log). A task left unanswered (timeout, client
    gone) is cancelled."""
    submit = SubmitTask(new_id(), task)
    check_command_size(submit)
    if not ctx.inflight.try_acquire():
        raise ApiError(429, f"too many requests in flight on this node (limit {ctx.inflight.limit}); retry",
                       code="too_many_requests")
    backend, settings = ctx.backend, ctx.config.generation
    chunks = backend.open_chunks(task.task_id)
    done = False
    try:
        result = await backend.command(submit, timeout=ctx.config.command_timeout)
        if result.error is not None:
            done = True
            raise ApiError(result.error.status, result.error.message, param=result.error.param, code=result.error.code)
        parts: list[np.ndarray] = []
        tokens = 0
        with trio.move_on_after(settings.chunk_timeout):
            async for chunk in chunks:
                if isinstance(chunk, EmbeddingChunk):
                    parts.append(_rows(chunk, parts))
                    tokens = chunk.prompt_tokens
                elif isinstance(chunk, ErrorChunk):
                    done = True
                    raise ApiError(chunk.error.status, chunk.error.message, param=chunk.error.param, code=chunk.error.code)
                elif isinstance(chunk, FinishChunk):
                    done = True
                    break
        if not parts or not done:
            raise ApiError(504 if not done else 502, "the runner sent no vectors" if done else
                           f"no answer from the model within {settings.chunk_timeout:g} s", code="timeout")
        return np.concatenate(parts), tokens
    finally:
        if not done:
            with trio.CancelScope(shield=True), trio.move_on_after(settings.cancel_timeout):
                await backend.command(CancelGeneration(command_id=new_id(), task_id=task.task_id),
                                      timeout=settings.cancel_timeout)
        backend.close_chunks(task.task_id)
        ctx.inflight.release()


def _rows(chunk: EmbeddingChunk, before: list[np.ndarray]) -> np.ndarray:
    """One part of a task's rows, ``[count, dimensions]`` float32. Raises ``ApiError`` 502 when
    its bytes do not hold them, or its width is not the earlier parts' ``before``."""
    if chunk.count < 1 or chunk.dimensions < 1 or len(chunk.vectors) != chunk.count * chunk.dimensions * 4:
        raise ApiError(502, f"the runner's answer of {len(chunk.vectors)} bytes is not {chunk.count} x "
                       f"{chunk.dimensions} float32 values")
    if before and before[0].shape[1] != chunk.dimensions:
        raise ApiError(502, f"the runner's answer changed width from {before[0].shape[1]} to {chunk.dimensions}")
    return np.frombuffer(chunk.vectors, dtype="<f4").reshape(chunk.count, chunk.dimensions).astype(np.float32)


def new_ids(ctx: ApiContext) -> tuple[str, NodeId]:
    """A new task id and this API node's id (a task's ``api_node_id``)."""
    return new_task_id(), NodeId(ctx.backend.node_id)
