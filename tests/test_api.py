"""The HTTP API against a fake node backend: OpenAI chat completions (SSE and JSON), error
mapping (docs/architecture.md#instance-lifecycle), disconnect → cancel, queue limit and timeouts (the cluster endpoints:
``test_api_cluster_endpoints.py``; the API served by hypercorn: ``test_api_server.py``).

Tests are sync functions that call ``trio.run``; every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import msgspec
import pytest
import trio

from exo_p2p.api import create_app
from exo_p2p.api.generation.job import GenerationSettings
from exo_p2p.types import CancelGeneration, ErrorChunk, ErrorInfo, GenerationParams, SubmitTask, TokenChunk
from tests.support.fake_master import FakeMaster, LOADING, MODEL, Script, TOKENS, UNPLACED, all_keys, assert_openai_error, chat_body, drive_asgi, null_keys, reply_script, run_api, sse_events, submits

FORBIDDEN_NULL_KEYS = {"tool_calls", "function_call", "name", "logprobs", "refusal"}


# --------------------------------------------------------------------------- streaming


def test_stream_sse_format() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        task_id = submits(backend)[0].task_id
        for c in chunks:
            assert c["id"] == f"chatcmpl-{task_id}"
            assert c["object"] == "chat.completion.chunk"
            assert c["model"] == MODEL and isinstance(c["created"], int)
            assert "usage" not in c
            assert not (all_keys(c) & FORBIDDEN_NULL_KEYS)
            assert null_keys(c) <= {"finish_reason"}
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        finishing = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
        assert len(finishing) == 1 and finishing[0] is chunks[-1]
        assert finishing[0]["choices"][0]["finish_reason"] == "stop"
        contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
        assert contents == [t for t in TOKENS if t]  # the empty token is skipped
        assert backend.log == ["open", "command:SubmitTask", "close"]
        assert not backend.cancelled

    run_api(body)


def test_stream_include_usage_chunk_and_cancelled_maps_to_stop() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: reply_script(cmd.task_id, ["a", "b", "c"], reason="cancelled")
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True}))
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        usage_chunk = chunks[-1]
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                                       "prompt_tokens_details": {"cached_tokens": 0}}
        assert [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [chunks[-2]]
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert all("usage" not in c for c in chunks[:-1])

    run_api(body)


def test_first_chunk_error_is_a_json_status_even_when_streaming() -> None:
    message = "prompt is 20000 tokens, longer than the context of 8192 tokens"

    def script(cmd: SubmitTask) -> Script:
        return [ErrorChunk(task_id=cmd.task_id, error=ErrorInfo(400, message, param="messages", code="context_length_exceeded"))]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = script
        for stream in (True, False):
            r = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
            error = assert_openai_error(r, 400)
            assert error["message"] == message and error["code"] == "context_length_exceeded"
        assert not backend.cancelled  # the task ended by itself

    run_api(body)


def test_mid_stream_error_becomes_an_error_event_then_done() -> None:
    def script(cmd: SubmitTask) -> Script:
        return [
            TokenChunk(task_id=cmd.task_id, text="Par", completion_tokens=1),
            ErrorChunk(task_id=cmd.task_id, error=ErrorInfo(503, "runner r1 failed", "server_error")),
        ]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = script
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert r.status_code == 200
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last == {"error": {"message": "runner r1 failed", "type": "server_error", "param": None, "code": None}}
        chunks = [json.loads(e) for e in events[:-2]]
        assert [c["choices"][0]["delta"].get("content") for c in chunks[1:]] == ["Par"]
        # Non-streaming: the same failure is the error's status as JSON.
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert assert_openai_error(r, 503)["message"] == "runner r1 failed"

    run_api(body)


# ------------------------------------------------------------------------ non-streaming


def test_non_stream_shape_usage_and_parameter_mapping() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        request = chat_body(
            model="default",
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]},
                {"role": "assistant", "content": None},
            ],
            max_completion_tokens=7,
            temperature=0,
            top_p=0.5,
            stop="\n\n",
            seed=42,
            user="someone",
            some_future_field={"x": [1, 2]},
            n=1,
            tools=[],
            logprobs=False,
            presence_penalty=0,
            response_format={"type": "text"},
            tool_choice="none",
        )
        r = await client.post("/v1/chat/completions", json=request)
        assert r.status_code == 200, r.text
        doc = r.json()
        (submit,) = submits(backend)
        assert doc["id"] == f"chatcmpl-{submit.task_id}"
        assert doc["object"] == "chat.completion" and doc["model"] == MODEL
        message = {"role": "assistant", "content": "".join(TOKENS), "refusal": None}
        assert doc["choices"] == [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]
        assert doc["usage"] == {"prompt_tokens": 12, "completion_tokens": len(TOKENS), "total_tokens": 12 + len(TOKENS),
                                "prompt_tokens_details": {"cached_tokens": 0}}
        assert null_keys(doc) == {"refusal", "logprobs"}  # the spec's required nullable fields
        assert submit.model_id == MODEL and submit.api_node_id == backend.node_id
        p = submit.params
        assert [(m.role, m.content) for m in p.messages] == [
            ("system", "Be brief."),
            ("user", "What is the capital of France?"),
            ("assistant", ""),
        ]
        assert (p.max_tokens, p.temperature, p.top_p, p.stop, p.seed) == (7, 0.0, 0.5, ("\n\n",), 42)
        assert backend.log == ["open", "command:SubmitTask", "close"]

    run_api(body, model_aliases={"default": MODEL})


def test_defaults_come_from_generation_params_and_max_tokens_alias() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        await client.post("/v1/chat/completions", json=chat_body())
        await client.post("/v1/chat/completions", json=chat_body(max_tokens=9, stop=["a", "", "b"]))
        first, second = (s.params for s in submits(backend))
        defaults = GenerationParams(messages=first.messages, client=first.client)
        assert first == defaults and (first.client or "").startswith("peer:")  # exo_p2p.api.generation.client_key
        assert second.max_tokens == 9 and second.stop == ("a", "b")

    run_api(body)


# ------------------------------------------------------------------------- bad input

BAD_REQUESTS: list[tuple[str, bytes | dict[str, Any], str | None, str]] = [
    ("malformed json", b'{"model": "m", "messages": [', None, "invalid JSON"),
    ("invalid utf-8", b'{"model": "\xff\xfe", "messages": []}', None, "UTF-8"),
    ("not an object", b"[1, 2]", None, "Expected `object`"),
    ("empty body", b"", None, "empty"),
    ("missing model", {"messages": [{"role": "user", "content": "hi"}]}, "model", "missing required field `model`"),
    ("empty messages", chat_body(messages=[]), "messages", "messages"),
    ("unknown role", chat_body(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role", "wizard"),
    ("tool role without its call", chat_body(messages=[{"role": "tool", "content": "hi"}]), "messages[0].tool_call_id", "tool_call_id"),
    ("function role", chat_body(messages=[{"role": "function", "content": "hi"}]), "messages[0].role", "function"),
    ("user without content", chat_body(messages=[{"role": "user"}]), "messages[0].content", "content"),
    ("image part without a url", chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content[0].image_url", "non-empty URL"),
    ("max_tokens < 1", chat_body(max_tokens=0), "max_tokens", ">= 1"),
    ("max_completion_tokens < 1", chat_body(max_completion_tokens=-5), "max_completion_tokens", ">= 1"),
    ("max_tokens wrong type", chat_body(max_tokens="x"), "max_tokens", "got `str` - at `$.max_tokens`"),
    ("temperature < 0", chat_body(temperature=-0.1), "temperature", ">= 0"),
    ("temperature > 2", chat_body(temperature=2.5), "temperature", "<= 2"),
    ("top_p 0", chat_body(top_p=0), "top_p", "> 0"),
    ("n = 2", chat_body(n=2), "n", "'n'"),
    ("tool without a name", chat_body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "name"),
    ("tool_choice without tools", chat_body(tool_choice="required"), "tool_choice", "needs tools"),
    ("top_logprobs", chat_body(logprobs=True, top_logprobs=21), "top_logprobs", "0..20"),
    ("top_logprobs without logprobs", chat_body(top_logprobs=3), "top_logprobs", "needs logprobs"),
    ("response_format schema", chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format.json_schema.schema", "Invalid type: nope"),
    ("logit_bias key", chat_body(logit_bias={"the": -100}), "logit_bias", "token ids"),
    ("logit_bias value", chat_body(logit_bias={"5": -101}), "logit_bias.5", "[-100, 100]"),
    ("presence_penalty range", chat_body(presence_penalty=2.5), "presence_penalty", "<= 2.0"),
    ("frequency_penalty range", chat_body(frequency_penalty=-3), "frequency_penalty", ">= -2.0"),
    ("top_k negative", chat_body(top_k=-1), "top_k", ">= 0"),
    ("repetition_penalty zero", chat_body(repetition_penalty=0), "repetition_penalty", "> 0.0"),
    ("functions", chat_body(functions=[{"name": "f"}]), "functions", "'functions'"),
    ("seed negative", chat_body(seed=-1), "seed", ">= 0"),
    ("huge max_tokens", chat_body(max_tokens=10**30), "max_tokens", "max_tokens"),
]


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_is_400_naming_the_parameter_and_api_keeps_serving(case: tuple) -> None:
    _, payload, param, needle = case

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        if isinstance(payload, bytes):
            r = await client.post("/v1/chat/completions", content=payload, headers={"content-type": "application/json"})
        else:
            r = await client.post("/v1/chat/completions", json=payload)
        error = assert_openai_error(r, 400)
        assert error["type"] == "invalid_request_error"
        assert needle in error["message"], error
        if param is not None:
            assert error["param"] == param
        assert not submits(backend) and backend.log == []
        good = await client.post("/v1/chat/completions", json=chat_body())
        assert good.status_code == 200

    run_api(body)


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [("no-such-model", 404, "model_not_found"), (UNPLACED, 409, "model_not_placed"), (LOADING, 503, "loading")],
)
@pytest.mark.parametrize("stream", [False, True])
def test_command_errors_pass_through_with_their_status(model: str, status: int, code: str, stream: bool) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/v1/chat/completions", json=chat_body(model=model, stream=stream))
        error = assert_openai_error(r, status)
        assert error["code"] == code
        if status == 503:
            assert int(r.headers["retry-after"]) > 0
        else:
            assert "retry-after" not in r.headers
        assert backend.log == ["open", "command:SubmitTask", "close"]
        assert not backend.cancelled and not backend.channels
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200

    run_api(body)


# ------------------------------------------------------------- disconnect, limits, timeouts


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_sends_cancel_generation(stream: bool) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            backend.script = lambda cmd: reply_script(cmd.task_id, ["x"] * 200, delay=0.02)
            app = create_app(backend)
            payload = msgspec.json.encode(chat_body(stream=stream))
            start = trio.current_time()
            if stream:  # disconnect after the first content event arrived
                def when(sent: list[dict]) -> bool:
                    return sum(1 for m in sent if m["type"] == "http.response.body") >= 3
            else:
                def when(sent: list[dict]) -> bool:
                    return trio.current_time() - start > 0.2
            with trio.fail_after(5):
                sent = await drive_asgi(app, payload, when)
            (submit,) = submits(backend)
            cancels = [c for c in backend.commands if isinstance(c, CancelGeneration)]
            assert [c.task_id for c in cancels] == [submit.task_id]
            assert backend.log[-2:] == ["command:CancelGeneration", "close"]
            assert submit.task_id not in backend.channels
            if not stream:
                assert sent == []  # nothing was answered to the vanished client
            assert trio.current_time() - start < 2.0  # not waiting for the 200 tokens
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_queue_limit_answers_429_at_once_and_frees_the_slot() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        release = backend.gate = trio.Event()
        first: list[httpx.Response] = []

        async def occupy() -> None:
            first.append(await client.post("/v1/chat/completions", json=chat_body()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(occupy)
            while not submits(backend):
                await trio.sleep(0.01)
            t0 = time.monotonic()
            r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
            assert time.monotonic() - t0 < 1.0
            error = assert_openai_error(r, 429)
            assert error["message"] == "queue full: 1 requests in flight, limit 1"
            assert len(submits(backend)) == 1  # the refused request never reached the master
            release.set()
        assert first[0].status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200

    run_api(body, queue_limit=1)


def test_silent_generation_times_out_with_504_and_is_cancelled() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.script = lambda cmd: [5.0]
        r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
        assert assert_openai_error(r, 504)["code"] == "timeout"
        assert len(backend.cancelled) == 1

    run_api(body, generation=GenerationSettings(chunk_timeout=0.2))
