"""Structured output on the API side (``exo_p2p.api.formats``): each family's official field
(and the extensions ``regex`` and ``grammar``) as the ``OutputFormat`` its task carries, through
the HTTP path on the fake backend of ``tests.test_api``; bad formats answered with a 400 in the
family's own error shape, naming the field, with llguidance's message, and nothing sent; any
JSON value in a format field is a format or a 400, never a 500; a moved request keeps its
format."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api import formats
from exo_p2p.api.errors import ApiError
from exo_p2p.content.output_format import MAX_FORMAT_BYTES, schema_text
from exo_p2p.types import OutputFormat
from tests.support.fake_master import MODEL, FakeMaster, run_api, submits
from tests.support.resume_scripts import WORDS, failing_script

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
TEXT = schema_text(SCHEMA)
LARK = 'start: "yes" | "no"'
MSGS = [{"role": "user", "content": "hi"}]
BASE = {
    "/v1/chat/completions": {"model": MODEL, "messages": MSGS},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/responses": {"model": MODEL, "input": "hi"},
    "/v1/messages": {"model": MODEL, "max_tokens": 8, "messages": MSGS},
    "/api/chat": {"model": MODEL, "messages": MSGS, "stream": False},
    "/api/generate": {"model": MODEL, "prompt": "hi", "stream": False},
}
OPENAI_SCHEMA = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
ANTHROPIC_SCHEMA = {"type": "json_schema", "schema": SCHEMA}

OFFICIAL: list[tuple[str, dict[str, Any], OutputFormat | None]] = [
    ("/v1/chat/completions", {"response_format": OPENAI_SCHEMA}, OutputFormat("json_schema", TEXT, "thing")),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, OutputFormat("json_object")),
    ("/v1/chat/completions", {"response_format": {"type": "text"}}, None),
    ("/v1/chat/completions", {"regex": "[0-9]+"}, OutputFormat("regex", "[0-9]+")),
    ("/v1/chat/completions", {"grammar": LARK, "response_format": {"type": "text"}}, OutputFormat("lark", LARK)),
    ("/v1/completions", {"response_format": OPENAI_SCHEMA}, OutputFormat("json_schema", TEXT, "thing")),
    ("/v1/completions", {"regex": "[a-z]{3}"}, OutputFormat("regex", "[a-z]{3}")),
    ("/v1/completions", {"grammar": LARK}, OutputFormat("lark", LARK)),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}}},
     OutputFormat("json_schema", TEXT, "thing")),
    ("/v1/responses", {"text": {"format": {"type": "json_object"}}}, OutputFormat("json_object")),
    ("/v1/responses", {"text": {"format": {"type": "text"}, "verbosity": "low"}}, None),
    ("/v1/messages", {"output_config": {"format": ANTHROPIC_SCHEMA}}, OutputFormat("json_schema", TEXT)),
    ("/v1/messages", {"output_config": {"effort": "low"}}, None),
    ("/v1/messages", {"output_format": ANTHROPIC_SCHEMA}, OutputFormat("json_schema", TEXT)),
    ("/v1/messages", {"regex": "[0-9]+"}, OutputFormat("regex", "[0-9]+")),
    ("/api/chat", {"format": "json"}, OutputFormat("json_object")),
    ("/api/chat", {"format": SCHEMA}, OutputFormat("json_schema", TEXT)),
    ("/api/chat", {"format": ""}, None),
    ("/api/generate", {"format": SCHEMA}, OutputFormat("json_schema", TEXT)),
    ("/api/generate", {"grammar": LARK}, OutputFormat("lark", LARK)),
]


@pytest.mark.parametrize(("path", "extra", "expected"), OFFICIAL, ids=[f"{p} {sorted(e)}" for p, e, _ in OFFICIAL])
def test_each_familys_field_becomes_the_tasks_format(path: str, extra: dict, expected: OutputFormat | None) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post(path, json={**BASE[path], **extra})
        assert r.status_code == 200, r.text
        assert submits(backend)[-1].params.output_format == expected

    run_api(body)


TOO_LONG = "a" * (MAX_FORMAT_BYTES + 1)
PANICKING = {"$ref": {"a": "x" * 93 + "\u75e4"}}
"""A schema llguidance panics on (a ``$ref`` object whose JSON text, cut at 100 bytes for its
message, splits a 3-byte character): a 400 like any other (``output_format.guarded``)."""

BAD: list[tuple[str, dict[str, Any], str, str]] = [
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": PANICKING}}},
     "response_format.json_schema.schema", "could not be compiled"),
    ("/api/chat", {"format": PANICKING}, "format", "could not be compiled"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema", "Invalid type: nope"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}}},
     "response_format.json_schema.schema", "uniqueItems"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "required"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format.json_schema", "object"),
    ("/v1/chat/completions", {"response_format": {"type": "yaml"}}, "response_format.type", "'json_schema'"),
    ("/v1/chat/completions", {"response_format": "json"}, "response_format", "object"),
    ("/v1/chat/completions", {"regex": "(a"}, "regex", "unclosed group"),
    ("/v1/chat/completions", {"regex": TOO_LONG}, "regex", f"at most {MAX_FORMAT_BYTES}"),
    ("/v1/chat/completions", {"grammar": "start: x"}, "grammar", "unknown name"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "regex": "[0-9]"}, "regex", "at most one"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/gone"}}}},
     "response_format.json_schema.schema", "does not exist"),
    ("/v1/completions", {"grammar": "start: (", "regex": None}, "grammar", "grammar"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 2}}}},
     "text.format.schema", "Unsatisfiable"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x" * 65, "schema": SCHEMA}}}, "text.format.name", "64"),
    ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"not": {}}}}}, "text.format.schema", "not"),
    ("/v1/messages", {"output_config": {"format": {"type": "json_schema", "schema": {"type": "string", "pattern": "(a"}}}},
     "output_config.format.schema", "unclosed group"),
    ("/v1/messages", {"output_config": {"format": {"type": "json", "schema": SCHEMA}}}, "output_config.format.type", "json_schema"),
    ("/v1/messages", {"output_config": {"format": ANTHROPIC_SCHEMA}, "output_format": ANTHROPIC_SCHEMA}, "output_format", "only"),
    ("/v1/messages", {"grammar": "start: x"}, "grammar", "unknown name"),
    ("/v1/messages", {"output_config": {"format": {"type": "json_schema", "schema": {"enum": ["x" * 100] * 700}}}},
     "output_config.format.schema", f"at most {MAX_FORMAT_BYTES} are accepted"),
    ("/api/chat", {"format": {"type": "nope"}}, "format", "Invalid type: nope"),
    ("/api/chat", {"format": "yaml"}, "format", "\"json\" or a JSON schema"),
    ("/api/chat", {"format": "json", "regex": "[0-9]"}, "regex", "at most one"),
    ("/api/generate", {"format": {"type": "object", "if": {}, "then": {}}}, "format", "Unimplemented keys"),
    ("/api/generate", {"regex": "[a-"}, "regex", "regex"),
]


def _family_error(path: str, r: httpx.Response) -> tuple[str, str | None]:
    """The message and param of a 400 in the family's own shape."""
    assert r.status_code == 400, r.text
    doc = r.json()
    if path.startswith("/api/"):
        assert set(doc) == {"error"} and isinstance(doc["error"], str)
        return doc["error"], None
    if path == "/v1/messages":
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        return doc["error"]["message"], None
    assert doc["error"]["code"] == formats.INVALID
    return doc["error"]["message"], doc["error"]["param"]


@pytest.mark.parametrize(("path", "extra", "param", "needle"), BAD, ids=[f"{p} {param} {n[:20]}" for p, _e, param, n in BAD])
def test_a_bad_format_is_a_400_in_the_familys_shape_naming_the_field(path: str, extra: dict, param: str, needle: str) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post(path, json={**BASE[path], **extra})
        message, named = _family_error(path, r)
        assert message.startswith(f"{param}: ") and needle in message, message
        assert named == (None if path.startswith(("/api/", "/v1/messages")) else param)
        assert r.headers.get("x-should-retry") == "false"
        assert not submits(backend)

    run_api(body)


def test_the_readers_directly() -> None:
    assert formats.extensions("", None) == (None, None)  # an empty field is no format
    assert formats.ollama_format("") is None and formats.openai_response_format(None) is None
    one = formats.openai_response_format({"type": "json_schema", "json_schema": {"name": "n", "schema": json.dumps(SCHEMA)}})
    assert one == formats.Asked("response_format", "response_format.json_schema.schema", OutputFormat("json_schema", TEXT, "n"))
    assert formats.output_format(None, one, None) == one.fmt  # a schema sent as JSON text is read too
    assert formats.output_format(None, None) is None
    with pytest.raises(ApiError, match="at most one output format"):
        formats.output_format(*formats.extensions("a", "start: \"a\""))


def test_responses_echo_the_format_asked() -> None:
    fmt = {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/responses", json={**BASE["/v1/responses"], "text": {"format": fmt}})
        assert r.status_code == 200 and r.json()["text"] == {"format": fmt}
        r = await client.post("/v1/responses", json=BASE["/v1/responses"])
        assert r.json()["text"] == {"format": {"type": "text"}}

    run_api(body)


def test_a_moved_request_keeps_its_format() -> None:
    """The continuation of a request whose instance failed carries the same format (the
    runner replays the tokens sent into its grammar: tests/test_structured_engine.py)."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script, calls = failing_script({0: 2, 1: 2})
        r = await client.post("/v1/chat/completions", json={**BASE["/v1/chat/completions"], "response_format": OPENAI_SCHEMA})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "".join(WORDS)
        assert [len(c.params.resume_tokens) for c in calls] == [0, 2, 4]
        assert {c.params.output_format for c in calls} == {OutputFormat("json_schema", TEXT, "thing")}

    run_api(body)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_keywords = st.sampled_from(["type", "properties", "items", "enum", "anyOf", "$ref", "$defs", "pattern", "minimum",
                             "maxItems", "required", "format", "const", "additionalProperties"])
_schemas = st.recursive(_json, lambda inner: st.dictionaries(_keywords, inner, max_size=4), max_leaves=10)
_types = st.sampled_from(["text", "json_object", "json_schema", "regex", None, 3])
_fields = st.one_of(
    _json,
    st.fixed_dictionaries({"type": _types}, optional={"json_schema": st.fixed_dictionaries({}, optional={
        "name": _json, "schema": _schemas, "strict": _json}), "schema": _schemas, "name": _json}),
)


@given(field=_fields, regex=st.none() | st.text(max_size=12), grammar=st.none() | st.text(max_size=12))
def test_any_json_in_a_format_field_is_a_format_or_a_400(field: Any, regex: str | None, grammar: str | None) -> None:
    readers = [formats.openai_response_format, formats.responses_text_format, formats.ollama_format,
               lambda v: formats.anthropic_output_format({"format": v}), lambda v: formats.anthropic_output_format(v)]
    for read in readers:
        try:
            fmt = formats.output_format(read(field), *formats.extensions(regex, grammar))
        except ApiError as e:
            assert e.info.status == 400 and e.info.param and str(e).startswith(e.info.param)
        else:
            assert fmt is None or isinstance(fmt, OutputFormat)
            json.dumps(fmt.source if fmt else None)  # travels as text
