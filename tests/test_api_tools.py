"""Tools and reasoning through the API families, in process (exo_p2p/api/families/tool_calls.py, turn.py,
families/*_tools.py): what a request with tools, earlier calls and results becomes; bad tools
refused naming the field; a scripted answer with reasoning, text and calls in each family's
shapes, streamed and not."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from exo_p2p.api.families.tool_calls import MAX_TOOLS
from exo_p2p.types import ChatMessage, FinishChunk, PrefillProgressChunk, TokenChunk, ToolCall
from tests.support.fake_master import MODEL, FakeMaster, run_api, sse_events, submits

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
CALLS = (ToolCall("call_t_0", "get_weather", '{"city": "Paris"}'), ToolCall("call_t_1", "get_time", "{}"))


def tool_script(task_id: str, calls: tuple[ToolCall, ...] = CALLS, reason: str = "tool_calls") -> list[Any]:
    """Reasoning over two tokens, a text token, then the calls on the last token."""
    return [
        PrefillProgressChunk(task_id=task_id, processed=0, total=12),
        TokenChunk(task_id=task_id, text="", completion_tokens=1, token_id=1, reasoning="plan "),
        TokenChunk(task_id=task_id, text="", completion_tokens=2, token_id=2, reasoning="it"),
        TokenChunk(task_id=task_id, text="Let me look.", completion_tokens=3, token_id=3),
        TokenChunk(task_id=task_id, text="", completion_tokens=4, token_id=4, calls=calls),
        FinishChunk(task_id=task_id, finish_reason=reason, prompt_tokens=12, completion_tokens=4),  # type: ignore[arg-type]
    ]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "weather?"}], **fields}


def test_openai_chat_request_with_tools_calls_and_results() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        messages = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "reasoning_content": "plan",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        ]
        r = await client.post("/v1/chat/completions", json=chat(messages=messages, tools=TOOLS, reasoning_effort="none",
                                                               tool_choice={"type": "function", "function": {"name": "get_time"}}))
        assert r.status_code == 200, r.text
        p = submits(backend)[0].params
        assert json.loads(p.tools or "") == TOOLS and (p.tool_choice, p.thinking) == ("function:get_time", False)
        assert p.messages[1].tool_calls == (ToolCall("c1", "get_weather", '{"city":"Paris"}'),)  # as sent: byte-stable
        assert p.messages[1].reasoning == "plan"
        assert (p.messages[2].role, p.messages[2].content, p.messages[2].tool_call_id) == ("tool", "sunny", "c1")

    run_api(body)


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "(?<=a)b"}}}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools[2]"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "x" * 70_000}}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[0].tool_calls[0].arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}, "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
])
def test_openai_chat_bad_tools_are_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json=chat(**fields))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
        assert not submits(backend)

    run_api(body)


def test_openai_chat_answer_with_reasoning_text_and_calls() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id)
        doc = (await client.post("/v1/chat/completions", json=chat(tools=TOOLS))).json()
        choice = doc["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        message = choice["message"]
        assert message["content"] == "Let me look." and message["reasoning_content"] == message["reasoning"] == "plan it"
        assert message["tool_calls"] == [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                         for c in CALLS]
        assert doc["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
        one = (await client.post("/v1/chat/completions", json=chat(tools=TOOLS, parallel_tool_calls=False))).json()
        assert [c["id"] for c in one["choices"][0]["message"]["tool_calls"]] == ["call_t_0"]
        backend.script = lambda cmd: tool_script(cmd.task_id, calls=CALLS[:1])[:3] + tool_script(cmd.task_id, calls=CALLS[:1])[4:]
        only_calls = (await client.post("/v1/chat/completions", json=chat(tools=TOOLS))).json()["choices"][0]["message"]
        assert only_calls["content"] is None and len(only_calls["tool_calls"]) == 1

    run_api(body)


def test_openai_chat_stream_of_reasoning_text_and_calls() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id)
        r = await client.post("/v1/chat/completions", json=chat(tools=TOOLS, stream=True))
        events = [json.loads(e) for e in sse_events(r.text)[:-1]]
        deltas = [e["choices"][0]["delta"] for e in events]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "plan it"
        assert "".join(d.get("reasoning", "") for d in deltas) == "plan it"
        assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
        parts = [p for d in deltas for p in d.get("tool_calls", [])]
        assert [p["index"] for p in parts] == [0, 0, 1, 1]
        assert [(p["id"], p["function"]["name"]) for p in parts if "id" in p] == [(c.id, c.name) for c in CALLS]
        assert ["".join(p["function"]["arguments"] for p in parts if p["index"] == i) for i in (0, 1)] == [c.arguments for c in CALLS]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]] == ["tool_calls"]
        r = await client.post("/v1/chat/completions", json=chat(tools=TOOLS, stream=True, stream_options={"include_usage": True}))
        usage = [json.loads(e)["usage"] for e in sse_events(r.text)[:-1] if json.loads(e).get("usage")]
        assert len(usage) == 1 and usage[0]["completion_tokens_details"] == {"reasoning_tokens": 2}, usage

    run_api(body)


ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER}, {"name": "get_time", "input_schema": {"type": "object"}}]


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "weather?"}], **fields}


def anthropic_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(block.split("\n")[1].removeprefix("data: ")) for block in text.strip().split("\n\n")]


def test_anthropic_request_with_tools_blocks_and_a_noisy_system_prompt() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        turns = [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "s"}, {"type": "text", "text": "Looking."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                                         {"type": "text", "text": "and?"}]},
        ]
        system = "x-anthropic-billing-header: cc_version=1.0.1; cch=abc\nBe brief."
        r = await client.post("/v1/messages", json=messages(messages=turns, tools=ANTHROPIC_TOOLS, system=system,
                                                            tool_choice={"type": "tool", "name": "get_time"}, thinking={"type": "enabled", "budget_tokens": 1024}))
        assert r.status_code == 200, r.text
        p = submits(backend)[0].params
        assert [t["function"]["name"] for t in json.loads(p.tools or "")] == ["get_weather", "get_time"]
        assert (p.tool_choice, p.thinking) == ("function:get_time", True)
        assert p.messages[0].content == "Be brief."
        assert p.messages[2] == ChatMessage("assistant", "Looking.", tool_calls=(ToolCall("toolu_1", "get_weather", '{"city": "Paris"}'),),
                                            reasoning="plan")
        assert p.messages[3:] == (ChatMessage("tool", "sunny", tool_call_id="toolu_1"), ChatMessage("user", "and?"))
        for fields, param in [({"tool_choice": {"type": "tool", "name": "nope"}, "tools": ANTHROPIC_TOOLS}, "tool_choice"),
                              ({"tool_choice": {"type": "any"}}, "tool_choice"),
                              ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
                               "messages.0.content[0].type"),
                              ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                                  {"type": "tool_use", "id": "t", "name": "f", "input": "oops"}]}]}, "content[0].input")]:
            bad = await client.post("/v1/messages", json=messages(**fields))
            assert bad.status_code == 400 and param in bad.json()["error"]["message"], bad.text

    run_api(body)


def test_anthropic_answer_blocks_streamed_and_not() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id)
        whole = (await client.post("/v1/messages", json=messages(tools=ANTHROPIC_TOOLS, thinking={"type": "enabled", "budget_tokens": 1024}))).json()
        assert whole["stop_reason"] == "tool_use"
        assert whole["content"] == [{"type": "thinking", "thinking": "plan it", "signature": ""}, {"type": "text", "text": "Let me look."},
                                    {"type": "tool_use", "id": "toolu_t_0", "name": "get_weather", "input": {"city": "Paris"}},
                                    {"type": "tool_use", "id": "toolu_t_1", "name": "get_time", "input": {}}]
        plain = (await client.post("/v1/messages", json=messages(tools=ANTHROPIC_TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True}))).json()
        assert [b["type"] for b in plain["content"]] == ["text", "tool_use"]  # no thinking asked: none answered
        r = await client.post("/v1/messages", json=messages(tools=ANTHROPIC_TOOLS, stream=True, thinking={"type": "enabled", "budget_tokens": 1024}))
        events = anthropic_events(r.text)
        starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
        assert starts == ["thinking", "text", "tool_use", "tool_use"]
        assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2, 3]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        assert "".join(d.get("thinking", "") for d in deltas) == "plan it"
        assert [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"] == [c.arguments for c in CALLS]
        assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["tool_use"]

    run_api(body)


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": WEATHER},
                   {"type": "function", "name": "get_time"}]


def test_responses_bad_items_name_their_own_field() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for item, param in [({"type": "function_call", "name": "get_time", "arguments": "{}"}, "input[1].call_id"),
                            ({"type": "function_call", "call_id": "c", "name": "get_time", "arguments": "[1]"}, "input[1].arguments"),
                            ({"type": "function_call_output", "call_id": "c", "output": {"text": "x"}}, "input[1].output"),
                            ({"type": "function_call_output", "call_id": "c"}, "input[1].output"),
                            ({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}, "input[1].output")]:
            r = await client.post("/v1/responses", json={"model": MODEL, "tools": RESPONSES_TOOLS,
                                                         "input": [{"role": "user", "content": "hi"}, item]})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert not submits(backend)

    run_api(body)


def test_responses_request_with_function_call_items() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        items = [{"role": "user", "content": "weather?"}, {"type": "reasoning", "id": "rs_1", "summary": []},
                 {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                 {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
                 {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                 {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}]
        r = await client.post("/v1/responses", json={"model": MODEL, "input": items, "tools": RESPONSES_TOOLS, "tool_choice": "required",
                                                     "reasoning": {"effort": "none"}})
        assert r.status_code == 200, r.text
        p = submits(backend)[0].params
        assert (p.tool_choice, p.thinking) == ("required", False)
        assert p.messages[1] == ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Paris"}'),
                                                                          ToolCall("c2", "get_time", "{}")))
        assert p.messages[2:] == (ChatMessage("tool", "sunny", tool_call_id="c1"), ChatMessage("tool", "noon", tool_call_id="c2"))

    run_api(body)


def test_responses_items_streamed_and_not() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id)
        ask = {"model": MODEL, "input": "weather?", "tools": RESPONSES_TOOLS}
        whole = (await client.post("/v1/responses", json=ask)).json()
        assert [i["type"] for i in whole["output"]] == ["reasoning", "message", "function_call", "function_call"]
        assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "plan it"}]
        assert whole["output"][1]["content"][0]["text"] == "Let me look."
        assert [(i["call_id"], i["name"], i["arguments"], i["status"]) for i in whole["output"][2:]] == [
            (c.id, c.name, c.arguments, "completed") for c in CALLS]
        assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 2 and whole["tools"] == RESPONSES_TOOLS
        r = await client.post("/v1/responses", json={**ask, "stream": True})
        events = [json.loads(e.split("\n")[1].removeprefix("data: ")) for e in r.text.strip().split("\n\n")]
        kinds = [e["type"] for e in events]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == ["reasoning", "message", "function_call",
                                                                                                     "function_call"]
        assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "plan it"
        assert [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"] == [c.arguments for c in CALLS]
        def strip(items):  # the ids name each response
            return [{k: v for k, v in i.items() if k != "id"} for i in items]

        assert kinds[-1] == "response.completed" and strip(events[-1]["response"]["output"]) == strip(whole["output"])
        assert events[-1]["response"]["usage"] == whole["usage"], "the stream's usage counts reasoning tokens too"

    run_api(body)


def test_ollama_chat_with_tools_calls_results_and_thinking() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id)
        turns = [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
        ask = {"model": MODEL, "messages": turns, "tools": TOOLS, "think": True, "stream": False}
        doc = (await client.post("/api/chat", json=ask)).json()
        p = submits(backend)[0].params
        assert p.thinking is True and json.loads(p.tools or "") == TOOLS
        assert p.messages[1].tool_calls == (ToolCall("call_1_0", "get_weather", '{"city": "Paris"}'),)
        assert p.messages[2] == ChatMessage("tool", "sunny", name="get_weather")
        assert doc["message"]["thinking"] == "plan it" and doc["message"]["content"] == "Let me look."
        assert doc["message"]["tool_calls"] == [{"function": {"index": i, "name": c.name, "arguments": json.loads(c.arguments)}}
                                                for i, c in enumerate(CALLS)]
        lines = [json.loads(line) for line in (await client.post("/api/chat", json={**ask, "stream": True})).text.splitlines()]
        assert "".join(m["message"].get("thinking", "") for m in lines) == "plan it"
        assert [c for m in lines for c in m["message"].get("tool_calls", [])] == doc["message"]["tool_calls"]
        quiet = (await client.post("/api/chat", json={**ask, "think": False})).json()
        assert "thinking" not in quiet["message"] and submits(backend)[-1].params.thinking is False
        bad = await client.post("/api/chat", json={**ask, "think": "very"})
        assert bad.status_code == 400 and "think" in bad.json()["error"]

    run_api(body)


def test_a_call_sent_back_renders_the_arguments_it_was_answered_with() -> None:
    """Each family's answer, sent back as the next turn's history, gives the runner the same
    arguments text (so turn N+1's prompt starts with turn N's bytes: the prompt cache)."""
    unicode_call = ToolCall("call_t_0", "get_weather", '{"city": "Zürich", "days": 2}')

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: tool_script(cmd.task_id, calls=(unicode_call,))
        oa = (await client.post("/v1/chat/completions", json=chat(tools=TOOLS))).json()["choices"][0]["message"]
        an = (await client.post("/v1/messages", json=messages(tools=ANTHROPIC_TOOLS))).json()["content"]
        ol = (await client.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                                   "stream": False})).json()["message"]
        backend.script = lambda cmd: tool_script(cmd.task_id, calls=())
        await client.post("/v1/chat/completions", json=chat(tools=TOOLS, messages=[{"role": "user", "content": "x"}, oa]))
        await client.post("/v1/messages", json=messages(tools=ANTHROPIC_TOOLS, messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": [b for b in an if b["type"] == "tool_use"]}]))
        await client.post("/api/chat", json={"model": MODEL, "tools": TOOLS, "stream": False, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": ol["tool_calls"]}]})
        for submit in submits(backend)[3:]:
            (call,) = submit.params.messages[1].tool_calls
            assert (call.name, call.arguments) == (unicode_call.name, unicode_call.arguments)

    run_api(body)
