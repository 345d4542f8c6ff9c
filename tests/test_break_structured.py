"""Hostile structured-output and tool requests on the API side (docs/api.md#structured-output,
#tools-and-reasoning): each is a 400 naming the field, and what the API node spends checking it
is bounded before any schema is compiled, so its event loop stays responsive."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import trio

from exo_p2p.api.families import tool_calls as tools_mod
from exo_p2p.api.errors import ApiError
from exo_p2p.api.families.anthropic.tools import anthropic_tools
from exo_p2p.api.families.openai.chat_tools import openai_tools
from exo_p2p.api.families.openai.responses_tools import responses_tools
from tests.support.fake_master import MODEL, FakeMaster, run_api, submits

WIDE = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(2000)}}
"""A 50 KB schema that takes llguidance a few hundred ms to compile."""
MSGS = [{"role": "user", "content": "hi"}]


def _openai(n: int, schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": f"t{j}", "parameters": schema}} for j in range(n)]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    compiled: list[str] = []
    real = tools_mod.schema_problem

    def spy(name: str, parameters: dict[str, Any]) -> str | None:
        compiled.append(name)
        return real(name, parameters)

    monkeypatch.setattr(tools_mod, "schema_problem", spy)
    return compiled


@pytest.mark.parametrize("tools", [_openai(20, WIDE), _openai(2000, {"type": "object"})])
def test_tools_past_their_bounds_are_refused_before_any_schema_is_compiled(
        tools: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _counting(monkeypatch)
    with pytest.raises(ApiError) as e:
        openai_tools(tools)
    assert e.value.info.status == 400 and e.value.info.param == "tools"
    assert compiled == []


def test_a_bad_schema_is_named_by_the_family_field_after_skipped_server_tools() -> None:
    bad_schema = {"type": "string", "pattern": "(?=a)a"}
    server = {"type": "web_search_20250305", "name": "web_search"}
    with pytest.raises(ApiError) as e:
        anthropic_tools([server, {"name": "f", "input_schema": bad_schema}])
    assert e.value.info.param == "tools.1.input_schema"
    with pytest.raises(ApiError) as e:
        responses_tools([{"type": "file_search"}, {"type": "function", "name": "f", "parameters": bad_schema}])
    assert e.value.info.param == "tools[1].parameters"
    with pytest.raises(ApiError) as e:
        openai_tools(_openai(1, {"type": "object"}) + [{"type": "function", "function": {"name": "g", "parameters": bad_schema}}])
    assert e.value.info.param == "tools[1].function.parameters"


def test_many_big_tool_schemas_are_a_quick_400() -> None:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": _openai(60, WIDE)})

    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        start = time.process_time()  # CPU seconds of the process, all threads: not the machine's load
        r = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
        assert time.process_time() - start < 1.0, "the bound is checked before any schema is compiled"
        assert not submits(backend)

    run_api(run)


SLOW = {"properties": {f"{i}": {} for i in range(5000)}}
"""A valid 48 KB schema llguidance takes about half a second to check."""
SLOW_BODIES = {
    "/v1/chat/completions": {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SLOW}}},
    "/v1/messages": {"max_tokens": 8, "messages": MSGS, "output_config": {"format": {"type": "json_schema", "schema": SLOW}}},
    "/api/chat": {"messages": MSGS, "stream": False, "format": SLOW},
    "/v1/responses": {"input": "hi", "text": {"format": {"type": "json_schema", "name": "s", "schema": SLOW}}},
}


@pytest.mark.parametrize("path", sorted(SLOW_BODIES))
def test_health_answers_within_a_second_while_big_schemas_are_checked(path: str) -> None:
    body = json.dumps({"model": MODEL} | SLOW_BODIES[path])

    async def post(client: httpx.AsyncClient) -> None:
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text

    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(post, client)
            start = time.perf_counter()
            await trio.sleep(0.05)
            r = await client.get("/health")
            assert r.status_code == 200
            assert time.perf_counter() - start < 1.0

    run_api(run, timeout=60)


@pytest.mark.parametrize("path", sorted(set(SLOW_BODIES) - {"/api/chat"}))
def test_a_schema_sent_as_deeply_nested_json_text_is_a_400(path: str) -> None:
    deep = '{"type":"array","items":' * 100_000 + "{}" + "}" * 100_000
    fields = json.loads(json.dumps(SLOW_BODIES[path]).replace(json.dumps(SLOW), json.dumps(deep)))
    body = json.dumps({"model": MODEL} | fields)

    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.text
        assert not submits(backend)

    run_api(run, timeout=60)


CYCLES = [{"$ref": "#"}, {"$ref": "#", "type": "object"},
          {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}]


@pytest.mark.parametrize("schema", CYCLES)
def test_a_ref_cycle_no_value_can_match_is_a_400_as_format_and_as_tool(schema: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}

    async def run(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema.schema", r.text
        r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "tools": [tool], "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.parameters", r.text
        assert "leads back to itself" in r.text
        assert not submits(backend)

    run_api(run)


def test_recursive_schemas_that_reach_a_value_still_pass() -> None:
    from exo_p2p.content.schema_refs import ref_cycle

    tree = {"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
            "$ref": "#/$defs/n"}
    assert ref_cycle(tree) is None
    assert ref_cycle({"type": "object", "properties": {"self": {"$ref": "#"}}}) is None
    assert ref_cycle({"$ref": "#/$defs/missing"}) is None
    chain = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)} | {"d3000": {"type": "integer"}}}
    start = time.perf_counter()
    assert ref_cycle(chain | {"$ref": "#/$defs/d0"}) is None
    assert time.perf_counter() - start < 0.5
