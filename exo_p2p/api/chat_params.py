"""The pure rule from an OpenAI chat-completions request to our ``GenerationParams``.

``chat_plan(request, aliases)`` checks what msgspec's schema cannot (roles, content parts,
unsupported parameters, empty messages) and raises ``ApiError(400)`` naming the parameter;
it does no I/O. Defaults not given by the client are ``GenerationParams``' own.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from exo_p2p.api.errors import ApiError
from exo_p2p.api.schemas import ChatCompletionRequest, MessageIn
from exo_p2p.types import ChatMessage, GenerationParams

ROLE_ALIASES = {"system": "system", "user": "user", "assistant": "assistant", "developer": "system"}
"""Accepted roles and the role they are served as (``developer`` is OpenAI's newer ``system``)."""
_NO_TOOLS = (None, "none", "auto")


class ChatPlan(msgspec.Struct, frozen=True):
    """A validated chat completion: the model id (aliases resolved), the generation
    parameters, and how to answer (``stream``, ``include_usage``)."""

    model_id: str
    params: GenerationParams
    stream: bool
    include_usage: bool


def chat_plan(request: ChatCompletionRequest, aliases: Mapping[str, str] | None = None) -> ChatPlan:
    """Validate ``request`` and map it to a ``ChatPlan``.

    Raises ``ApiError(400, param=...)`` for: empty ``messages``; a ``tool``/``function`` or
    unknown role; a content part other than text; an assistant message with tool calls; a
    known unsupported parameter at a non-default value (``n`` > 1, ``tools``, ``tool_choice``,
    ``functions``, ``function_call``, ``logprobs``, ``top_logprobs``, ``response_format``
    other than text, ``logit_bias``, ``presence_penalty``/``frequency_penalty`` ≠ 0,
    ``audio``, ``modalities`` other than text). Empty stop strings are dropped.
    """
    _refuse_unsupported(request)
    if not request.messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    messages = tuple(_message(i, m) for i, m in enumerate(request.messages))
    fields: dict[str, object] = {"messages": messages}
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if request.temperature is not None:
        fields["temperature"] = float(request.temperature)
    if request.top_p is not None:
        fields["top_p"] = float(request.top_p)
    if request.seed is not None:
        fields["seed"] = request.seed
    stop = [request.stop] if isinstance(request.stop, str) else (request.stop or [])
    fields["stop"] = tuple(s for s in stop if s)
    model_id = (aliases or {}).get(request.model, request.model)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return ChatPlan(model_id, GenerationParams(**fields), bool(request.stream), include_usage)  # type: ignore[arg-type]


def _message(index: int, message: MessageIn) -> ChatMessage:
    where = f"messages[{index}]"
    role = ROLE_ALIASES.get(message.role)
    if role is None:
        if message.role in ("tool", "function"):
            raise ApiError(400, f"{where}.role '{message.role}' is not supported: tool calling is not served", param=f"{where}.role")
        raise ApiError(
            400,
            f"{where}.role '{message.role[:64]}' is unknown: expected system, user, assistant or developer",
            param=f"{where}.role",
        )
    if message.tool_calls:
        raise ApiError(400, f"{where}.tool_calls is not supported: tool calling is not served", param=f"{where}.tool_calls")
    content = message.content
    if content is None:
        if role != "assistant":
            raise ApiError(400, f"{where}.content is required for role '{message.role}'", param=f"{where}.content")
        return ChatMessage(role=role, content="")
    if isinstance(content, str):
        return ChatMessage(role=role, content=content)
    texts: list[str] = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise ApiError(
                400,
                f"{where}.content[{j}] has type '{part.type[:64]}': only 'text' content parts are supported",
                param=f"{where}.content[{j}].type",
            )
        if part.text is None:
            raise ApiError(400, f"{where}.content[{j}].text is required", param=f"{where}.content[{j}].text")
        texts.append(part.text)
    return ChatMessage(role=role, content="".join(texts))


def _refuse_unsupported(r: ChatCompletionRequest) -> None:
    checks: list[tuple[str, bool, str]] = [
        ("n", r.n is not None and r.n > 1, "only n=1 is supported"),
        ("tools", bool(r.tools), "tool calling is not supported"),
        ("tool_choice", r.tool_choice not in _NO_TOOLS, "tool calling is not supported"),
        ("functions", bool(r.functions), "function calling is not supported"),
        ("function_call", r.function_call not in _NO_TOOLS, "function calling is not supported"),
        ("logprobs", bool(r.logprobs), "logprobs are not supported"),
        ("top_logprobs", bool(r.top_logprobs), "logprobs are not supported"),
        (
            "response_format",
            r.response_format is not None and r.response_format.type != "text",
            "only response_format type 'text' is supported",
        ),
        ("logit_bias", bool(r.logit_bias), "logit_bias is not supported"),
        ("presence_penalty", bool(r.presence_penalty), "presence_penalty is not supported (must be 0)"),
        ("frequency_penalty", bool(r.frequency_penalty), "frequency_penalty is not supported (must be 0)"),
        ("audio", r.audio is not None, "audio output is not supported"),
        ("modalities", any(m != "text" for m in r.modalities or ()), "only the 'text' modality is supported"),
    ]
    for param, refused, why in checks:
        if refused:
            raise ApiError(400, f"unsupported parameter '{param}': {why}", param=param, code="unsupported_parameter")
