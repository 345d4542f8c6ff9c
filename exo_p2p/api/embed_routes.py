"""The embedding and rerank endpoints: OpenAI ``POST /v1/embeddings``, Ollama ``POST
/api/embed`` and the legacy ``POST /api/embeddings``, and ``POST /v1/rerank`` (Jina/Cohere)
(docs/api.md#embeddings-and-reranking). Bodies are parsed by ``exo_p2p.embeddings.requests``,
tokenized here (``embed_task.encode``), run as one ``Embedding`` or ``Rerank`` task and
answered by ``exo_p2p.embeddings.answers``; errors in each family's shape (the app's handler).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api import embed_task
from exo_p2p.api.body import read_body
from exo_p2p.api.generation.client_key import client_key
from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError
from exo_p2p.api.views import json_response
from exo_p2p.embeddings import answers, requests
from exo_p2p.embeddings.bounds import EmbedBoundError
from exo_p2p.embeddings.requests import EmbedRequest
from exo_p2p.embeddings.tokens import token_rows
from exo_p2p.types import Embedding, EmbeddingParams, ModelId, Rerank, RerankParams, new_id
from exo_p2p.types.observe import RequestRecord
from exo_p2p.types.kinds import card_tasks


async def _texts_to_rows(ctx: ApiContext, model_id: ModelId, inputs: tuple, *, context: int, vocab: int,
                         truncate: bool) -> tuple[tuple[int, ...], ...]:
    texts = [i for i in inputs if isinstance(i, str)]
    encoded = iter(await embed_task.encode(ctx, model_id, texts))
    tokenized = [next(encoded) if isinstance(i, str) else i for i in inputs]
    try:
        return token_rows(tokenized, lambda _: (), context=context, vocab=vocab, truncate=truncate)
    except EmbedBoundError as exc:
        raise embed_task.bound_error(exc) from None


async def embed(ctx: ApiContext, request: Request, name: str, req: EmbedRequest):  # type: ignore[no-untyped-def]
    """``(vectors [N, D], prompt tokens)`` of ``req`` for model ``name`` (``ApiError`` as
    ``embed_task``)."""
    card = embed_task.card_for(ctx, name, "embed")
    rows = await _texts_to_rows(ctx, card.model_id, req.inputs, context=card.context_length, vocab=card.vocab_size,
                                truncate=req.truncate)
    task_id, api_node = embed_task.new_ids(ctx)
    params = EmbeddingParams(inputs=rows, dimensions=req.dimensions, client=client_key(request.scope))
    return await embed_task.run(ctx, Embedding(task_id=task_id, instance_id="", model_id=card.model_id, params=params,
                                               api_node_id=api_node))


async def rerank(ctx: ApiContext, request: Request, name: str, req: requests.RerankRequest):  # type: ignore[no-untyped-def]
    """``(scores [N], tokens, scoring)`` of the documents of ``req`` against its query: each
    document cut (``truncate``) or refused so that the query and it fit the context together."""
    card = embed_task.card_for(ctx, name, "rerank")
    query = (await _texts_to_rows(ctx, card.model_id, (req.query,), context=card.context_length,
                                  vocab=card.vocab_size, truncate=False))[0]
    room = card.context_length - len(query)
    if room < 1:
        raise embed_task.bound_error(EmbedBoundError(f"the query has {len(query)} tokens, the model's whole context", "query"))
    docs = await _texts_to_rows(ctx, card.model_id, req.documents, context=room, vocab=card.vocab_size,
                                truncate=req.truncate)
    task_id, api_node = embed_task.new_ids(ctx)
    params = RerankParams(query=query, documents=docs, client=client_key(request.scope))
    scores, tokens = await embed_task.run(ctx, Rerank(task_id=task_id, instance_id="", model_id=card.model_id,
                                                      params=params, api_node_id=api_node))
    return scores[:, 0], tokens, answers.scoring_of(card_tasks(card))


def _observed(ctx: ApiContext, family: str, kind: str, handler):  # type: ignore[no-untyped-def]
    """``handler(request) -> (model, tokens, response)`` with its ``RequestRecord`` handed to
    the observer at the end (metrics by kind, the request log; ``docs/operations.md``)."""
    observer = ctx.config.observer

    async def route(request: Request) -> Response:
        started, wall = time.monotonic(), time.time()
        status, outcome, model, tokens = 500, "error", "", 0
        try:
            model, tokens, response = await handler(request)
            status, outcome = 200, "complete"
            return response
        except ApiError as exc:
            status, outcome = exc.info.status, "refused" if exc.info.status < 500 else "error"
            raise
        finally:
            if observer.active:
                observer.finished(RequestRecord(request_id=new_id(), family=family, model=model[:200], status=status,
                                                outcome=outcome, started=wall, duration=time.monotonic() - started,
                                                prompt_tokens=tokens, kind=kind))

    return route


def routes(ctx: ApiContext) -> list[Route]:
    """The four routes, bound to ``ctx``."""
    limit = ctx.config.max_body_bytes

    async def openai(request: Request):  # type: ignore[no-untyped-def]
        name, req, encoding = requests.openai_embed(await read_body(request, limit))
        vectors, tokens = await embed(ctx, request, name, req)
        return name, tokens, json_response(answers.openai_answer(name, vectors, tokens, encoding))

    async def ollama(request: Request):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        name, req = requests.ollama_embed(await read_body(request, limit))
        vectors, tokens = await embed(ctx, request, name, req)
        return name, tokens, json_response(answers.ollama_answer(name, vectors, tokens, time.monotonic() - started))

    async def ollama_legacy(request: Request):  # type: ignore[no-untyped-def]
        name, req = requests.ollama_legacy_embed(await read_body(request, limit))
        vectors, tokens = await embed(ctx, request, name, req)
        return name, tokens, json_response(answers.ollama_legacy_answer(vectors))

    async def rerank_route(request: Request):  # type: ignore[no-untyped-def]
        name, req, return_documents = requests.rerank(await read_body(request, limit))
        scores, tokens, scoring = await rerank(ctx, request, name, req)
        return name, tokens, json_response(answers.rerank_answer(
            name, req.documents, scores.tolist(), top_n=req.top_n, return_documents=return_documents, tokens=tokens,
            scoring=scoring))

    return [
        Route("/v1/embeddings", _observed(ctx, "openai", "embed", openai), methods=["POST"]),
        Route("/api/embed", _observed(ctx, "ollama", "embed", ollama), methods=["POST"]),
        Route("/api/embeddings", _observed(ctx, "ollama", "embed", ollama_legacy), methods=["POST"]),
        Route("/v1/rerank", _observed(ctx, "openai", "rerank", rerank_route), methods=["POST"]),
    ]
