"""Tools and reasoning in OpenAI Responses (docs/api.md#tools-and-reasoning).

Request: function ``tools`` (``{"type": "function", "name", "description", "parameters"}``;
built-in tools such as web search, which the models here cannot run, are left out), ``tool_choice`` (``auto``, ``none``,
``required``, ``{"type": "function", "name"}``), ``parallel_tool_calls`` (false: one call at
most), ``reasoning.effort`` (``none`` turns thinking off, any other effort on); ``input``
items ``function_call`` (joined to the assistant turn before them) and
``function_call_output`` (a tool message); ``reasoning`` items as ``responses_include`` says.

Answer (``ItemsEncoder``): a ``reasoning`` item (its text as ``reasoning_text`` content), the
``message`` item, one ``function_call`` item per call (``call_id``, ``name``, ``arguments``).
A stream adds each item when its first piece comes: ``response.reasoning_text.delta`` /
``.done``; a call as ``response.output_item.added`` (empty arguments),
``response.function_call_arguments.delta`` and ``.done``, ``response.output_item.done``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from exo_p2p.api.families.openai.chat_tools import checked_effort
from exo_p2p.api.errors import ApiError, overflow_message
from exo_p2p.api.families.openai.sealed_reasoning import seal
from exo_p2p.api.families.tool_calls import bad, earlier_call, flat_tools, function_choice
from exo_p2p.api.generation.turn import Turn
from exo_p2p.types import ChatMessage, ErrorInfo, FinishChunk, ToolCall

_json = msgspec.json.Encoder()
_FIELDS = ("name", "description", "parameters")


def responses_tools(tools: list[Any] | None) -> str | None:
    """``GenerationParams.tools`` of Responses ``tools`` (400 naming ``tools[i]…``)."""
    return flat_tools(tools, "function", _FIELDS, "tools[{}]")


def responses_choice(choice: Any, tools: str | None) -> str:
    """Our ``tool_choice`` of a Responses one (None: ``auto``); 400 for another shape."""
    return function_choice(choice, tools, lambda c: c.get("name"), '{"type": "function", "name": ...}')


def responses_thinking(reasoning: Any) -> bool | None:
    """``reasoning.effort`` → thinking (``none`` off, other efforts on, absent None); 400 for
    an effort not in ``REASONING_EFFORTS`` or a ``reasoning`` that is not an object."""
    if reasoning is not None and not isinstance(reasoning, dict):
        raise ApiError(400, "reasoning: must be an object such as {\"effort\": \"low\"}", param="reasoning")
    effort = checked_effort(reasoning.get("effort") if reasoning else None, "reasoning.effort")
    return None if effort is None else effort != "none"


def tool_item(i: int, item: Any, messages: list[ChatMessage]) -> None:
    """Add a ``function_call``, ``function_call_output`` or ``reasoning`` input item to
    ``messages`` (a call joins the assistant turn just before it)."""
    where = f"input[{i}]"
    if item.type == "function_call":
        call = earlier_call(item.call_id, item.name, item.arguments if item.arguments is not None else "{}", where, id_field="call_id")
        if messages and messages[-1].role == "assistant":
            last = messages.pop()
            messages.append(msgspec.structs.replace(last, tool_calls=(*last.tool_calls, call)))
        else:
            messages.append(ChatMessage("assistant", "", tool_calls=(call,)))
    elif item.type == "function_call_output":
        if not item.call_id:
            raise bad(f"{where}.call_id", "a function_call_output needs the call_id of its call")
        messages.append(ChatMessage("tool", _output_text(where, item.output), tool_call_id=item.call_id))


def _output_text(where: str, output: Any) -> str:
    """A ``function_call_output``'s text: a string, or a list of parts each with a string
    ``text`` (``input_text`` / ``output_text``); 400 naming ``where.output`` otherwise (an
    object, a number, a missing output, a part without text)."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in output):
        raise bad(f"{where}.output", "must be a string or a list of text parts")
    return "".join(p["text"] for p in output)


class ItemsEncoder:
    """Responses bytes of a request with tools or reasoning; ``base`` is the family's plain
    ``ResponsesEncoder`` (its ids, sequence numbers and response object), ``limit`` the most
    calls returned, ``tools`` the request's tools as Responses lists them; with ``seal_key``
    each reasoning item carries its text sealed as ``encrypted_content``
    (``exo_p2p.api.families.openai.sealed_reasoning``)."""

    family = "openai"

    def __init__(self, base: Any, *, limit: int | None, tools: list[Any], choice: Any, seal_key: bytes | None = None) -> None:
        self.base, self.limit, self.tools, self.choice = base, limit, tools, choice
        self.seal_key = seal_key
        self.media_type = base.media_type
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        return self.base._event(kind, **fields)

    def _response(self, status: str, chunk: FinishChunk | None = None, error: ErrorInfo | None = None, reasoning_tokens: int = 0) -> dict[str, Any]:
        doc = self.base.response(status, chunk=chunk, error=error)
        doc.update(output=list(self.items), tools=self.tools, tool_choice=self.choice if self.choice is not None else "auto",
                   parallel_tool_calls=self.limit is None)
        if doc["usage"] is not None:
            doc["usage"]["output_tokens_details"]["reasoning_tokens"] = reasoning_tokens
        return doc

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        index = self.items.index(item)
        out = b""
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out = self._event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            if self.seal_key is not None:
                item["encrypted_content"] = seal(self.seal_key, text)
        elif item["type"] == "message":
            text = item["content"][0]["text"]
            out = self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=item["content"][0])
        item["status"] = "completed"
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _add(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self.items.append(item)
        self._open = item
        empty = {**item, "content": []} if "content" in item else item
        out += self._event("response.output_item.added", output_index=len(self.items) - 1, item={**empty, "status": "in_progress"})
        if item["type"] == "message":
            out += self._event("response.content_part.added", item_id=item["id"], output_index=len(self.items) - 1, content_index=0,
                               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        return out

    def start(self, prompt_tokens: int | None) -> bytes:
        started = self._response("in_progress")
        return self._event("response.created", response=started) + self._event("response.in_progress", response=started)

    def reasoning(self, delta: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "reasoning":
            out = self._add({"id": f"rs_{self.base.id[5:]}_{len(self.items)}", "type": "reasoning", "summary": [],
                             "content": [{"type": "reasoning_text", "text": ""}]})
        assert self._open is not None
        self._open["content"][0]["text"] += delta
        return out + self._event("response.reasoning_text.delta", item_id=self._open["id"], output_index=len(self.items) - 1,
                                 content_index=0, delta=delta)

    def text(self, delta: str) -> bytes:
        out = b""
        if self._open is None or self._open["type"] != "message":
            out = self._add({"id": f"msg_{self.base.id[5:]}_{len(self.items)}", "type": "message", "role": "assistant",
                             "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]})
        assert self._open is not None
        self._open["content"][0]["text"] += delta
        return out + self._event("response.output_text.delta", item_id=self._open["id"], output_index=len(self.items) - 1,
                                 content_index=0, delta=delta, logprobs=[])

    def calls(self, calls: tuple[ToolCall, ...], first: int) -> bytes:
        out = b""
        for i, call in enumerate(calls, start=first):
            if self.limit is not None and i >= self.limit:
                break
            item = {"id": f"fc_{call.id.removeprefix('call_')}", "type": "function_call", "call_id": call.id, "name": call.name,
                    "arguments": ""}
            out += self._add(item)
            index = len(self.items) - 1
            out += self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=call.arguments)
            item["arguments"] = call.arguments
            out += self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=call.arguments,
                               name=call.name)
        return out

    def finish(self, chunk: FinishChunk) -> bytes:
        return self.finish_turn(chunk, None)

    def finish_turn(self, chunk: FinishChunk, turn: Turn | None) -> bytes:
        """The closing events; the usage counts ``turn``'s reasoning tokens apart."""
        status = "incomplete" if chunk.finish_reason == "length" else "completed"
        reasoning = turn.reasoning_tokens if turn is not None else 0
        return self._close() + self._event(f"response.{status}", response=self._response(status, chunk, reasoning_tokens=reasoning))

    def error(self, info: ErrorInfo) -> bytes:
        return (self._event("error", code=info.code or info.type, message=overflow_message("openai", info), param=info.param)
                + self._event("response.failed", response=self._response("failed", error=info)))

    def keepalive(self) -> bytes:
        """``response.in_progress`` again (a real event, ``ResponsesEncoder.keepalive``)."""
        return self._event("response.in_progress", response=self._response("in_progress"))

    def body(self, text: str, chunk: FinishChunk) -> bytes:
        turn = Turn()
        turn.texts.append(text)
        return self.answer(turn, chunk)

    def answer(self, turn: Turn, chunk: FinishChunk) -> bytes:
        """A whole response: its reasoning, message and function call items."""
        if turn.reasoning:
            self.reasoning(turn.reasoning)
        if turn.text or not turn.calls:
            self.text(turn.text)
        self.calls(tuple(turn.calls), 0)
        self._close()
        for item in self.items:
            item["status"] = "completed"
        status = "incomplete" if chunk.finish_reason == "length" else "completed"
        return _json.encode(self._response(status, chunk, reasoning_tokens=turn.reasoning_tokens))
