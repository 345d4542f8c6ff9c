"""Structured output in every API family: each family's own field, and the extension fields
``regex`` and ``grammar``, as one ``OutputFormat`` (docs/api.md#structured-output).

Each reader takes the field as the client sent it (any JSON value) and returns an ``Asked``
(the field, where its source is, the unchecked format) or None for free text:

- ``openai_response_format``: OpenAI chat and completions ``response_format``: ``{"type":
  "text"}``, ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"name",
  "schema", "strict", "description"}}``;
- ``responses_text_format``: Responses ``text.format``, the same types with ``name``,
  ``schema``, ``strict`` beside ``type``;
- ``anthropic_output_format``: Anthropic ``output_config.format`` (and the beta's top-level
  ``output_format``): ``{"type": "json_schema", "schema"}``;
- ``ollama_format``: Ollama ``format``: ``"json"`` or a schema object (``""``: free text);
- ``extensions``: ``regex`` (the whole output matches it) and ``grammar`` (a Lark grammar,
  llguidance's dialect).

``output_format(*asked)`` keeps the one format a request asks for and checks that it can be
enforced (``exo_p2p.content.output_format.format_problem``: llguidance's compiler under its bounds,
no tokenizer). ``strict`` is accepted either way: a format is always enforced.

Pure; every problem is ``ApiError(400, param=…)`` naming the field (``…schema`` for a schema
llguidance refuses) with llguidance's message, code ``invalid_format``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exo_p2p.api.errors import ApiError
from exo_p2p.content.output_format import FormatError, format_problem, schema_text
from exo_p2p.types import OutputFormat

MAX_FORMAT_NAME_CHARS = 64
"""Characters of a format's ``name`` at most (OpenAI's own bound)."""
INVALID = "invalid_format"
"""``code`` of every format error."""


@dataclass(frozen=True)
class Asked:
    """A format a request asks for: ``field`` is the request's field (``response_format``),
    ``where`` the param that holds its source (``response_format.json_schema.schema``)."""

    field: str
    where: str
    fmt: OutputFormat


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=INVALID)


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(param, f"must be an object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _schema(value: Any, field: str, where: str, name: Any = None) -> Asked:
    """A ``json_schema`` format from a schema object (400 naming ``where`` when there is none)."""
    if value is None:
        raise _bad(where, "a JSON schema is required")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_FORMAT_NAME_CHARS):
        raise _bad(where.rsplit(".", 1)[0] + ".name", f"must be a string of at most {MAX_FORMAT_NAME_CHARS} characters")
    try:
        source = schema_text(value)
    except FormatError as e:
        raise _bad(where, str(e)) from None
    return Asked(field, where, OutputFormat("json_schema", source, name))


def _typed(spec: dict[str, Any], param: str, types: tuple[str, ...]) -> str:
    kind = spec.get("type")
    if kind not in types:
        listed = ", ".join(f"'{t}'" for t in types)
        raise _bad(f"{param}.type", f"must be one of {listed}, got {str(kind)[:64]!r}")
    return kind


def openai_response_format(value: Any, param: str = "response_format") -> Asked | None:
    """OpenAI's ``response_format`` (chat, completions): None for absent or ``text``; 400 for
    another type, a ``json_schema`` without ``json_schema.schema``, a bad ``name``."""
    return _openai_kind(value, param, nested=True)


def responses_text_format(value: Any, param: str = "text.format") -> Asked | None:
    """Responses' ``text.format`` (``name``/``schema``/``strict`` beside ``type``): None for
    absent or ``text``; 400 as ``openai_response_format``."""
    return _openai_kind(value, param, nested=False)


def _openai_kind(value: Any, param: str, *, nested: bool) -> Asked | None:
    """OpenAI's ``text`` / ``json_object`` / ``json_schema`` format object: the schema's
    fields under ``json_schema`` (``nested``: chat, completions) or beside ``type``
    (Responses)."""
    if value is None:
        return None
    spec = _object(value, param)
    kind = _typed(spec, param, ("text", "json_object", "json_schema"))
    if kind == "text":
        return None
    if kind == "json_object":
        return Asked(param, param, OutputFormat("json_object"))
    where = f"{param}.json_schema" if nested else param
    inner = _object(spec.get("json_schema"), where) if nested else spec
    return _schema(inner.get("schema"), param, f"{where}.schema", inner.get("name"))


def anthropic_output_format(output_config: Any, output_format: Any = None) -> Asked | None:
    """Anthropic's ``output_config.format`` (or the beta's top-level ``output_format``),
    ``{"type": "json_schema", "schema": {…}}``; None when neither is set; 400 for both, another
    type or no schema."""
    config = {} if output_config is None else _object(output_config, "output_config")
    given = [(p, v) for p, v in (("output_config.format", config.get("format")), ("output_format", output_format))
             if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise _bad("output_format", "send the format in output_config.format only")
    param, value = given[0]
    _typed(_object(value, param), param, ("json_schema",))
    return _schema(value.get("schema"), param, f"{param}.schema")


def ollama_format(value: Any) -> Asked | None:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON schema object; None for
    absent or ``""``; 400 for another string or value."""
    if value is None or value == "":
        return None
    if value == "json":
        return Asked("format", "format", OutputFormat("json_object"))
    if not isinstance(value, dict):
        raise _bad("format", f"must be \"json\" or a JSON schema object, got {str(value)[:64]!r}")
    return _schema(value, "format", "format")


def extensions(regex: str | None, grammar: str | None) -> tuple[Asked | None, Asked | None]:
    """The extension fields: ``regex`` (the whole output matches it) and ``grammar`` (a Lark
    grammar); an absent or empty one is None."""
    return (Asked("regex", "regex", OutputFormat("regex", regex)) if regex else None,
            Asked("grammar", "grammar", OutputFormat("lark", grammar)) if grammar else None)


def output_format(*asked: Asked | None) -> OutputFormat | None:
    """The one format of a request, checked: None when none is asked; 400 when more than one
    is (naming the second field), or when llguidance cannot build it or it is past a bound
    of ``exo_p2p.content.output_format`` (naming where its source is, with the reason)."""
    given = [a for a in asked if a is not None]
    if not given:
        return None
    if len(given) > 1:
        raise _bad(given[1].field, f"at most one output format per request; {given[0].field} is set too")
    one = given[0]
    try:
        problem = format_problem(one.fmt)
    except Exception as e:  # a native compiler's surprise is the input's problem, never a 500
        problem = f"the format could not be compiled: {str(e)[:300]}"
    if problem is not None:
        raise _bad(one.where, problem)
    return one.fmt
