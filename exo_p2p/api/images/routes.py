"""The images routes (docs/images.md#api): OpenAI ``POST /v1/images/generations``,
``POST /v1/images/edits`` (``exo_p2p.api.images.edits``) and ``GET /v1/images/files/{name}``
(the files of ``response_format: url``).

Image ``i`` of a request with ``n`` images is its own task with seed ``seed + i``, run one
after the other (so a request's images come in order and a cancelled request leaves no work
behind). A request that streams gets ``image_generation.partial_image`` events as the runner's
partial images come and one ``image_generation.completed`` event per image (an edit's:
``image_edit.``); an error after the stream began is an ``error`` event, as OpenAI's streams
send it. With the extra ``progress: true`` an ``image_generation.progress`` event (``step``,
``steps``, ``image_index``) follows every denoising step (docs/images.md#progress): an
extension OpenAI's clients never ask for, so their streams keep OpenAI's event types.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator

import trio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from exo_p2p.api import embed_task
from exo_p2p.api.body import read_body
from exo_p2p.api.context import ApiContext
from exo_p2p.api.embed_routes import _observed
from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.common import SSE_MEDIA_TYPE, sse
from exo_p2p.api.generation.client_key import client_key
from exo_p2p.api.images import encode
from exo_p2p.api.images.files import ImageFiles
from exo_p2p.api.images.request import ImageRequest, parse_generation
from exo_p2p.api.images.run import image_chunks
from exo_p2p.api.views import json_response
from exo_p2p.api.images.edits import parse_edit
from exo_p2p.types import ImageChunk, ImageEdits, ImageGeneration, ImageProgressChunk, ModelCard


def _tasks(ctx: ApiContext, request: Request, card: ModelCard, req: ImageRequest) -> list[ImageGeneration]:
    import msgspec

    out = []
    for i in range(req.n):
        task_id, api_node = embed_task.new_ids(ctx)
        params = msgspec.structs.replace(req.params, seed=req.params.seed + i, client=client_key(request.scope))
        kind = ImageGeneration if params.image is None else ImageEdits
        out.append(kind(task_id=task_id, instance_id="", model_id=card.model_id, params=params,
                                   api_node_id=api_node))
    return out


async def _file(req: ImageRequest, chunk: ImageChunk) -> bytes:
    try:
        return await trio.to_thread.run_sync(encode.convert, chunk.image, req.output_format, req.compression)
    except ValueError as exc:
        raise ApiError(502, f"the runner's image could not be read: {exc}") from None


def _kind(req: ImageRequest) -> str:
    return "image" if req.params.image is None else "image_edit"


async def _generate(ctx: ApiContext, files: ImageFiles, request: Request, req: ImageRequest) -> Response:
    card = embed_task.card_for(ctx, req.model, _kind(req))
    created, data = int(time.time()), []
    for task in _tasks(ctx, request, card, req):
        async for chunk in image_chunks(ctx, task):
            if not isinstance(chunk, ImageChunk) or chunk.partial:
                continue
            image = await _file(req, chunk)
            if req.response_format == "url":
                name = files.put(image, req.output_format, encode.MEDIA_TYPES[req.output_format])
                data.append({"url": f"{str(request.base_url).rstrip('/')}/v1/images/files/{name}"})
            else:
                data.append({"b64_json": base64.b64encode(image).decode()})
    return json_response(encode.response(created, data, output_format=req.output_format, quality=req.quality,
                                         size=req.size, usage_=encode.usage(0, req.n)))


async def _events(ctx: ApiContext, request: Request, card: ModelCard, req: ImageRequest) -> AsyncIterator[bytes]:
    created, prefix = int(time.time()), "image_generation" if req.params.image is None else "image_edit"
    shape = {"output_format": req.output_format, "quality": req.quality, "size": req.size}
    try:
        for index, task in enumerate(_tasks(ctx, request, card, req)):
            async for chunk in image_chunks(ctx, task):
                if isinstance(chunk, ImageProgressChunk):
                    kind = f"{prefix}.progress"
                    yield sse({"type": kind, "created_at": created, "step": chunk.step, "steps": chunk.steps,
                               "image_index": index}, kind)
                    continue
                image = await _file(req, chunk)
                if chunk.partial:
                    kind = f"{prefix}.partial_image"
                    yield sse(encode.event(kind, created, image, index=chunk.index, **shape), kind)
                else:
                    kind = f"{prefix}.completed"
                    yield sse(encode.event(kind, created, image, usage_=encode.usage(0, 1), **shape), kind)
    except ApiError as exc:
        info = exc.info
        yield sse({"type": "error", "error": {"message": info.message, "type": "invalid_request_error"
                                              if info.status < 500 else "server_error", "code": info.code,
                                              "param": info.param}}, "error")


def routes(ctx: ApiContext) -> list[Route]:
    """The images routes, bound to ``ctx`` (one ``ImageFiles`` store for their life)."""
    files = ImageFiles()

    async def answer(request: Request, req: ImageRequest):  # type: ignore[no-untyped-def]
        if not req.stream:
            return req.model, 0, await _generate(ctx, files, request, req)
        card = embed_task.card_for(ctx, req.model, _kind(req))  # refused before the stream begins
        return req.model, 0, StreamingResponse(_events(ctx, request, card, req), media_type=SSE_MEDIA_TYPE)

    async def generations(request: Request):  # type: ignore[no-untyped-def]
        return await answer(request, parse_generation(await read_body(request, ctx.config.max_body_bytes)))

    async def edits(request: Request):  # type: ignore[no-untyped-def]
        raw = await read_body(request, ctx.config.max_body_bytes)
        return await answer(request, await parse_edit(raw, request.scope))

    async def file(request: Request) -> Response:
        found = files.get(str(request.path_params["name"]))
        if found is None:
            raise ApiError(404, "no such image file (files are kept for a limited time)", code="not_found")
        return Response(found[1], media_type=found[0])

    return [
        Route("/v1/images/generations", _observed(ctx, "openai", "image", generations), methods=["POST"]),
        Route("/v1/images/edits", _observed(ctx, "openai", "image_edit", edits), methods=["POST"]),
        Route("/v1/images/files/{name}", file, methods=["GET"]),
    ]
