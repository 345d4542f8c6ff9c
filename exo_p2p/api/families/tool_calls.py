"""Function tools and tool calls of a request, the one module every API family shares for
them (docs/api.md#tools-and-reasoning): the checks, and the readers of the shapes several
families have in common — flat tool objects (``flat_tools``: Responses, Anthropic), an
OpenAI-style ``tool_choice`` (``function_choice``: chat completions, Responses) and an earlier
turn's OpenAI-shaped ``tool_calls`` (``function_calls``: chat completions, Ollama). A family's
own module (``openai/chat_tools``, ``anthropic/tools``…) keeps only what is its own.

Each family turns its own tool shape into OpenAI's — ``{"type": "function", "function":
{"name", "description", "parameters"}}`` — and calls ``tools_text``, which checks the list and
returns the JSON text ``GenerationParams.tools`` carries. A tool call's arguments are
grammar-constrained to its ``parameters`` schema in the runner (``worker/engine/answer/tools.py``),
so a schema llguidance cannot compile is refused here, with a 400 naming the tool's field,
before anything is sent.

Bounds: at most ``MAX_TOOLS`` tools, their JSON text at most ``MAX_TOOLS_BYTES`` (the tools
travel in the command and the replicated log, ``exo_p2p.api.bounds``); a name is 1 to 64
characters of letters, digits, ``_``, ``-``, ``.`` and ``:``, unique in the list; a tool's
schema and a call's arguments nest at most ``MAX_JSON_DEPTH`` arrays and objects deep (deeper
JSON would exhaust Python's recursion in the encoder, the template or the grammar). Pure;
raises ``ApiError(400, param=…)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from exo_p2p.api.errors import ApiError
from exo_p2p.content.json_depth import json_depth
from exo_p2p.content.output_format import MAX_FORMAT_BYTES, FormatError, format_problem, schema_text
from exo_p2p.content.schema_refs import rebase_refs
from exo_p2p.types import OutputFormat, ToolCall

MAX_TOOLS = 128
"""Tools per request at most (OpenAI's own limit)."""
MAX_TOOLS_BYTES = MAX_FORMAT_BYTES
"""UTF-8 bytes of a request's tools as JSON at most (64 KiB)."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What a tool's name may be."""
MAX_JSON_DEPTH = 64
"""Arrays and objects nested in a tool's schema or a call's arguments at most."""


def too_deep(param: str) -> ApiError:
    """The 400 of JSON at ``param`` nested deeper than ``MAX_JSON_DEPTH``."""
    return bad(param, f"nested too deeply; at most {MAX_JSON_DEPTH} levels of arrays and objects are accepted")


def check_depth(value: Any, param: str) -> None:
    """``too_deep(param)`` raised when ``value`` nests deeper than ``MAX_JSON_DEPTH``."""
    if json_depth(value) > MAX_JSON_DEPTH:
        raise too_deep(param)


def bad(param: str, message: str) -> ApiError:
    """The 400 of a bad tool field: ``param`` named in the body and in the message."""
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_tool")


def function_tool(name: Any, description: Any, parameters: Any, where: str, names: tuple[str, str, str]) -> dict[str, Any]:
    """One tool in OpenAI's shape from its parts; ``names`` are the family's names of the three
    fields (for the 400's ``param``: ``where.<name>``). Raises ``ApiError(400)`` for a name that
    is not ``NAME_PATTERN``, a description that is not a string, a ``parameters`` that is not a
    JSON object. Its schema is compiled by ``tools_text``, once the list is within its bounds."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise bad(f"{where}.{names[0]}", f"a tool needs a name of 1 to 64 letters, digits, '_', '-', '.' or ':', got {str(name)[:80]!r}")
    if description is not None and not isinstance(description, str):
        raise bad(f"{where}.{names[1]}", "must be a string")
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise bad(f"{where}.{names[2]}", "must be a JSON schema object")
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON schema of one call of tool ``name``: ``{"name": name, "arguments": <parameters>}``
    (the shape the runner's grammar holds a call to; local ``$ref``s moved under it)."""
    arguments = rebase_refs(parameters, "#/properties/arguments") if parameters else {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}


def schema_problem(name: str, parameters: dict[str, Any]) -> str | None:
    """Why llguidance cannot enforce a call of ``name`` with ``parameters`` (None: it can)."""
    try:
        text = schema_text(call_schema(name, parameters))
    except FormatError as e:
        return str(e)
    return format_problem(OutputFormat("json_schema", text))


def tools_text(tools: list[dict[str, Any]], param: str = "tools", schema_params: list[str] | None = None) -> str | None:
    """The JSON text of ``tools`` (OpenAI's shape, from ``function_tool``), None for none.
    Raises ``ApiError(400)`` beyond ``MAX_TOOLS`` tools or ``MAX_TOOLS_BYTES``, for a name
    given twice, or for a ``parameters`` schema llguidance cannot compile (naming
    ``schema_params[i]``, the family's param of tool i's schema). The bounds come first, so
    a request's schemas cost at most ``MAX_TOOLS_BYTES`` of compiling."""
    if not tools:
        return None
    if len(tools) > MAX_TOOLS:
        raise bad(param, f"{len(tools)} tools; at most {MAX_TOOLS} are accepted")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        check_depth(tool, schema_params[i] if schema_params else f"{param}[{i}]")
        name = tool["function"]["name"]
        if name in seen:
            raise bad(f"{param}[{i}]", f"the tool name {name!r} is given twice")
        seen.add(name)
    text = json.dumps(tools, ensure_ascii=False)
    if len(text.encode()) > MAX_TOOLS_BYTES:
        raise bad(param, f"the tools are {len(text.encode())} bytes as JSON; at most {MAX_TOOLS_BYTES} are accepted")
    for i, tool in enumerate(tools):
        fn = tool["function"]
        problem = schema_problem(fn["name"], fn["parameters"]) if "parameters" in fn else None
        if problem is not None:
            where = schema_params[i] if schema_params else f"{param}[{i}].parameters"
            raise bad(where, f"the schema cannot be enforced: {problem}")
    return text


def tool_names(text: str | None) -> list[str]:
    """The names of the tools in ``tools_text``'s output."""
    return [t["function"]["name"] for t in json.loads(text)] if text else []


def checked_choice(choice: str, tools: str | None, param: str = "tool_choice") -> str:
    """``choice`` (``auto``, ``none``, ``required`` or ``function:NAME``) checked against the
    request's tools: ``required`` or a name need tools, a name one of them (400 otherwise)."""
    if choice in ("auto", "none"):
        return choice
    if not tools:
        raise bad(param, f"tool choice {choice.removeprefix('function:')!r} needs tools, and the request has none")
    if choice.startswith("function:") and choice.removeprefix("function:") not in tool_names(tools):
        raise bad(param, f"names the tool {choice.removeprefix('function:')!r}, which is not among the request's tools")
    return choice


def arguments_text(arguments: Any, param: str) -> str:
    """A call's arguments as JSON text of an object: a JSON string is kept as sent (so an
    agent's earlier turn renders the same bytes again), a dict is encoded; 400 otherwise, and
    for arguments nested deeper than ``MAX_JSON_DEPTH``."""
    if isinstance(arguments, dict):
        check_depth(arguments, param)
        return json.dumps(arguments, ensure_ascii=False)
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad(param, "must be the JSON text of an object") from None
        except RecursionError:  # deeper than Python's recursion: far beyond the bound
            raise too_deep(param) from None
        if isinstance(value, dict):
            check_depth(value, param)
            return arguments if arguments.strip() else "{}"
    raise bad(param, "must be a JSON object (or its JSON text)")


def earlier_call(call_id: Any, name: Any, arguments: Any, where: str, *, id_field: str = "id",
                 arguments_field: str = "arguments") -> ToolCall:
    """An earlier turn's tool call (its id, the tool's name, its arguments as sent); 400 naming
    ``where`` and the family's own field (``id_field``: Responses says ``call_id``;
    ``arguments_field``: Anthropic says ``input``) for a missing id or name or arguments
    that are not a JSON object."""
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"{where}.{id_field}", "a tool call needs an id")
    if not isinstance(name, str) or not name:
        raise bad(f"{where}.name", "a tool call needs the tool's name")
    return ToolCall(call_id, name, arguments_text(arguments, f"{where}.{arguments_field}"))


def flat_tools(tools: list[Any] | None, kind: str, fields: tuple[str, str, str], where: str, *,
               default_kind: str | None = None) -> str | None:
    """``GenerationParams.tools`` of a family whose tools are flat objects (Responses:
    ``{"type": "function", "name", "description", "parameters"}``; Anthropic: ``type`` ``custom``
    by default, ``input_schema``): those of type ``kind`` (``default_kind`` when absent) are
    offered, others (the vendor's server or built-in tools) are skipped. ``fields`` name the
    three fields, ``where`` the i-th tool (a format string: ``tools[{}]``, ``tools.{}``).
    Raises ``ApiError(400)`` for a tool that is not an object and as ``function_tool`` and
    ``tools_text``."""
    out, schemas = [], []
    for i, tool in enumerate(tools or ()):
        at = where.format(i)
        if not isinstance(tool, dict):
            raise bad(at, "a tool must be an object")
        if tool.get("type", default_kind) != kind:
            continue  # a server or built-in tool (web search, code execution…): not offered to the model
        out.append(function_tool(tool.get(fields[0]), tool.get(fields[1]), tool.get(fields[2]), at, fields))
        schemas.append(f"{at}.{fields[2]}")
    return tools_text(out, "tools", schemas)


def function_choice(choice: Any, tools: str | None, name_of: Callable[[dict[str, Any]], Any], shape: str,
                    param: str = "tool_choice") -> str:
    """Our ``tool_choice`` of an OpenAI-style one (chat completions, Responses): None is
    ``auto``; ``auto``, ``none``, ``required`` as they are; an object of type ``function`` names
    its tool by ``name_of(choice)``. Raises ``ApiError(400)`` for another shape (the message
    shows the family's ``shape`` of the object) or a choice the request's tools cannot meet."""
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in ("auto", "none", "required"):
        return checked_choice(choice, tools, param)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = name_of(choice)
        if isinstance(name, str):
            return checked_choice(f"function:{name}", tools, param)
    raise bad(param, f"must be 'auto', 'none', 'required' or {shape}")


def function_calls(tool_calls: list[Any] | None, where: str, *, fields_at: str = "",
                   default_id: Callable[[int], str] | None = None) -> tuple[ToolCall, ...]:
    """An earlier assistant turn's OpenAI-shaped ``tool_calls`` (``{"id", "function": {"name",
    "arguments"}}``; chat completions, Ollama) as ``ToolCall``s. Call j is ``where.tool_calls[j]``,
    its name and arguments are named under it plus ``fields_at`` (Ollama: ``.function``); a
    call without an id gets ``default_id(j)`` when given. Raises ``ApiError(400)`` for a call
    without a function object and as ``earlier_call``."""
    out = []
    for j, call in enumerate(tool_calls or ()):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise bad(at, "a tool call needs a function object")
        call_id = call.get("id") or (default_id(j) if default_id else call.get("id"))
        out.append(earlier_call(call_id, fn.get("name"), fn.get("arguments", "{}"), at + fields_at))
    return tuple(out)
