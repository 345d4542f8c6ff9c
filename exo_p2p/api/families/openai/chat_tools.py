"""Tools and reasoning in OpenAI chat completions (docs/api.md#tools-and-reasoning).

Request: ``tools`` (function tools), ``tool_choice`` (``auto``, ``none``, ``required`` or
``{"type": "function", "function": {"name"}}``), ``parallel_tool_calls`` (false: only the
first call of an answer is returned), assistant messages with ``tool_calls`` (and their
``reasoning_content`` or ``reasoning``), ``role: tool`` messages with ``tool_call_id``;
``reasoning_effort`` (one of ``REASONING_EFFORTS``, else 400: ``none`` turns thinking off, any
other effort on), ``enable_thinking`` or
``chat_template_kwargs.enable_thinking`` reach the chat template as ``enable_thinking``.

Answer: ``message.tool_calls`` (``content`` null when there is no text) and ``finish_reason:
tool_calls``; the reasoning in ``message.reasoning_content`` and ``message.reasoning``; usage
counts the reasoning tokens in ``completion_tokens_details.reasoning_tokens``. A stream sends
reasoning as ``delta.reasoning_content`` (and ``delta.reasoning``) and each call as two
``delta.tool_calls`` events: ``index``, ``id``, ``type`` and ``name`` with empty arguments,
then the arguments.
"""

from __future__ import annotations

from typing import Any

from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.common import sse
from exo_p2p.api.families.think_budgets import effort_budget
from exo_p2p.api.families.tool_calls import bad, function_calls, function_choice, function_tool, tools_text
from exo_p2p.api.generation.turn import Turn
from exo_p2p.types import ChatMessage, FinishChunk, ToolCall

_TOOL_FIELDS = ("name", "description", "parameters")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
"""The reasoning efforts OpenAI's chat completions and Responses accept."""


def checked_effort(effort: Any, param: str = "reasoning_effort") -> str | None:
    """``effort`` when it is one of ``REASONING_EFFORTS`` (or None); else a 400 naming
    ``param`` and the allowed values."""
    if effort is None or effort in REASONING_EFFORTS:
        return effort
    allowed = ", ".join(repr(e) for e in REASONING_EFFORTS)
    raise ApiError(400, f"{param}: {effort!r} is not a reasoning effort; one of {allowed}", param=param,
                   code="invalid_value")


def openai_tools(tools: list[Any] | None, param: str = "tools") -> str | None:
    """``GenerationParams.tools`` of OpenAI chat ``tools`` (``exo_p2p.api.families.tool_calls``); 400 naming
    ``tools[i]…`` for a tool that is not a function tool or a bad field."""
    out = []
    for i, tool in enumerate(tools or ()):
        where = f"{param}[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad(f"{where}.type", "only function tools are supported")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad(f"{where}.function", "a function tool needs its function object")
        out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{where}.function", _TOOL_FIELDS))
    return tools_text(out, param, [f"{param}[{i}].function.parameters" for i in range(len(out))])


def openai_choice(choice: Any, tools: str | None, param: str = "tool_choice") -> str:
    """Our ``tool_choice`` of OpenAI's (None: ``auto``); 400 for another shape, or a choice the
    request's tools cannot meet."""
    return function_choice(choice, tools, _choice_name, '{"type": "function", "function": {"name": ...}}', param)


def _choice_name(choice: dict[str, Any]) -> Any:
    """The tool a chat ``tool_choice`` object names: ``function.name`` (or a flat ``name``)."""
    fn = choice.get("function")
    return fn.get("name") if isinstance(fn, dict) else choice.get("name")


def thinking_of(effort: str | None, enable: bool | None, template_kwargs: dict[str, Any] | None) -> bool | None:
    """Whether to think: ``enable_thinking`` (top level, then ``chat_template_kwargs``), else
    ``reasoning_effort`` (``none`` off, others on); None leaves it to the template."""
    if enable is not None:
        return enable
    kw = (template_kwargs or {}).get("enable_thinking")
    if kw is not None:
        if not isinstance(kw, bool):
            raise ApiError(400, "chat_template_kwargs.enable_thinking must be a boolean", param="chat_template_kwargs.enable_thinking")
        return kw
    if checked_effort(effort) is None:
        return None
    return effort != "none"


def tool_result(where: str, content: str, tool_call_id: str | None, name: str | None) -> ChatMessage:
    """A ``role: tool`` message: one call's result (400 without ``tool_call_id``)."""
    if not tool_call_id:
        raise bad(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
    return ChatMessage("tool", content, tool_call_id=tool_call_id, name=name)


def assistant_calls(where: str, tool_calls: list[Any]) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` as ``ToolCall``s (400 naming a bad one)."""
    return function_calls(tool_calls, where)


def call_item(call: ToolCall, index: int | None = None, *, arguments: bool = True) -> dict[str, Any]:
    """One call as OpenAI writes it (with ``index`` in a stream delta)."""
    item: dict[str, Any] = {} if index is None else {"index": index}
    item.update(id=call.id, type="function", function={"name": call.name, "arguments": call.arguments if arguments else ""})
    return item


def call_events(head: dict[str, Any], calls: tuple[ToolCall, ...], first: int, limit: int | None) -> bytes:
    """The stream events of ``calls`` (``head``: the chunk's fields but ``choices``); calls
    at index ``limit`` or beyond are not sent."""
    out = b""
    for i, call in enumerate(calls, start=first):
        if limit is not None and i >= limit:
            break
        opening = call_item(call, i, arguments=False)
        out += sse({**head, "choices": [{"index": 0, "delta": {"tool_calls": [opening]}, "finish_reason": None}]})
        args = {"index": i, "function": {"arguments": call.arguments}}
        out += sse({**head, "choices": [{"index": 0, "delta": {"tool_calls": [args]}, "finish_reason": None}]})
    return out


def reasoning_event(head: dict[str, Any], delta: str) -> bytes:
    """The stream event of reasoning text."""
    return sse({**head, "choices": [{"index": 0, "delta": {"reasoning_content": delta, "reasoning": delta}, "finish_reason": None}]})


def answer_message(turn: Turn, limit: int | None) -> dict[str, Any]:
    """The ``message`` of a whole answer (see the module docstring)."""
    calls = turn.calls[:limit] if limit is not None else turn.calls
    message: dict[str, Any] = {"role": "assistant", "content": turn.text if turn.text or not calls else None, "refusal": None}
    if calls:
        message["tool_calls"] = [call_item(c) for c in calls]
    if turn.reasoning:
        message["reasoning_content"] = message["reasoning"] = turn.reasoning
    return message


def usage_of(chunk: FinishChunk, reasoning_tokens: int) -> dict[str, Any]:
    """OpenAI's usage of a finished answer, reasoning tokens counted apart (when there are any)."""
    usage: dict[str, Any] = {"prompt_tokens": chunk.prompt_tokens, "completion_tokens": chunk.completion_tokens,
                             "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
                             "prompt_tokens_details": {"cached_tokens": min(chunk.cached_tokens, chunk.prompt_tokens)}}
    if reasoning_tokens:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def chat_tool_fields(request: Any) -> dict[str, Any]:
    """The ``GenerationParams`` fields of a chat request's tools and thinking (``tools``,
    ``tool_choice``, ``thinking``, ``reasoning_effort``'s ``thinking_budget``:
    ``think_budgets.EFFORT_BUDGETS``, ``one_call``); 400 as ``openai_tools`` and ``openai_choice``."""
    tools = openai_tools(request.tools)
    fields: dict[str, Any] = {"tools": tools, "tool_choice": openai_choice(request.tool_choice, tools)}
    fields["thinking"] = thinking_of(request.reasoning_effort, request.enable_thinking, request.chat_template_kwargs)
    fields["thinking_budget"] = effort_budget(request.reasoning_effort)
    fields["one_call"] = request.parallel_tool_calls is False
    return fields
