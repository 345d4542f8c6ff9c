"""Tools and thinking in Anthropic Messages (docs/api.md#tools-and-reasoning).

Request: custom ``tools`` (``name``, ``description``, ``input_schema``; server tools such as
web search, which the models here cannot run, are left out), ``tool_choice`` (``auto``, ``any`` → required, ``tool`` →
that tool, ``none``; ``disable_parallel_tool_use``: one call at most), assistant ``tool_use``
and ``thinking`` blocks, user ``tool_result`` blocks (each becomes a tool message, before the
user's text); ``thinking`` ``enabled``/``adaptive`` turns the template's thinking on and
answers ``thinking`` blocks, ``disabled`` turns it off; without it the template decides and
any reasoning is dropped. System prompts lose their per-request noise (``system_text``).

Answer: ``thinking`` block (when enabled), ``text`` block, ``tool_use`` blocks (``input`` the
decoded arguments), ``stop_reason: tool_use``. A stream opens each block when its first piece
comes (a request without thinking opens its text block at once, as before), sends a call as
``content_block_start`` with ``input: {}``, one ``input_json_delta`` with the arguments and
``content_block_stop``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from exo_p2p.api.errors import anthropic_error_body
from exo_p2p.api.families.common import SSE_MEDIA_TYPE, sse
from exo_p2p.api.families.tool_calls import bad, checked_choice, earlier_call, flat_tools
from exo_p2p.api.generation.turn import Turn
from exo_p2p.api.vision.parts import NO_URLS, image_from_source
from exo_p2p.vision.fetch import ImageUrlPolicy
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk, ImageRef, ToolCall

_json = msgspec.json.Encoder()
_FIELDS = ("name", "description", "input_schema")
NOISE_LINE = re.compile(r"^\s*x-anthropic-billing-header\s*:.*$\n?", re.MULTILINE | re.IGNORECASE)
"""A system-prompt line that changes on every request (Claude Code's billing header): dropped,
as it would make every agent turn's prompt differ from its first bytes and miss the cache."""


def system_text(text: str) -> str:
    """``text`` without ``NOISE_LINE`` lines."""
    return NOISE_LINE.sub("", text) if "x-anthropic-billing-header" in text.lower() else text


def anthropic_tools(tools: list[Any] | None) -> str | None:
    """``GenerationParams.tools`` of Anthropic ``tools`` (400 naming ``tools.i…``)."""
    return flat_tools(tools, "custom", _FIELDS, "tools.{}", default_kind="custom")


def anthropic_choice(choice: Any, tools: str | None) -> tuple[str, int | None]:
    """Our ``tool_choice`` of Anthropic's and the most calls to return (1 with
    ``disable_parallel_tool_use``, else None); 400 for another shape."""
    if choice is None:
        return "auto", None
    kind = choice.get("type") if isinstance(choice, dict) else None
    limit = 1 if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") else None
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if kind == "tool" and isinstance(choice.get("name"), str):
        mapped = f"function:{choice['name']}"
    if mapped is None:
        raise bad("tool_choice", "must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}")
    return checked_choice(mapped, tools, "tool_choice"), limit


def thinking_of(thinking: Any) -> bool | None:
    """``thinking`` → the template's thinking: enabled/adaptive on, disabled off, absent None."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise bad("thinking.type", "must be 'enabled', 'adaptive' or 'disabled'")
    return kind != "disabled"


def thinking_budget_of(thinking: Any) -> int | None:
    """``thinking.budget_tokens`` of an ``enabled`` block (reasoning tokens at most:
    ``worker.engine.think_budget``), None otherwise; 400 unless it is a positive integer.
    Anthropic's own minimum (1024) is not enforced: small local models think in less."""
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled" or thinking.get("budget_tokens") is None:
        return None
    budget = thinking["budget_tokens"]
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise bad("thinking.budget_tokens", "must be a positive integer")
    return budget


def _result_of(where: str, content: Any, policy: ImageUrlPolicy) -> tuple[str, tuple[ImageRef, ...]]:
    """A tool result's content (a string, or text and ``image`` blocks) as text and images."""
    if isinstance(content, str):
        return content, ()
    texts, images = [], []
    for j, block in enumerate(content or ()):
        if isinstance(block, dict) and block.get("type") == "image":
            images.append(image_from_source(f"{where}[{j}]", block.get("source"), policy))
            continue
        text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
        if not isinstance(text, str):
            raise bad(f"{where}[{j}].type", "a tool result's content may only hold text and image blocks")
        texts.append(text)
    return "".join(texts), tuple(images)


def turn_messages(i: int, role: str, blocks: list[Any], policy: ImageUrlPolicy = NO_URLS) -> list[ChatMessage]:
    """One Anthropic message's blocks as our messages: a user's ``tool_result`` blocks as tool
    messages, then its text and ``image`` blocks (read under ``policy``:
    ``exo_p2p.api.vision.parts.image_from_source``); an assistant's text, ``tool_use`` calls and
    ``thinking``. 400 naming ``messages.i.content[j]`` for a block we cannot serve."""
    texts, calls, thoughts, results, images = [], [], [], [], []
    for j, block in enumerate(blocks):
        where = f"messages.{i}.content[{j}]"
        if block.type == "text" and block.text is not None:
            texts.append(block.text)
        elif block.type == "tool_use" and role == "assistant":
            calls.append(earlier_call(block.id, block.name, block.input if block.input is not None else {}, where,
                                      arguments_field="input"))
        elif block.type == "image" and role == "user":
            images.append(image_from_source(where, block.source, policy))
        elif block.type in ("thinking", "redacted_thinking") and role == "assistant":
            thoughts.append(block.thinking or "")
        elif block.type == "tool_result" and role == "user":
            if not block.tool_use_id:
                raise bad(f"{where}.tool_use_id", "a tool result needs the id of its tool_use block")
            text, pictures = _result_of(f"{where}.content", block.content, policy)
            results.append(ChatMessage("tool", text, tool_call_id=block.tool_use_id, images=pictures))
        else:
            raise bad(f"{where}.type", f"a {block.type[:64]!r} block is not supported in a {role} message")
    if role == "assistant":
        return [ChatMessage("assistant", "".join(texts), tool_calls=tuple(calls), reasoning="".join(thoughts) or None)]
    return results + ([ChatMessage("user", "".join(texts), images=tuple(images))] if texts or images or not results else [])


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_…`` form of our call id ``call_<task id>_<n>``: ``toolu_`` and the
    rest without dashes (letters, digits and ``_``, as Anthropic's ids); an id already in that
    form is kept."""
    if call_id.startswith("toolu_"):
        return call_id
    return "toolu_" + call_id.removeprefix("call_").replace("-", "")


def call_block(call: ToolCall, *, empty: bool = False) -> dict[str, Any]:
    """A ``tool_use`` block of ``call`` (``input`` empty when it opens a stream block; ``id``
    in Anthropic's form, ``tool_use_id``)."""
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {} if empty else json.loads(call.arguments)}


def anthropic_usage(prompt_tokens: int, chunk: FinishChunk | None) -> dict[str, int]:
    """Anthropic's ``usage``: ``input_tokens`` the prompt tokens prefilled,
    ``cache_read_input_tokens`` those taken from the prompt cache (their sum is the prompt,
    as Anthropic counts), ``output_tokens``; before the finish (``chunk`` None) the whole
    prompt is ``input_tokens``."""
    if chunk is None:
        return {"input_tokens": prompt_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}
    cached = min(chunk.cached_tokens, chunk.prompt_tokens)
    return {"input_tokens": chunk.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": chunk.completion_tokens}


def stop_reason(chunk: FinishChunk) -> str:
    """Anthropic's ``stop_reason`` for our finish (``tool_calls`` → ``tool_use``)."""
    if chunk.finish_reason == "tool_calls":
        return "tool_use"
    if chunk.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if chunk.finish_reason == "stop" and chunk.stop_sequence is not None else "end_turn"


class BlocksEncoder:
    """Messages bytes of a request with tools or thinking (see the module docstring):
    ``thinking`` whether thinking blocks are answered, ``limit`` the most calls returned."""

    family = "anthropic"
    media_type = SSE_MEDIA_TYPE

    def __init__(self, task_id: str, model: str, *, thinking: bool, limit: int | None) -> None:
        self.id = f"msg_{task_id.replace('-', '')}"
        self.model, self.thinking, self.limit = model, thinking, limit
        self.prompt_tokens = 0
        self._open: str | None = None
        self._index = -1

    def _message(self, content: list[dict[str, Any]], chunk: FinishChunk | None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": None if chunk is None else stop_reason(chunk),
                "stop_sequence": None if chunk is None else chunk.stop_sequence,
                "usage": anthropic_usage(self.prompt_tokens, chunk)}

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse({"type": "content_block_stop", "index": self._index}, "content_block_stop")

    def _block(self, kind: str, block: dict[str, Any]) -> bytes:
        """Close the open block, open ``block`` (of ``kind``) at the next index."""
        out = self._close()
        self._index += 1
        self._open = kind
        return out + sse({"type": "content_block_start", "index": self._index, "content_block": block}, "content_block_start")

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse({"type": "content_block_delta", "index": self._index, "delta": delta}, "content_block_delta")

    def start(self, prompt_tokens: int | None) -> bytes:
        self.prompt_tokens = prompt_tokens or 0
        # blocks open as their content comes (no empty text block before a forced tool_use)
        return sse({"type": "message_start", "message": self._message([], None)}, "message_start") + self.keepalive()

    def reasoning(self, delta: str) -> bytes:
        if not self.thinking:
            return b""
        out = b"" if self._open == "thinking" else self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return out + self._delta({"type": "thinking_delta", "thinking": delta})

    def text(self, delta: str) -> bytes:
        out = b"" if self._open == "text" else self._block("text", {"type": "text", "text": ""})
        return out + self._delta({"type": "text_delta", "text": delta})

    def calls(self, calls: tuple[ToolCall, ...], first: int) -> bytes:
        out = b""
        for i, call in enumerate(calls, start=first):
            if self.limit is None or i < self.limit:
                out += self._block("tool_use", call_block(call, empty=True))
                out += self._delta({"type": "input_json_delta", "partial_json": call.arguments}) + self._close()
        return out

    def finish(self, chunk: FinishChunk) -> bytes:
        delta = {"stop_reason": stop_reason(chunk), "stop_sequence": chunk.stop_sequence}
        usage = anthropic_usage(chunk.prompt_tokens, chunk)
        empty = self._block("text", {"type": "text", "text": ""}) if self._index < 0 else b""  # as answer(): text when nothing else
        return (empty + self._close() + sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta")
                + sse({"type": "message_stop"}, "message_stop"))

    def error(self, info: ErrorInfo) -> bytes:
        return sse(anthropic_error_body(info), "error")

    def keepalive(self) -> bytes:
        return sse({"type": "ping"}, "ping")

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        return self.answer(Turn(), chunk) if not text else _json.encode(self._message([{"type": "text", "text": text}], chunk))

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """A whole message: thinking (when enabled), text (when any, or nothing else), tool uses."""
        calls = turn.calls[: self.limit] if self.limit is not None else turn.calls
        content: list[dict[str, Any]] = []
        if self.thinking and turn.reasoning:
            content.append({"type": "thinking", "thinking": turn.reasoning, "signature": ""})
        if turn.text or not calls:
            content.append({"type": "text", "text": turn.text})
        content += [call_block(c) for c in calls]
        return _json.encode(self._message(content, chunk))


def counted_messages(messages: tuple[ChatMessage, ...], tools: str | None) -> tuple[ChatMessage, ...]:
    """What ``count_tokens`` counts: ``messages``, and the tools' JSON as a system message
    before them (an estimate: each template renders tools its own way)."""
    return ((ChatMessage("system", tools),) if tools else ()) + messages
