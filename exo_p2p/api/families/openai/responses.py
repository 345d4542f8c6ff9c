"""OpenAI Responses, ``POST /v1/responses`` — stateless.

``input`` is text or a list of message items (``{"role", "content"}`` with text or
``input_text``/``output_text`` parts); ``instructions`` becomes the system message;
``max_output_tokens``, ``temperature``, ``top_p`` map to ours; tools, function call items and
reasoning as ``responses_tools`` says; ``text.format`` (and the extensions ``regex``,
``grammar``) constrain the output (``exo_p2p.api.formats``) and is echoed in the response.
Nothing is stored: ``store: true``, ``previous_response_id``, ``conversation`` and
``background`` are refused with a 400 that says so, as are other item types; reasoning
carries across turns through ``include: ["reasoning.encrypted_content"]``
(``responses_include``). Keep-alives are ``response.in_progress`` events again. A stream
(without tools or reasoning) is
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``…, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` cut it), each with a rising
``sequence_number``; an error after the stream began is an ``error`` event then
``response.failed``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.routing import Route

from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError, overflow_message
from exo_p2p.api.families.common import SSE_MEDIA_TYPE, refuse_set, sse
from exo_p2p.api.families.openai.chat import IMAGE_PARTS, ROLE_ALIASES, user_content
from exo_p2p.api.families.logprob_shapes import openai_entry, requested
from exo_p2p.api.families.openai.responses_include import join_reasoning, reasoning_message, wants_encrypted_reasoning, wants_logprobs
from exo_p2p.api.families.think_budgets import effort_budget
from exo_p2p.api.families.openai.responses_tools import ItemsEncoder, responses_choice, responses_thinking, responses_tools, tool_item
from exo_p2p.api.formats import extensions, output_format, responses_text_format
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, new_task_id
from exo_p2p.api.generation.turn import Turn
from exo_p2p.api.vision.admit import check_count, check_images
from exo_p2p.api.vision.parts import NO_URLS
from exo_p2p.api.schemas import ContentPart, NonEmptyStr, PositiveTokens, Temperature, TopP
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk, GenerationParams
from exo_p2p.types.chunks import TokenLogprobs
from exo_p2p.vision.fetch import ImageUrlPolicy

_json = msgspec.json.Encoder()


class InputItem(msgspec.Struct, frozen=True):
    """One item of ``input``: only messages are served (``type`` absent or ``message``)."""

    role: str | None = None
    content: str | list[ContentPart] | None = None
    type: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: Any = None
    output: Any = None
    encrypted_content: Any = None


class TextConfig(msgspec.Struct, frozen=True):
    """``text``: its ``format`` is read by ``exo_p2p.api.formats.responses_text_format``."""

    format: Any = None


class ResponsesRequest(msgspec.Struct, frozen=True):
    """``POST /v1/responses`` (unknown fields ignored)."""

    model: NonEmptyStr
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: PositiveTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    reasoning: Any = None
    prompt: Any = None
    metadata: dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None


def responses_params(r: ResponsesRequest, key: bytes | None = None, images: ImageUrlPolicy = NO_URLS) -> GenerationParams:
    """``GenerationParams`` of a stateless response; 400 naming what cannot be honoured.
    ``key`` opens reasoning items' ``encrypted_content`` (``responses_include``; None: such
    items are not rendered); ``input_image`` parts are read under ``images``."""
    refuse_set([
        ("store", bool(r.store), "responses are not stored by this server; send store: false (or omit it)"),
        ("previous_response_id", r.previous_response_id is not None,
         "responses are not stored by this server, so none can be continued; send the whole conversation in input"),
        ("conversation", r.conversation is not None, "conversations are not stored by this server"),
        ("background", bool(r.background), "background responses are not supported"),
        ("prompt", r.prompt is not None, "stored prompt templates are not supported"),
    ])
    wants_encrypted_reasoning(r.include)
    messages: list[ChatMessage] = []
    if r.instructions:
        messages.append(ChatMessage("system", r.instructions))
    if isinstance(r.input, str):
        messages.append(ChatMessage("user", r.input))
    else:
        check_count(sum(isinstance(it.content, list) and sum(p.type in IMAGE_PARTS for p in it.content) for it in r.input), "input")
        for i, item in enumerate(r.input):
            if item.type == "reasoning":
                if key is not None and (thought := reasoning_message(i, item, key)) is not None:
                    messages.append(thought)
            elif item.type in ("function_call", "function_call_output"):
                tool_item(i, item, messages)
            else:
                messages.append(_item_message(i, item, images))
        messages = join_reasoning(messages)
    if not messages or all(m.role == "system" for m in messages):
        raise ApiError(400, "input must contain at least one message", param="input")
    optional = {"max_tokens": r.max_output_tokens, "temperature": r.temperature, "top_p": r.top_p}
    fmt = output_format(responses_text_format(r.text and r.text.format), *extensions(r.regex, r.grammar))
    tools = responses_tools(r.tools)
    fields = {"tools": tools, "tool_choice": responses_choice(r.tool_choice, tools), "thinking": responses_thinking(r.reasoning),
              "thinking_budget": effort_budget(r.reasoning.get("effort") if isinstance(r.reasoning, dict) else None),
              "logprobs": requested(wants_logprobs(r.include), r.top_logprobs, enabled_param="include"),
              "one_call": r.parallel_tool_calls is False}
    return GenerationParams(messages=tuple(messages), output_format=fmt, **fields,  # type: ignore[arg-type]
                            **{k: v for k, v in optional.items() if v is not None})


def _item_message(index: int, item: InputItem, policy: ImageUrlPolicy) -> ChatMessage:
    where = f"input[{index}]"
    if item.type not in (None, "message"):
        raise ApiError(400, f"{where}.type '{item.type[:64]}' is not supported: only message items are served", param=f"{where}.type")
    role = ROLE_ALIASES.get(item.role or "")
    if role is None:
        raise ApiError(400, f"{where}.role must be user, assistant, system or developer, got {item.role!r:.64}", param=f"{where}.role")
    if item.content is None:
        raise ApiError(400, f"{where}.content is required", param=f"{where}.content")
    text, images = user_content(where, item.content, role, policy)  # images: input_image parts of user items
    return ChatMessage(role, text, images=images)


class ResponsesEncoder:
    """Responses bytes of one generation; stateful (sequence numbers, the text so far)."""

    family = "openai"
    media_type = SSE_MEDIA_TYPE

    def __init__(self, task_id: str, model: str, request: ResponsesRequest) -> None:
        self.id = f"resp_{task_id.replace('-', '')}"
        self.item_id = f"msg_{task_id.replace('-', '')}"
        self.created_at = int(time.time())
        self.model = model
        self.request = request
        self._seq = 0
        self._texts: list[str] = []
        self._logprobs: list[dict[str, Any]] = []  # the output text's tokens' (include message.output_text.logprobs)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(payload, event=kind)

    def _message(self, status: str, text: str | None) -> dict[str, Any]:
        content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": self._logprobs}]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def response(self, status: str, *, text: str | None = None, chunk: FinishChunk | None = None,
                 error: ErrorInfo | None = None) -> dict[str, Any]:
        """The ``response`` object in state ``status`` (``in_progress``, ``completed``,
        ``incomplete``, ``failed``)."""
        r = self.request
        usage = None
        if chunk is not None:
            usage = {
                "input_tokens": chunk.prompt_tokens,
                "input_tokens_details": {"cached_tokens": min(chunk.cached_tokens, chunk.prompt_tokens)},
                "output_tokens": chunk.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None if error is None else {"code": error.code or error.type, "message": overflow_message("openai", error)},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": [] if text is None else [self._message("completed" if status == "completed" else "incomplete", text)],
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": r.temperature,
            "text": {"format": r.text.format if r.text and isinstance(r.text.format, dict) else {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": r.top_p,
            "truncation": "disabled",
            "usage": usage,
            "metadata": r.metadata or {},
        }

    def start(self, prompt_tokens: int | None) -> bytes:
        started = self.response("in_progress")
        return (
            self._event("response.created", response=started)
            + self._event("response.in_progress", response=started)
            + self._event("response.output_item.added", output_index=0, item=self._message("in_progress", None))
            + self._event("response.content_part.added", item_id=self.item_id, output_index=0, content_index=0,
                          part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        )

    def text(self, delta: str) -> bytes:
        self._texts.append(delta)
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0, delta=delta, logprobs=[])

    def text_with_logprobs(self, delta: str, logprobs: TokenLogprobs, offset: int) -> bytes:
        """A token's delta event with its ``logprobs`` entry (kept for the done events)."""
        entry = openai_entry(logprobs)
        self._logprobs.append(entry)
        self._texts.append(delta)
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0, content_index=0, delta=delta,
                           logprobs=[entry])

    def finish(self, chunk: FinishChunk) -> bytes:
        text = "".join(self._texts)
        status = "incomplete" if chunk.finish_reason == "length" else "completed"
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": self._logprobs}
        return (
            self._event("response.output_text.done", item_id=self.item_id, output_index=0, content_index=0, text=text,
                        logprobs=self._logprobs)
            + self._event("response.content_part.done", item_id=self.item_id, output_index=0, content_index=0, part=part)
            + self._event("response.output_item.done", output_index=0, item=self._message("completed" if status == "completed" else "incomplete", text))
            + self._event(f"response.{status}", response=self.response(status, text=text, chunk=chunk))
        )

    def error(self, info: ErrorInfo) -> bytes:
        return self._event("error", code=info.code or info.type, message=overflow_message("openai", info), param=info.param) + self._event(
            "response.failed", response=self.response("failed", text="".join(self._texts), error=info)
        )

    def keepalive(self) -> bytes:
        """``response.in_progress`` again: a real event, so a client's idle timer that counts
        events (Codex's) resets, where an SSE comment would not."""
        return self._event("response.in_progress", response=self.response("in_progress"))

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        status = "incomplete" if chunk.finish_reason == "length" else "completed"
        return _json.encode(self.response(status, text=text, chunk=chunk))

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """``body`` of the turn's text, with its tokens' ``logprobs`` when asked for."""
        self._logprobs = [openai_entry(lp) for lp in turn.logprobs]
        return self.body(turn.text, chunk)


def responses_job(r: ResponsesRequest, ctx: ApiContext) -> GenerationJob:
    key = ctx.config.reasoning_key
    params = responses_params(r, key, ctx.config.image_urls)
    model_id = ctx.model_id(r.model)
    check_images(ctx.card(r.model), model_id, params.messages, param="input")
    task_id = new_task_id()
    encoder: ResponsesEncoder | ItemsEncoder = ResponsesEncoder(task_id, model_id, r)
    if params.tools or params.thinking:
        if params.logprobs is not None:
            raise ApiError(400, "include 'message.output_text.logprobs' is not supported with tools or reasoning on "
                           "/v1/responses (use /v1/chat/completions)", param="include", code="unsupported_parameter")
        encoder = ItemsEncoder(encoder, limit=1 if r.parallel_tool_calls is False else None, tools=r.tools or [], choice=r.tool_choice,
                               seal_key=key if wants_encrypted_reasoning(r.include) else None)
    return GenerationJob(model_id=model_id, params=params, stream=bool(r.stream), encoder=encoder, task_id=task_id)


def routes(ctx: ApiContext) -> list[Route]:
    """``POST /v1/responses``."""

    async def responses(request: Request) -> GenerationResponse:
        return ctx.generate(await ctx.job(responses_job, await ctx.read_json(request, ResponsesRequest), ctx))

    return [Route("/v1/responses", responses, methods=["POST"])]
