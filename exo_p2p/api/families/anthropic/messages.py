"""Anthropic Messages, ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

``system`` (a string or text blocks) becomes the system message; ``messages`` alternate
``user``/``assistant`` with string or text-block content, and may hold ``system`` turns
anywhere (text; rendered as ``exo_p2p.content.system_turns`` says; ``cache_control`` is ignored:
the prompt cache is automatic); ``max_tokens`` is required;
``stop_sequences``, ``temperature`` (0..1), ``top_p``, ``top_k`` map to ours; tools, tool
blocks and thinking as ``anthropic_tools`` says; ``output_config.format`` (the beta's
``output_format``; the extensions ``regex``, ``grammar``) constrains the output
(``exo_p2p.api.formats``). Image blocks are read (``exo_p2p.api.vision``); documents are refused by name; ``output_config.effort``
is a hint and is ignored. Errors have Anthropic's shape (``{"type": "error", "error": {"type",
"message"}}``, ``exo_p2p.api.errors``); the key may be sent as ``x-api-key``
(``exo_p2p.api.access``).

A stream is the documented event sequence: ``message_start``, ``content_block_start``,
``ping``, ``content_block_delta``…, ``content_block_stop``, ``message_delta`` (``stop_reason``
and usage), ``message_stop``; keep-alives are ``ping`` events; an error after the stream began
is an ``error`` event, which ends it. ``stop_reason``: ``end_turn`` (the model stopped),
``stop_sequence`` (with the matched ``stop_sequence``), ``max_tokens``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError, anthropic_error_body
from exo_p2p.api.families.anthropic.tools import (
    BlocksEncoder,
    anthropic_choice,
    anthropic_tools,
    anthropic_usage,
    counted_messages,
    system_text,
    thinking_budget_of,
    thinking_of,
    turn_messages,
)
from exo_p2p.api.families.common import SSE_MEDIA_TYPE, sse, stop_strings
from exo_p2p.api.formats import anthropic_output_format, extensions, output_format
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, new_task_id
from exo_p2p.api.schemas import NonEmptyStr, PositiveTokens, StopList, TopK, TopP
from exo_p2p.api.vision.admit import check_count, check_images
from exo_p2p.api.vision.parts import NO_URLS
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk, GenerationParams
from exo_p2p.vision.fetch import ImageUrlPolicy

_json = msgspec.json.Encoder()
UnitTemperature = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class Block(msgspec.Struct, frozen=True):
    """A content block: text, and tool use, tool result and thinking blocks (``anthropic_tools``)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: Any = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    source: Any = None
    """An ``image`` block's source (``exo_p2p.api.vision.parts.image_from_source``)."""


class MessageParam(msgspec.Struct, frozen=True):
    role: str
    content: str | list[Block]


class MessagesRequest(msgspec.Struct, frozen=True):
    """``POST /v1/messages`` (unknown fields ignored)."""

    model: NonEmptyStr
    messages: list[MessageParam]
    max_tokens: PositiveTokens
    system: str | list[Block] | None = None
    stop_sequences: StopList | None = None
    temperature: UnitTemperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: Any = None
    output_config: dict[str, Any] | None = None
    output_format: Any = None
    regex: str | None = None
    grammar: str | None = None


class CountTokensRequest(msgspec.Struct, frozen=True):
    """``POST /v1/messages/count_tokens``."""

    model: NonEmptyStr
    messages: list[MessageParam]
    system: str | list[Block] | None = None
    tools: list[Any] | None = None
    thinking: Any = None


def _text(where: str, content: str | list[Block]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content):
        if block.type != "text" or block.text is None:
            raise ApiError(400, f"{where}[{j}] is a '{block.type[:64]}' block: only text blocks are supported", param=f"{where}[{j}].type")
        texts.append(block.text)
    return "".join(texts)


def _images_in(block: Block) -> int:
    """Image blocks in ``block``: itself, or those of a ``tool_result``'s content."""
    if block.type == "tool_result" and isinstance(block.content, list):
        return sum(isinstance(b, dict) and b.get("type") == "image" for b in block.content)
    return int(block.type == "image")


def anthropic_messages(messages: list[MessageParam], system: str | list[Block] | None,
                       policy: ImageUrlPolicy = NO_URLS) -> tuple[ChatMessage, ...]:
    """Our messages from Anthropic's ``system`` and ``messages`` (400 naming a bad one; image
    blocks read under ``policy``)."""
    out: list[ChatMessage] = []
    if system:
        out.append(ChatMessage("system", system_text(_text("system", system))))
    if not messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    check_count(sum(isinstance(m.content, list) and sum(_images_in(b) for b in m.content) for m in messages), "messages")
    for i, m in enumerate(messages):
        if m.role not in ("user", "assistant", "system"):
            raise ApiError(400, f"messages.{i}.role must be 'user', 'assistant' or 'system', got {m.role[:64]!r}", param=f"messages.{i}.role")
        if m.role == "system":  # a system turn anywhere (exo_p2p.content.system_turns renders it)
            out.append(ChatMessage("system", system_text(_text(f"messages.{i}.content", m.content))))
        elif isinstance(m.content, str):
            out.append(ChatMessage(m.role, m.content))
        else:
            out += turn_messages(i, m.role, m.content, policy)
    return tuple(out)


def messages_params(r: MessagesRequest, images: ImageUrlPolicy = NO_URLS) -> GenerationParams:
    """``GenerationParams`` of a Messages request; 400 naming what cannot be honoured (image
    blocks read under ``images``)."""
    fields: dict[str, object] = {"max_tokens": r.max_tokens, "stop": stop_strings(r.stop_sequences, "stop_sequences")}
    optional = {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k}
    fields.update({k: v for k, v in optional.items() if v is not None})
    fields["output_format"] = output_format(anthropic_output_format(r.output_config, r.output_format), *extensions(r.regex, r.grammar))
    tools = anthropic_tools(r.tools)
    choice, limit = anthropic_choice(r.tool_choice, tools)
    fields.update(tools=tools, tool_choice=choice, thinking=thinking_of(r.thinking), one_call=limit == 1,
                  thinking_budget=thinking_budget_of(r.thinking))
    return GenerationParams(messages=anthropic_messages(r.messages, r.system, images), **fields)  # type: ignore[arg-type]


def stop_reason(chunk: FinishChunk) -> str:
    """Anthropic's ``stop_reason`` for our finish."""
    if chunk.finish_reason == "length":
        return "max_tokens"
    if chunk.finish_reason == "stop" and chunk.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


class MessagesEncoder:
    """Messages bytes of one generation (``id`` is ``msg_<task id>``)."""

    family = "anthropic"
    media_type = SSE_MEDIA_TYPE

    def __init__(self, task_id: str, model: str) -> None:
        self.id = f"msg_{task_id.replace('-', '')}"
        self.model = model
        self.prompt_tokens = 0

    def _message(self, content: list[dict[str, Any]], chunk: FinishChunk | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None if chunk is None else stop_reason(chunk),
            "stop_sequence": None if chunk is None else chunk.stop_sequence,
            "usage": anthropic_usage(self.prompt_tokens, chunk),
        }

    def start(self, prompt_tokens: int | None) -> bytes:
        self.prompt_tokens = prompt_tokens or 0
        return (
            sse({"type": "message_start", "message": self._message([], None)}, "message_start")
            + sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start")
            + self.keepalive()
        )

    def text(self, delta: str) -> bytes:
        return sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}, "content_block_delta")

    def finish(self, chunk: FinishChunk) -> bytes:
        delta = {"stop_reason": stop_reason(chunk), "stop_sequence": chunk.stop_sequence}
        usage = anthropic_usage(chunk.prompt_tokens, chunk)
        return (
            sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
            + sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta")
            + sse({"type": "message_stop"}, "message_stop")
        )

    def error(self, info: ErrorInfo) -> bytes:
        return sse(anthropic_error_body(info), "error")

    def keepalive(self) -> bytes:
        return sse({"type": "ping"}, "ping")

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        return _json.encode(self._message([{"type": "text", "text": text}], chunk))


def messages_job(r: MessagesRequest, ctx: ApiContext) -> GenerationJob:
    params = messages_params(r, ctx.config.image_urls)
    model_id = ctx.model_id(r.model)
    check_images(ctx.card(r.model), model_id, params.messages)
    task_id = new_task_id()
    encoder: MessagesEncoder | BlocksEncoder = MessagesEncoder(task_id, model_id)
    if params.tools or params.thinking:
        encoder = BlocksEncoder(task_id, model_id, thinking=bool(params.thinking), limit=anthropic_choice(r.tool_choice, params.tools)[1])
    return GenerationJob(model_id=model_id, params=params, stream=bool(r.stream), encoder=encoder, task_id=task_id)


def routes(ctx: ApiContext) -> list[Route]:
    """``POST /v1/messages`` and ``POST /v1/messages/count_tokens``."""

    async def messages(request: Request) -> GenerationResponse:
        return ctx.generate(await ctx.job(messages_job, await ctx.read_json(request, MessagesRequest), ctx))

    async def count_tokens(request: Request) -> Response:
        r = await ctx.read_json(request, CountTokensRequest)
        params = GenerationParams(messages=counted_messages(await ctx.job(anthropic_messages, r.messages, r.system), await ctx.job(anthropic_tools, r.tools)))
        model_id = ctx.model_id(r.model)
        if ctx.card(r.model) is None:
            raise ApiError(404, f"model: unknown model {r.model[:200]}", param="model", code="model_not_found")
        check_images(ctx.card(r.model), model_id, params.messages)  # images are not counted: refused as a generation would be
        count = await ctx.count_tokens(model_id, params)
        return Response(_json.encode({"input_tokens": count}), media_type="application/json")

    return [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
