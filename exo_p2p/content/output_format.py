"""Structured output: an ``OutputFormat`` as an llguidance grammar, and the checks every API
family and the runner share (docs/api.md#structured-output).

A format becomes one llguidance grammar (``grammar_of``): a JSON schema through llguidance's
JSON compiler (``json_object`` is the schema ``{"type": "object"}``), a regex, or a Lark
grammar. JSON is compiled without free whitespace — items separated by ``", "``, keys by
``": "`` — so a model cannot spend its tokens on blank lines, and unknown schema keywords are
errors, not ignored (``lenient`` off): a schema llguidance cannot enforce is refused, never
silently loosened.

Bounds (documented in docs/api.md#structured-output): a format's source is at most
``MAX_FORMAT_BYTES``; its grammar is built under ``LIMITS`` (llguidance's parser limits: the
lexer fuel bounds the regex work of compiling — about 20 ms at its speed — and each token's
mask work; the grammar size bounds the rules), so a schema that would take long to compile
fails with llguidance's message instead. ``format_problem`` checks a format without a
tokenizer (the API node's 400); the runner builds the matcher with the model's tokenizer
(``worker/engine/answer/constraint.py``) under the same limits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from exo_p2p.content.schema_refs import ref_cycle
from exo_p2p.types.tasks import OutputFormat

T = TypeVar("T")

MAX_FORMAT_BYTES = 64 * 1024
"""Largest format source (schema JSON, regex or grammar), UTF-8 bytes."""

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
                                "lenient": False}
"""llguidance's JSON compiler options (see the module docstring)."""

ANY_OBJECT = '{"type": "object"}'
"""The schema of ``json_object``: any JSON object."""


def _limits() -> Any:
    import llguidance

    return llguidance.LLParserLimits(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
                                     max_lexer_states=250_000, max_grammar_size=200_000, verbose_errors=False)


LIMITS_TEXT = ("initial lexer fuel 1,000,000 (about 20 ms of regex work), step lexer fuel 200,000, "
               "50,000 parser items a step, 250,000 lexer states, 200,000 grammar symbols")
"""``_limits()`` in words, for error messages and the docs."""


class FormatError(ValueError):
    """A format that cannot be enforced: its message says why (llguidance's own words)."""


def schema_text(schema: Any) -> str:
    """A JSON schema (a dict, or its JSON text) as canonical JSON text. Raises ``FormatError``
    when it is not a JSON object or is larger than ``MAX_FORMAT_BYTES``."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise FormatError(f"the schema is not valid JSON: {e}") from None
        except RecursionError:
            raise FormatError("the schema is nested too deeply") from None
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise FormatError(f"a JSON schema must be a JSON object, not {type(schema).__name__}")
    try:
        text = json.dumps(close_objects(schema), separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise FormatError("the schema is nested too deeply") from None
    _check_size(text)
    return text


_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any, *, close: bool = True) -> Any:
    """``schema`` with every object schema that lists ``properties`` and says nothing of
    others (no ``additionalProperties``, ``patternProperties``, ``unevaluatedProperties``)
    closed: ``additionalProperties: false``. A small model held to an open object invents
    properties until its token limit (what Pydantic's ``model_json_schema()`` gives is open);
    a client that wants others says ``additionalProperties: true``. The parts of an
    ``allOf`` are left open (closing each would refuse the others' properties)."""
    if isinstance(schema, list):
        return [close_objects(item, close=close) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: close_objects(sub) for name, sub in value.items()}
        else:
            out[key] = close_objects(value, close=key != "allOf")
    if close and "properties" in out and not any(key in out for key in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out


def _check_size(text: str) -> None:
    size = len(text.encode())
    if size > MAX_FORMAT_BYTES:
        raise FormatError(f"the format is {size} bytes; at most {MAX_FORMAT_BYTES} are accepted")


def grammar_of(fmt: OutputFormat) -> str:
    """The llguidance grammar (its JSON text) of ``fmt``. Raises ``FormatError`` for a source
    over ``MAX_FORMAT_BYTES`` or a schema that is not a JSON object; a grammar llguidance
    cannot build is found by ``format_problem`` or the matcher."""
    from llguidance import LLMatcher

    _check_size(fmt.source)
    if fmt.kind == "json_object":
        return LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if fmt.kind == "json_schema":
        return LLMatcher.grammar_from_json_schema(schema_text(fmt.source), defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if fmt.kind == "regex":
        return LLMatcher.grammar_from_regex(fmt.source)
    if fmt.kind == "lark":
        return LLMatcher.grammar_from_lark(fmt.source)
    raise FormatError(f"unknown format kind {fmt.kind!r}")


def format_problem(fmt: OutputFormat) -> str | None:
    """Why ``fmt`` cannot be enforced (llguidance's message, or a bound's), or None when it
    can; no tokenizer needed (the API node's check before a request is sent)."""
    from llguidance import LLMatcher

    try:
        grammar = guarded(grammar_of, fmt)
        if fmt.kind == "json_schema" and (ref := ref_cycle(json.loads(fmt.source))) is not None:
            return f"Unsatisfiable schema: the $ref {ref[:200]!r} leads back to itself without a schema"
        is_error, messages = guarded(LLMatcher.validate_grammar_with_warnings, grammar, None, limits=_limits())
    except (FormatError, ValueError) as e:
        return str(e)
    if is_error:
        return _clean(messages[0] if messages else "the grammar does not compile")
    return None


def guarded(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` of llguidance, its Rust panics turned into ``FormatError``.

    llguidance panics on some inputs it should refuse (a ``$ref`` that is an object whose
    JSON text, cut at 100 bytes for the message, splits a multi-byte character), and pyo3
    raises a panic as ``PanicException``, a ``BaseException``: past every ``except
    Exception``, it would end the request's task or the runner. Raises ``FormatError`` with
    the panic's message (one line, bounded); any other exception passes unchanged."""
    try:
        return call(*args, **kwargs)
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise FormatError(f"the format could not be compiled ({_clean(str(e))[:300]})") from None


def _clean(message: str) -> str:
    """llguidance's message, one line, bounded (it can quote a whole grammar)."""
    line = " ".join(message.split())
    return line if len(line) <= 600 else line[:597] + "..."


def matcher_limits() -> Any:
    """``LLParserLimits`` for a runner's matcher (the same as ``format_problem``'s)."""
    return _limits()
