"""The coding agents' own request bodies, replayed against a real node serving the agent
synthetic model (think and tool-call markers; thinking on opens a think block): Claude Code's
Messages request (a system turn in mid-conversation with ``cache_control``, adaptive thinking,
tools, ``?beta=true``), Codex's stateless Responses request (``store: false``, ``include:
["reasoning.encrypted_content"]``, reasoning items sent back), opencode's chat request (10 tools,
``stream_options.include_usage``). Each is answered 200 with its family's event sequence, and
its second turn is served from the prompt cache (the usage's cached tokens). A prompt over the
context is refused in each vendor's words, and Ollama's ``/api/show`` and a curl-style form
post work as VS Code Copilot and Ollama's docs expect (docs/agents.md).

The fixtures in ``tests/data/agents/`` are written from the shapes the clients send (their
documented request bodies and what a tester captured); the agent CLIs themselves are not run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.support.tools_node import AGENT_MODEL, agent_node

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).parent / "data" / "agents"
CONTEXT = 8192
"""The model's context (tokens): room for an agent's tools with this tiny model's tokenizer."""
LONG = "the sea and the mountains " * 2000
"""A prompt of far more tokens than ``CONTEXT`` (but under the size bounds)."""


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n, _ = agent_node(tmp_path_factory, CONTEXT)
    try:
        yield n
    finally:
        n.stop()


def replay(create, body: dict):
    """``create`` (an SDK method) sending ``body`` as it is: the fields the SDK names as
    arguments, the rest through ``extra_body`` (an SDK's signature may lag the wire)."""
    named = ("model", "max_tokens", "messages", "stream")
    return create(**{k: body[k] for k in named if k in body}, extra_body={k: v for k, v in body.items() if k not in named})


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_claude_code_request_streams_and_its_second_turn_hits_the_cache(node) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=120)
    body = fixture("claude_code_messages.json")
    events = list(replay(client.beta.messages.create, body))  # ?beta=true, as Claude Code posts
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    thinking = "".join(e.delta.thinking for e in events if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert thinking or text
    first = events[-2].usage
    turn2 = {**body, "messages": [*body["messages"],
                                  {"role": "assistant", "content": [{"type": "thinking", "thinking": thinking, "signature": ""},
                                                                    {"type": "text", "text": text or "ok"}]},
                                  {"role": "user", "content": "Now run the tests."}]}
    second = [e for e in replay(client.beta.messages.create, turn2) if e.type == "message_delta"][0].usage
    assert second.cache_read_input_tokens >= first.input_tokens - 8, (first, second)  # the generation prompt may differ
    assert second.input_tokens + second.cache_read_input_tokens > first.input_tokens + first.cache_read_input_tokens
    # count_tokens takes the same body (the system turn included)
    counted = client.beta.messages.count_tokens(model=body["model"], messages=body["messages"],
                                                extra_body={k: body[k] for k in ("system", "tools", "thinking")})
    assert counted.input_tokens > 100


def test_codex_stateless_turns_carry_reasoning_and_hit_the_cache(node) -> None:
    body = fixture("codex_responses.json")
    r = node.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    output = events[-1]["response"]["output"]
    reasoning = [item for item in output if item["type"] == "reasoning"]
    assert reasoning and reasoning[0]["encrypted_content"].startswith("exo1."), output
    first = events[-1]["response"]["usage"]
    follow = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
    turn2 = {**body, "input": [*body["input"], *output, follow]}
    r2 = node.post("/v1/responses", json=turn2)
    assert r2.status_code == 200, r2.text
    second = sse_events(r2.text)[-1]["response"]["usage"]
    assert second["input_tokens_details"]["cached_tokens"] >= first["input_tokens"] - 8, (first, second)
    # the reasoning was rendered: without its encrypted_content the prompt is shorter
    bare = {**turn2, "input": [*body["input"], *[{k: v for k, v in i.items() if k != "encrypted_content"} for i in output], follow]}
    r3 = node.post("/v1/responses", json={**bare, "stream": False})
    assert r3.status_code == 200, r3.text
    assert r3.json()["usage"]["input_tokens"] < second["input_tokens"]
    forged = [{**reasoning[0], "encrypted_content": reasoning[0]["encrypted_content"][:-6] + "AAAAAA"}]
    r4 = node.post("/v1/responses", json={**body, "input": [*body["input"], *forged, follow]})
    assert r4.status_code == 400 and r4.json()["error"]["param"] == "input[3].encrypted_content", r4.text
    r5 = node.post("/v1/responses", json={**body, "include": ["message.output_text.logprobs"]})
    assert r5.status_code == 400 and "tools or reasoning" in r5.json()["error"]["message"]  # Codex's turns carry both


def test_opencode_chat_with_ten_tools_streams_usage_and_hits_the_cache(node) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=120)
    body = fixture("opencode_chat.json")
    assert len(body["tools"]) == 10
    chunks = list(client.chat.completions.create(**body))
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    first = chunks[-1].usage
    answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    turn2 = {**body, "messages": [*body["messages"], {"role": "assistant", "content": answer or "ok"},
                                  {"role": "user", "content": "And where is it saved?"}]}
    second = list(client.chat.completions.create(**turn2))[-1].usage
    assert second.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 8, (first, second)


def test_overflow_in_each_vendors_words(node) -> None:
    with pytest.raises(anthropic.BadRequestError) as a:
        anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0).messages.create(
            model=AGENT_MODEL, max_tokens=4, messages=[{"role": "user", "content": LONG}])
    assert a.value.body["error"]["type"] == "invalid_request_error"
    m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", a.value.body["error"]["message"])
    assert m and int(m.group(1)) > int(m.group(2)) == CONTEXT, a.value.body
    with pytest.raises(openai.BadRequestError) as o:
        openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
            model=AGENT_MODEL, max_tokens=4, messages=[{"role": "user", "content": LONG}])
    assert o.value.code == "context_length_exceeded"
    assert re.match(rf"This model's maximum context length is {CONTEXT} tokens\. However, your messages resulted in \d+ tokens\.",
                    o.value.body["message"]), o.value.body
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=node.url).chat(model=AGENT_MODEL, messages=[{"role": "user", "content": LONG}])
    assert ol.value.error == "the input length exceeds the context length"
    models = node.get("/v1/models").json()["data"]
    assert [m["context_length"] for m in models if m["id"] == AGENT_MODEL] == [CONTEXT]


def test_ollama_show_capabilities_and_a_curl_form_post(node) -> None:
    shown = ollama.Client(host=node.url).show(AGENT_MODEL)
    assert {"completion", "tools", "thinking"} <= set(shown.capabilities or [])
    arch = shown.modelinfo["general.architecture"]
    assert shown.modelinfo[f"{arch}.context_length"] == CONTEXT
    assert node.get("/api/version").json().keys() == {"version"}
    # curl http://host/api/chat -d '{...}' sends application/x-www-form-urlencoded
    body = json.dumps({"model": AGENT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                       "options": {"num_predict": 3}}).encode()
    r = httpx.post(f"{node.url}/api/chat", content=body, headers={"content-type": "application/x-www-form-urlencoded"}, timeout=120)
    assert r.status_code == 200 and r.json()["done"] is True, r.text
    r = httpx.post(f"{node.url}/api/chat", content=body, timeout=30,
                   headers={"content-type": "application/x-www-form-urlencoded", "origin": f"{node.url}"})
    assert r.status_code == 415, r.text  # a browser page (it sends Origin) still must post JSON
