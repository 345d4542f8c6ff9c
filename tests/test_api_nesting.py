"""Input a client shapes to exhaust the API's recursion or slip past a list of allowed values,
in process (exo_p2p/api/families/tool_calls.py, families/openai/chat_tools.py, responses_tools.py): deeply
nested tool-call arguments and tool schemas are a 400 naming the field in every family that
parses them (never a 500 from a ``RecursionError``), and a reasoning effort outside the
allowed values is a 400 naming them, in the family's error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.api.families.openai.chat_tools import REASONING_EFFORTS
from exo_p2p.api.families.tool_calls import MAX_JSON_DEPTH, json_depth
from tests.support.fake_master import MODEL, FakeMaster, run_api, submits

pytestmark = pytest.mark.unit
DEEP = 100_000
"""Nesting far beyond Python's recursion limit (the string form) ..."""
OVER = MAX_JSON_DEPTH + 1
"""... and just beyond the bound (the object form, which the body decoder parses first)."""


def nested(depth: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``: ``depth`` objects deep."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def deep_text(depth: int = DEEP) -> str:
    return '{"a":' + "[" * depth + "]" * depth + "}"


@given(st.recursive(st.none() | st.integers(), lambda c: st.lists(c) | st.dictionaries(st.text(max_size=2), c)))
def test_json_depth_counts_arrays_and_objects(value: Any) -> None:
    def depth(v: Any) -> int:
        kids = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if kids is None else 1 + max((depth(k) for k in kids), default=0)

    assert json_depth(value) == depth(value)


def test_json_depth_needs_no_recursion() -> None:
    assert json_depth(nested(DEEP)) == DEEP


def _tool_call_turns(arguments: Any) -> dict[str, list[dict[str, Any]]]:
    return {"messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": arguments}}]}]}


CASES = [
    ("/v1/chat/completions", {"model": MODEL, **_tool_call_turns(deep_text())}, "messages[1].tool_calls[0].arguments"),
    ("/v1/chat/completions", {"model": MODEL, **_tool_call_turns(json.dumps(nested(OVER)))}, "messages[1].tool_calls[0].arguments"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": nested(OVER)}}]}, "tools[0]"),
    ("/v1/responses", {"model": MODEL, "input": [{"role": "user", "content": "hi"}, {
        "type": "function_call", "call_id": "c", "name": "f", "arguments": deep_text()}]}, "input[1].arguments"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": nested(OVER)}]}]},
     "messages.1.content[0].input"),  # the family names its messages so
    ("/api/chat", {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": nested(OVER)}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ("/api/chat", {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": deep_text()}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
]


@pytest.mark.parametrize("path, body, param", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_deeply_nested_tool_json_is_a_400_naming_the_field_in_every_family(path: str, body: dict[str, Any], param: str) -> None:
    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post(path, json=body)
        assert r.status_code == 400, r.text[:300]
        assert param in r.text and "nested too deeply" in r.text, r.text[:300]
        assert not submits(backend)

    run_api(run)


def test_arguments_at_the_bound_are_accepted() -> None:
    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json={"model": MODEL, **_tool_call_turns(json.dumps(nested(MAX_JSON_DEPTH)))})
        assert r.status_code == 200, r.text[:300]

    run_api(run)


EFFORTS = [
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "reasoning_effort",
     lambda e: {"reasoning_effort": e}),
    ("/v1/responses", {"model": MODEL, "input": "hi"}, "reasoning.effort", lambda e: {"reasoning": {"effort": e}}),
]


@pytest.mark.parametrize("path, base, param, field", EFFORTS, ids=[e[0] for e in EFFORTS])
def test_an_unknown_reasoning_effort_is_a_400_naming_the_allowed_values(path: str, base: dict[str, Any], param: str, field) -> None:  # type: ignore[no-untyped-def]
    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for bad in ("ultra", "", 3, "HIGH"):
            r = await client.post(path, json={**base, **field(bad)})
            assert r.status_code == 400, (bad, r.text)
            error = r.json()["error"]
            assert error["param"] == param, error
            if isinstance(bad, str):  # a number is refused by the body's types, naming the field
                assert all(repr(e) in error["message"] for e in REASONING_EFFORTS), error
        assert not submits(backend)
        for effort in REASONING_EFFORTS:
            r = await client.post(path, json={**base, **field(effort)})
            assert r.status_code == 200, (effort, r.text)
        assert [s.params.thinking for s in submits(backend)] == [e != "none" for e in REASONING_EFFORTS]

    run_api(run)


def test_a_responses_reasoning_that_is_not_an_object_is_a_400() -> None:
    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/responses", json={"model": MODEL, "input": "hi", "reasoning": "high"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning", r.text

    run_api(run)
