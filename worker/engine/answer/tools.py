"""Tools and reasoning in the prompt, and the parser and grammar of a request's answer.

Native format: a model whose tokenizer has tool-call markers (mlx-lm's ``TokenizerWrapper``:
``has_tool_calling``, ``tool_call_start``/``end``, ``tool_parser``) gets the request's tools,
earlier calls and results through its own chat template (``apply_chat_template(tools=…)``),
and its calls are parsed with its family's parser.

Generic format, for a model without one (the embedded SmolLM2 among them): the tools are
described in the system prompt (``GENERIC_INTRO``), each call is written
``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, earlier calls are rendered so in the
assistant's turn and results as a user turn ``<tool_response>…</tool_response>``; the answer
is grammar-constrained (``tool_grammar``) to a text reply or calls whose arguments match
each tool's ``parameters`` schema. ``tool_choice``: ``none`` renders no tools and parses no
calls; ``required`` forces one or more calls; ``function:NAME`` forces calls of that tool;
``auto`` lets the model choose (constrained to text or calls in the generic format);
``one_call`` (``parallel_tool_calls: false``) holds the calls to one, after which the answer
ends (a model that never chose to stop would otherwise repeat calls until its cap). A
native model whose calls use the same JSON-in-markers syntax (``<tool_call>`` with mlx-lm's
``json_tools`` parser, as Qwen and Hermes) is forced the same way for ``required`` and
named choices.

Every rendering is a pure function of the messages, so an agent's turn N+1 renders turn N's
bytes unchanged and reuses its KV from the prompt cache.
"""

from __future__ import annotations

import json
from typing import Any

from exo_p2p.content.output_format import ANY_OBJECT, JSON_OPTIONS, FormatError, close_objects, schema_text
from exo_p2p.content.schema_refs import rebase_refs
from exo_p2p.types.tasks import ChatMessage, GenerationParams, OutputFormat
from worker.engine.answer.parser import Markers, OutputParser

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
"""The generic format's call markers (also Qwen's and Hermes')."""

GENERIC_INTRO = (
    "You can call the following tools. Each line is one tool as JSON:\n<tools>\n{tools}\n</tools>\n"
    "To call tools, answer only with one or more calls, each written as "
    '<tool_call>{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}</tool_call>. '
    "Otherwise answer in plain text."
)
"""The system prompt text that describes the tools in the generic format."""


def tool_list(params: GenerationParams) -> list[dict[str, Any]]:
    """The request's tools (decoded ``params.tools``), none when ``tool_choice`` is ``none``."""
    if not params.tools or params.tool_choice == "none":
        return []
    return list(json.loads(params.tools))


def native(tokenizer: Any) -> bool:
    """Whether the model has its own tool-call format."""
    return bool(getattr(tokenizer, "has_tool_calling", False)) and getattr(tokenizer, "tool_parser", None) is not None


def template_messages(messages: tuple[ChatMessage, ...], *, generic: bool) -> list[dict[str, Any]]:
    """``messages`` as chat-template dicts (OpenAI's shape): an assistant turn's calls as
    ``tool_calls`` (arguments decoded) and its ``reasoning_content``; a ``tool`` turn with
    ``tool_call_id``/``name``. ``generic``: calls become text in the generic format and results
    user turns, for templates that know no tools."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if generic and m.role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
            continue
        item: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls and generic:
            item["content"] = m.content + "".join(_generic_call(c.name, c.arguments) for c in m.tool_calls)
        elif m.tool_calls:
            item["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                  for c in m.tool_calls]
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            item["name"] = m.name
        if m.reasoning:
            item["reasoning_content"] = m.reasoning
        out.append(item)
    return out


def _generic_call(name: str, arguments: str) -> str:
    return f'{CALL_START}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{CALL_END}'


def with_generic_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the generic format's tool description first in the system prompt."""
    lines = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False, sort_keys=True) for t in tools)
    intro = GENERIC_INTRO.format(tools=lines)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{intro}"}, *messages[1:]]
    return [{"role": "system", "content": intro}, *messages]


def render_kwargs(params: GenerationParams, tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The template's messages and keyword arguments for ``params``: ``tools`` (native
    format) and ``enable_thinking`` (when ``params.thinking`` is set)."""
    tools = tool_list(params)
    generic = bool(tools) and not native(tokenizer)
    messages = template_messages(params.messages, generic=generic or not native(tokenizer))
    kwargs: dict[str, Any] = {}
    if generic:
        messages = with_generic_tools(messages, tools)
    elif tools:
        kwargs["tools"] = tools
    if params.thinking is not None:
        kwargs["enable_thinking"] = params.thinking
    return messages, kwargs


def _call_schema(tool: dict[str, Any], base: str) -> dict[str, Any]:
    """The schema of one call of ``tool``, placed at ``base`` in the grammar's schema (its
    parameters' local ``$ref``s moved there)."""
    fn = tool.get("function", tool)
    params = rebase_refs(close_objects(fn.get("parameters") or {"type": "object"}), f"{base}/properties/arguments")
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_grammar(params: GenerationParams, tokenizer: Any) -> OutputFormat | None:
    """The grammar the answer is held to (see the module docstring), or None (not
    constrained: no tools, ``none``, or a native format other than JSON in markers)."""
    tools = tool_list(params)
    if not tools:
        return None
    forced = params.tool_choice != "auto"
    if native(tokenizer) and not (forced and _json_in_markers(tokenizer)):
        return None
    if params.tool_choice.startswith("function:"):
        name = params.tool_choice.removeprefix("function:")
        tools = [t for t in tools if t.get("function", t).get("name") == name]
    schema = {"anyOf": [_call_schema(t, f"#/anyOf/{i}") for i, t in enumerate(tools)], "x-guidance": JSON_OPTIONS}
    call = f"call: {_marker(tokenizer, CALL_START)} %json {json.dumps(schema)} {_marker(tokenizer, CALL_END)}"
    start = "start: calls" if forced else "start: answer | calls"
    calls = "calls: call" if params.one_call else "calls: call+"
    return OutputFormat("lark", "\n".join([start, calls, call, _answer_rule(params.output_format)]))


def _answer_rule(fmt: OutputFormat | None) -> str:
    """The Lark rule of an answer that is not a call: any text not starting with ``<``, or
    the request's output format (a JSON schema or object, a regex). Raises ``FormatError``
    for a Lark grammar, which cannot be combined with tools."""
    if fmt is None:
        return r"answer: /[^<](.|\n)*/"
    if fmt.kind in ("json_object", "json_schema"):
        schema = json.loads(schema_text(fmt.source) if fmt.kind == "json_schema" else ANY_OBJECT)
        return f"answer: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"
    if fmt.kind == "regex":
        return "answer: /" + fmt.source.replace("/", "\\/") + "/"
    raise FormatError("a Lark grammar cannot be combined with tools (tool_choice auto): send one or the other")


def _marker(tokenizer: Any, text: str) -> str:
    """``text`` in a Lark grammar: the token itself (``<[id]>``) when the model has it as one
    added token (llguidance matches added tokens by id, not by their text), else the string."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return f"<[{ids[0]}]>" if len(ids) == 1 else json.dumps(text)


def _json_in_markers(tokenizer: Any) -> bool:
    parser = getattr(tokenizer, "tool_parser", None)
    return getattr(tokenizer, "tool_call_start", None) == CALL_START and getattr(parser, "__module__", "").endswith("json_tools")


def output_parser(params: GenerationParams, tokenizer: Any, *, thinking: bool) -> OutputParser | None:
    """The parser of a request's answer, or None when there is nothing to parse (no think
    markers, and no tools or ``tool_choice`` none). ``thinking``: the prompt ends inside a
    think block."""
    think = (tokenizer.think_start, tokenizer.think_end) if getattr(tokenizer, "has_thinking", False) else (None, None)
    tools = tool_list(params)
    if not tools and think[0] is None:
        return None
    markers, parse = Markers(*think), None
    if tools and native(tokenizer):
        markers = Markers(*think, tokenizer.tool_call_start, tokenizer.tool_call_end)
        fn = tokenizer.tool_parser
        parse = (lambda text: fn(text, tools))  # noqa: E731
    elif tools:
        markers, parse = Markers(*think, CALL_START, CALL_END), json.loads
    return OutputParser(markers, thinking=thinking, parse=parse)
