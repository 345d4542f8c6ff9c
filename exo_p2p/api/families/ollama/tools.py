"""Tools and thinking in Ollama's ``/api/chat`` (docs/api.md#tools-and-reasoning).

Request: ``tools`` (OpenAI's function tool shape), assistant messages' ``tool_calls``
(``{"function": {"name", "arguments"}}``, arguments an object; ids are made from the
message's and the call's position, the same on every turn), ``role: tool`` messages (their
``tool_name`` kept as the tool's name); ``think`` (true or an effort: thinking on; false: off)
reaches the chat template (``/api/generate`` too). Ollama has no tool choice: ``auto``.

Answer: ``message.tool_calls`` (``{"function": {"index", "name", "arguments"}}``, arguments an
object), ``message.thinking`` when ``think`` asked for it (otherwise reasoning is dropped);
a stream sends each as its own line.
"""

from __future__ import annotations

import json
from typing import Any

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.think_budgets import effort_budget
from exo_p2p.api.families.openai.chat_tools import openai_tools
from exo_p2p.api.families.tool_calls import bad, function_calls
from exo_p2p.types import ChatMessage, ToolCall


def ollama_thinking(think: Any) -> bool | None:
    """``think`` → the template's thinking: a bool as is, an effort (``high``, ``medium``,
    ``low``) on, absent None; 400 otherwise."""
    if think is None or isinstance(think, bool):
        return think
    if think in ("high", "medium", "low"):
        return True
    raise ApiError(400, "think must be true, false, 'high', 'medium' or 'low'", param="think")


def ollama_tool_fields(tools: list[Any] | None, think: Any) -> dict[str, Any]:
    """The ``GenerationParams`` fields of a chat's ``tools`` and ``think``."""
    return {"tools": openai_tools(tools), **think_fields(think)}


def think_fields(think: Any) -> dict[str, Any]:
    """The ``GenerationParams`` fields of ``think``: ``thinking``, and a level's
    ``thinking_budget`` (``think_budgets.EFFORT_BUDGETS``: low, medium, high)."""
    return {"thinking": ollama_thinking(think), "thinking_budget": effort_budget(think)}


def ollama_message(i: int, role: str, content: str, tool_calls: list[Any] | None, tool_name: str | None) -> ChatMessage:
    """A ``tool`` message or an assistant message with ``tool_calls`` (400 naming a bad call)."""
    if role == "tool":
        return ChatMessage("tool", content, name=tool_name)
    if role != "assistant":
        raise bad(f"messages[{i}].tool_calls", "only assistant messages carry tool calls")
    calls = function_calls(tool_calls, f"messages[{i}]", fields_at=".function", default_id=lambda j: f"call_{i}_{j}")
    return ChatMessage("assistant", content, tool_calls=calls)


def calls_doc(calls: tuple[ToolCall, ...] | list[ToolCall], first: int = 0) -> list[dict[str, Any]]:
    """Calls as Ollama writes them."""
    return [{"function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)}} for i, c in enumerate(calls, start=first)]


def with_parts(doc: dict[str, Any], *, thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``doc`` (a chat or generate object) with its ``thinking`` and ``tool_calls`` (a chat's in
    its ``message``), those that are set."""
    where = doc["message"] if "message" in doc else doc
    if thinking:
        where["thinking"] = thinking
    if calls:
        where["tool_calls"] = calls
    return doc
