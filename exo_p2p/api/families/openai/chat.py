"""OpenAI chat completions, ``POST /v1/chat/completions``.

``chat_job(request, ctx)`` is the pure rule from the request to a ``GenerationJob``: it checks
what msgspec's schema cannot (roles, content parts, unsupported parameters, empty messages)
and raises ``ApiError(400)`` naming the parameter. Defaults not given by the client are
``GenerationParams``' own (no ``max_tokens``: until the model stops or the context is full).
``ChatEncoder`` turns our chunks into OpenAI bytes: a stream is ``role chunk, content
chunks…, one finish chunk, [usage chunk], data: [DONE]``; exactly one event carries a
non-null ``finish_reason``; an error after the stream began is ``data: {"error": …}`` then
``data: [DONE]`` (the openai SDK raises it as ``APIError``).
"""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.routing import Route

from exo_p2p.api.context import ApiContext
from exo_p2p.api.errors import ApiError, error_body
from exo_p2p.api.families.common import SSE_KEEPALIVE, SSE_MEDIA_TYPE, logit_bias_pairs, refuse_set, sse, stop_strings
from exo_p2p.api.formats import extensions, openai_response_format, output_format
from exo_p2p.api.families.openai.chat_tools import (
    answer_message,
    assistant_calls,
    call_events,
    chat_tool_fields,
    reasoning_event,
    tool_result,
    usage_of,
)
from exo_p2p.api.families.logprob_shapes import openai_entry, requested
from exo_p2p.api.generation.path import GenerationResponse
from exo_p2p.api.generation.job import GenerationJob, new_task_id
from exo_p2p.api.schemas import (
    AssistantMessage,
    CachedTokens,
    ContentPart,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    Delta,
    MessageIn,
    StreamChoice,
    Usage,
)
from exo_p2p.api.generation.turn import Turn
from exo_p2p.api.vision.admit import check_count, check_images
from exo_p2p.api.vision.parts import NO_URLS, image_from_url
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk, GenerationParams, ImageRef, ToolCall
from exo_p2p.vision.fetch import ImageUrlPolicy
from exo_p2p.types.chunks import TokenLogprobs

ROLE_ALIASES = {"system": "system", "user": "user", "assistant": "assistant", "developer": "system"}
"""Accepted roles and the role they are served as (``developer`` is OpenAI's newer ``system``)."""
_NO_TOOLS = (None, "none", "auto")
DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()


def openai_finish_reason(reason: str) -> str:
    """Our ``FinishReason`` as OpenAI's: ``cancelled`` → ``stop``; ``stop``/``length`` unchanged."""
    return "stop" if reason == "cancelled" else reason


def chat_params(request: ChatCompletionRequest, images: ImageUrlPolicy = NO_URLS) -> GenerationParams:
    """Validate ``request`` and map it to ``GenerationParams``.

    Raises ``ApiError(400, param=...)`` for: empty ``messages``; a ``function`` or unknown
    role; a content part other than text; bad tools, tool calls or tool messages
    (``openai_tools``); a known unsupported parameter at a non-default value (``n`` > 1,
    ``functions``, ``function_call``, ``audio``, ``modalities`` other than text); ``top_logprobs``
    outside 0..20 or without ``logprobs`` (``logprob_shapes.requested``); a bad ``logit_bias``; a bad or second output format
    (``response_format``, ``regex``, ``grammar``: ``exo_p2p.api.formats``). Empty stop
    strings are dropped. Image parts are read under ``images`` (``exo_p2p.api.vision.parts``: 400
    for a bad image, or a URL the policy does not fetch).
    """
    _refuse_unsupported(request)
    if not request.messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    check_count(sum(isinstance(m.content, list) and sum(p.type in IMAGE_PARTS for p in m.content) for m in request.messages), "messages")
    messages = tuple(message_of(i, m, images=images) for i, m in enumerate(request.messages))
    fields: dict[str, object] = {"messages": messages, "stop": stop_strings(request.stop)}
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    optional = {
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repetition_penalty": request.repetition_penalty,
        "speculative": request.speculative,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    fields["logit_bias"] = logit_bias_pairs(request.logit_bias)
    fields["output_format"] = output_format(openai_response_format(request.response_format),
                                            *extensions(request.regex, request.grammar))
    fields.update(chat_tool_fields(request))
    fields["logprobs"] = requested(request.logprobs, request.top_logprobs)
    return GenerationParams(**fields)  # type: ignore[arg-type]


def chat_job(request: ChatCompletionRequest, ctx: ApiContext) -> GenerationJob:
    """The ``GenerationJob`` of a chat completion (see ``chat_params``; images checked against
    the model by ``exo_p2p.api.vision.admit.check_images``)."""
    params = chat_params(request, ctx.config.image_urls)
    model_id = ctx.model_id(request.model)
    check_images(ctx.card(request.model), model_id, params.messages)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    task_id = new_task_id()
    encoder = ChatEncoder(id=f"chatcmpl-{task_id}", created=int(time.time()), model=model_id, include_usage=include_usage,
                          call_limit=1 if request.parallel_tool_calls is False else None,
                          logprobs=params.logprobs is not None)
    return GenerationJob(model_id=model_id, params=params, stream=bool(request.stream), encoder=encoder, task_id=task_id)


def message_of(index: int, message: MessageIn, where_prefix: str = "messages", images: ImageUrlPolicy = NO_URLS) -> ChatMessage:
    """One OpenAI message as a ``ChatMessage`` (text parts joined, image parts read under
    ``images`` into ``ChatMessage.images``); 400 naming ``messages[i]…`` for a role, content,
    image or tool call we cannot serve."""
    where = f"{where_prefix}[{index}]"
    if message.role == "tool":
        return tool_result(where, _text_of(where, message.content or ""), message.tool_call_id, message.name)
    role = ROLE_ALIASES.get(message.role)
    if role is None:
        if message.role == "function":
            raise ApiError(400, f"{where}.role 'function' is not supported: send tool calls and role 'tool'", param=f"{where}.role")
        raise ApiError(
            400,
            f"{where}.role '{message.role[:64]}' is unknown: expected system, developer, user, assistant or tool",
            param=f"{where}.role",
        )
    calls: tuple[ToolCall, ...] = ()
    if message.tool_calls and role == "assistant":
        calls = assistant_calls(where, message.tool_calls)
    elif message.tool_calls:
        raise ApiError(400, f"{where}.tool_calls: only assistant messages carry tool calls", param=f"{where}.tool_calls")
    if message.content is None and role != "assistant":
        raise ApiError(400, f"{where}.content is required for role '{message.role}'", param=f"{where}.content")
    reasoning = (message.reasoning_content or message.reasoning) if role == "assistant" else None
    text, pictures = user_content(where, message.content or "", role, images)
    return ChatMessage(role=role, content=text, tool_calls=calls, reasoning=reasoning, images=pictures)


def user_content(where: str, content: str | list, role: str, policy: ImageUrlPolicy) -> tuple[str, tuple[ImageRef, ...]]:
    """A message's text (text parts joined) and, in a user message, its images (image parts
    read under ``policy``, in order); 400 naming ``where.content[j]`` for a part we cannot serve."""
    parts = content if isinstance(content, list) and role == "user" else []
    pictures = tuple(_image_of(f"{where}.content[{j}]", p, policy) for j, p in enumerate(parts) if p.type in IMAGE_PARTS)
    return _text_of(where, content, skip=IMAGE_PARTS if parts else ()), pictures


IMAGE_PARTS = ("image_url", "input_image")
"""Part types holding an image (chat's and Responses'); only user messages carry them."""


def _image_of(where: str, part: ContentPart, policy: ImageUrlPolicy) -> ImageRef:
    """An image part's image: chat's ``image_url.url`` or Responses' ``image_url`` string."""
    if part.file_id is not None:
        raise ApiError(400, f"{where}.file_id: files are not stored here; send the image as a data URL", param=f"{where}.file_id")
    url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
    return image_from_url(f"{where}.image_url", url, policy)


def _text_of(where: str, content: str | list, skip: tuple[str, ...] = ()) -> str:
    """A message's content as text (text parts joined, parts of a type in ``skip`` left out;
    400 naming another part)."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type in skip:
            continue
        if part.type not in ("text", "input_text", "output_text"):
            raise ApiError(
                400,
                f"{where}.content[{j}] has type '{part.type[:64]}': only 'text' content parts are supported",
                param=f"{where}.content[{j}].type",
            )
        if part.text is None:
            raise ApiError(400, f"{where}.content[{j}].text is required", param=f"{where}.content[{j}].text")
        texts.append(part.text)
    return "".join(texts)


def _refuse_unsupported(r: ChatCompletionRequest) -> None:
    refuse_set([
        ("n", r.n is not None and r.n > 1, "only n=1 is supported"),
        ("functions", bool(r.functions), "function calling is not supported"),
        ("function_call", r.function_call not in _NO_TOOLS, "function calling is not supported"),
        ("audio", r.audio is not None, "audio output is not supported"),
        ("modalities", any(m != "text" for m in r.modalities or ()), "only the 'text' modality is supported"),
    ])


class ChatEncoder(msgspec.Struct, frozen=True):
    """OpenAI chat bytes of one completion: ``id`` is ``chatcmpl-<task_id>``, ``created``
    Unix seconds, ``model`` the model id served; ``include_usage`` adds the usage chunk."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    call_limit: int | None = None
    """Calls of an answer returned at most (1 for ``parallel_tool_calls: false``)."""
    logprobs: bool = False
    """The request asked for log-probabilities (``choices[].logprobs.content``)."""
    family: str = "openai"
    media_type: str = SSE_MEDIA_TYPE

    def _chunk(self, delta: Delta, finish_reason: str | None) -> bytes:
        choice = StreamChoice(index=0, delta=delta, finish_reason=finish_reason)
        return sse(ChatCompletionChunk(self.id, "chat.completion.chunk", self.created, self.model, [choice]))

    def start(self, prompt_tokens: int | None) -> bytes:
        """The first event: ``delta: {"role": "assistant", "content": ""}``."""
        return self._chunk(Delta(role="assistant", content=""), None)

    def text(self, delta: str) -> bytes:
        return self._chunk(Delta(content=delta), None)

    def text_with_logprobs(self, delta: str, logprobs: TokenLogprobs, offset: int) -> bytes:
        """A token's event with its ``logprobs.content`` entry (an empty delta when its text
        is reasoning or held back)."""
        choice = {"index": 0, "delta": {"content": delta} if delta else {}, "logprobs": {"content": [openai_entry(logprobs)]},
                  "finish_reason": None}
        return sse({**self._head(), "choices": [choice]})

    def finish(self, chunk: FinishChunk) -> bytes:
        """The one event with a non-null ``finish_reason`` (empty delta), [usage], [DONE]."""
        return self.finish_turn(chunk, None)

    def finish_turn(self, chunk: FinishChunk, turn: Turn | None) -> bytes:
        """``finish``, the usage chunk counting ``turn``'s reasoning tokens apart
        (``completion_tokens_details.reasoning_tokens``, as a whole answer's usage does)."""
        tail = self._chunk(Delta(), openai_finish_reason(chunk.finish_reason))
        if self.include_usage:
            usage = usage_of(chunk, turn.reasoning_tokens if turn is not None else 0)
            tail += sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                         "choices": [], "usage": usage})
        return tail + DONE

    def error(self, info: ErrorInfo) -> bytes:
        return sse(error_body(info)) + DONE

    def keepalive(self) -> bytes:
        return SSE_KEEPALIVE

    def _head(self) -> dict[str, object]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}

    def reasoning(self, delta: str) -> bytes:
        return reasoning_event(self._head(), delta)

    def calls(self, calls: tuple[ToolCall, ...], first: int) -> bytes:
        return call_events(self._head(), calls, first, self.call_limit)

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """A whole ``chat.completion`` with the text, reasoning and calls (``openai_tools``)."""
        choice = {"index": 0, "message": answer_message(turn, self.call_limit), "finish_reason": openai_finish_reason(chunk.finish_reason),
                  "logprobs": {"content": [openai_entry(lp) for lp in turn.logprobs]} if self.logprobs else None}
        return _json.encode({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                             "choices": [choice], "usage": usage_of(chunk, turn.reasoning_tokens)})

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        """A whole non-streamed ``chat.completion`` JSON body."""
        choice = Choice(index=0, message=AssistantMessage("assistant", text), finish_reason=openai_finish_reason(chunk.finish_reason))
        usage = Usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.prompt_tokens + chunk.completion_tokens, CachedTokens(min(chunk.cached_tokens, chunk.prompt_tokens)))
        return _json.encode(ChatCompletion(self.id, "chat.completion", self.created, self.model, [choice], usage))


def routes(ctx: ApiContext) -> list[Route]:
    """``POST /v1/chat/completions``."""

    async def chat_completions(request: Request) -> GenerationResponse:
        return ctx.generate(await ctx.job(chat_job, await ctx.read_json(request, ChatCompletionRequest), ctx))

    return [Route("/v1/chat/completions", chat_completions, methods=["POST"])]

