"""The HTTP API against a fake node backend: OpenAI chat completions (SSE and JSON), error
mapping (docs/architecture.md#instance-lifecycle), disconnect → cancel, queue limit, cluster endpoints, and the real
hypercorn server with the official ``openai`` client.

Tests are sync functions that call ``trio.run``; every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import httpx
import msgspec
import pytest
import structlog
import structlog.testing
import trio

from exo_p2p.api import ApiBindError, NodeHealth, NodeSummary, create_app, serve
from exo_p2p.api.generation_job import GenerationSettings
from exo_p2p.state import apply, state_hash
from exo_p2p.types import (
    CancelGeneration,
    Chunk,
    Command,
    CommandResult,
    DeleteInstance,
    ErrorChunk,
    ErrorInfo,
    FinishChunk,
    GenerationParams,
    IndexedEvent,
    Instance,
    InstanceCreated,
    InstanceDeleted,
    ModelCard,
    NodeId,
    PlaceInstance,
    PrefillProgressChunk,
    RunnerLoading,
    RunnerStatusUpdated,
    ShardMetadata,
    State,
    SubmitTask,
    TaskId,
    TokenChunk,
    new_id,
)

MODEL = "smollm2-135m-instruct"
UNPLACED = "unplaced-model"
LOADING = "loading-model"
BIG = "huge-model"
TOKENS = ["Paris", " is", "", " the", " capital", "."]
"""The default scripted reply; the empty token must never become an SSE event."""
FORBIDDEN_NULL_KEYS = {"tool_calls", "function_call", "name", "logprobs", "refusal"}
JSON = {"content-type": "application/json"}
Script = list[Chunk | float]
"""Scripted chunks for one task; a float is a pause of that many seconds."""


def card(model_id: str, storage: int = 100_000_000, n_layers: int = 30) -> ModelCard:
    per_layer = storage // (n_layers + 1)
    return ModelCard(
        model_id=model_id,
        n_layers=n_layers,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        context_length=8192,
        storage_size=per_layer * (n_layers + 1),
        layer_bytes=(per_layer,) * n_layers,
        embedding_bytes=per_layer,
        head_bytes=0,
        norm_bytes=0,
        tie_word_embeddings=True,
    )


def reply_script(task_id: TaskId, tokens: list[str] = TOKENS, reason: str = "stop", delay: float = 0.0) -> Script:
    """Prefill progress, the tokens (with pauses of ``delay`` s), then a FinishChunk."""
    script: Script = [PrefillProgressChunk(task_id=task_id, processed=0, total=12)]
    for i, text in enumerate(tokens, 1):
        if delay:
            script.append(delay)
        script.append(TokenChunk(task_id=task_id, text=text, completion_tokens=i))
    script.append(
        FinishChunk(task_id=task_id, finish_reason=reason, prompt_tokens=12, completion_tokens=len(tokens))  # type: ignore[arg-type]
    )
    return script


class FakeMaster:
    """An ``ApiBackend`` whose master answers commands at once and whose runner feeds the
    chunks of ``script(command)`` into the task's channel from a task in ``nursery``.

    Models: ``MODEL`` is placed and ready; ``UNPLACED`` is known but not placed (409);
    ``LOADING`` is placed but loading (503, code ``loading``); ``BIG`` does not fit (400);
    anything else is unknown (404). ``log`` records "open", "command:<kind>", "close" in order.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.node_id = NodeId("node-a")
        cards = {m: card(m) for m in (MODEL, UNPLACED, LOADING)} | {BIG: card(BIG, storage=10**12)}
        self._state = State(model_cards=cards, master=self.node_id, term=1)
        self.commands: list[Command] = []
        self.log: list[str] = []
        self.channels: dict[str, trio.MemorySendChannel[Chunk]] = {}
        self.cancelled: set[str] = set()
        self.cancel_seen = trio.Event()
        self.script: Callable[[SubmitTask], Script] = lambda cmd: reply_script(cmd.task_id)
        self.fail_state = False
        self.gate: trio.Event | None = None
        """When set, generations wait for it before their first chunk."""
        self.place_lags = False
        """When set, placements are answered before the instance enters State."""

    # -- the ApiBackend protocol
    def state(self) -> State:
        if self.fail_state:
            raise RuntimeError("secret internal detail")
        return self._state

    def health(self) -> NodeHealth:
        return NodeHealth(node_id=self.node_id, master=self.node_id, warnings=["no peers found for 12 s"], counters={"dropped": 3})

    def nodes(self) -> list[NodeSummary]:
        return [NodeSummary(self.node_id, "box-a", True, True, 16 * 2**30, 8 * 2**30, ["/ip4/127.0.0.1/tcp/52514/p2p/node-a"], 0.0)]

    def local_models(self) -> list[ModelCard]:
        return [self._state.model_cards[MODEL]]

    async def command(self, command: Command, timeout: float = 30.0) -> CommandResult:
        self.commands.append(command)
        self.log.append(f"command:{type(command).__name__}")
        await trio.sleep(0)
        cid = command.command_id
        if isinstance(command, SubmitTask):
            error = self._model_error(command.model_id)
            if error is not None:
                return CommandResult(cid, error=error)
            self.nursery.start_soon(self._feed, command)
            return CommandResult(cid, instance_id="inst-1")
        if isinstance(command, CancelGeneration):
            self.cancelled.add(command.task_id)
            self.cancel_seen.set()
            return CommandResult(cid)
        if isinstance(command, PlaceInstance):
            return self._place(command)
        if isinstance(command, DeleteInstance):
            if command.instance_id not in self._state.instances:
                return CommandResult(cid, error=ErrorInfo(404, f"no instance {command.instance_id}", "not_found_error"))
            self._apply(InstanceDeleted(instance_id=command.instance_id))
            return CommandResult(cid)
        return CommandResult(cid)

    def open_chunks(self, task_id: TaskId) -> trio.MemoryReceiveChannel[Chunk]:
        self.log.append("open")
        send, receive = trio.open_memory_channel[Chunk](64)
        self.channels[task_id] = send
        return receive

    def close_chunks(self, task_id: TaskId) -> None:
        self.log.append("close")
        send = self.channels.pop(task_id, None)
        if send is not None:
            send.close()

    def event_times(self, since: int):
        return None  # this fake records no event times: /debug/event-times answers 404

    async def count_tokens(self, model_id: str, params: GenerationParams) -> int:
        """Fake tokenizer: 3 template tokens per message plus one per word."""
        if model_id not in self._state.model_cards:
            raise KeyError(model_id)
        return sum(3 + len(m.content.split()) for m in params.messages)

    async def read_from_hub(self, name: str) -> tuple[str, ErrorInfo | None]:
        return name, None  # no hub here: an unknown model stays unknown

    def previews(self, model_id: str, nodes: tuple[str, ...]) -> list[dict]:
        if model_id not in self._state.model_cards:
            raise KeyError(model_id)
        return [{"model": model_id, "sharding": "pipeline", "nodes": list(nodes) or [self.node_id]}]

    # -- helpers
    def _model_error(self, model_id: str) -> ErrorInfo | None:
        if model_id not in self._state.model_cards:
            return ErrorInfo(404, f"model '{model_id}' not found", "not_found_error", "model", "model_not_found")
        if model_id == UNPLACED:
            return ErrorInfo(409, f"model '{model_id}' is not placed; run: exo-p2p place {model_id}", code="model_not_placed")
        if model_id == LOADING:
            return ErrorInfo(503, f"model '{model_id}' is loading (3/30 layers)", "server_error", code="loading")
        return None

    def _apply(self, event: Any) -> None:
        self._state = apply(self._state, IndexedEvent(term=1, idx=self._state.last_event_idx + 1, event=event))

    def _place(self, command: PlaceInstance) -> CommandResult:
        cid = command.command_id
        model = self._state.model_cards.get(command.model_id)
        if model is None:
            return CommandResult(cid, error=ErrorInfo(404, f"model '{command.model_id}' not found", "not_found_error", "model"))
        if command.model_id == BIG:
            return CommandResult(cid, error=ErrorInfo(400, "insufficient memory: requires 1024.0 GiB, largest cycle has 16.0 GiB"))
        shard = ShardMetadata(
            node_id=self.node_id,
            runner_id=new_id(),
            rank=0,
            world_size=1,
            start_layer=0,
            end_layer=model.n_layers,
            n_layers=model.n_layers,
            share_bytes=model.storage_size,
            boot_id="boot-1",
        )
        instance = Instance(instance_id=new_id(), model_id=command.model_id, sharding=command.sharding, shards=(shard,))
        if self.place_lags:
            return CommandResult(cid, instance=instance)
        self._apply(InstanceCreated(instance=instance))
        self._apply(RunnerStatusUpdated(shard.runner_id, instance.instance_id, self.node_id, RunnerLoading(3, 30)))
        return CommandResult(cid, instance=instance, event_idx=self._state.last_event_idx)

    async def _feed(self, command: SubmitTask) -> None:
        if self.gate is not None:
            await self.gate.wait()
        for item in self.script(command):
            if command.task_id in self.cancelled:
                return
            if isinstance(item, float):
                await trio.sleep(item)
                continue
            send = self.channels.get(command.task_id)
            if send is None:
                return
            try:
                await send.send(item)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


Body = Callable[[httpx.AsyncClient, FakeMaster], Awaitable[None]]


def run_api(body: Body, *, timeout: float = 10.0, **app_kwargs: Any) -> None:
    """Run ``body(client, backend)`` against a fresh app over httpx's ASGI transport."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            app = create_app(backend, **app_kwargs)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                with trio.fail_after(timeout):
                    await body(client, backend)
            nursery.cancel_scope.cancel()

    trio.run(main)


def chat_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    body.update(overrides)
    return body


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body; asserts every event is one ``data:`` line."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [e[len("data: ") :] for e in events]


def null_keys(value: Any) -> set[str]:
    """Keys anywhere in ``value`` whose value is null."""
    found: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if v is None:
                found.add(k)
            found |= null_keys(v)
    elif isinstance(value, list):
        for v in value:
            found |= null_keys(v)
    return found


def all_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


def submits(backend: FakeMaster) -> list[SubmitTask]:
    return [c for c in backend.commands if isinstance(c, SubmitTask)]


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


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
        assert first == defaults and (first.client or "").startswith("peer:")  # exo_p2p.api.client_key
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
    ("image part", chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), "messages[0].content[0].type", "image_url"),
    ("max_tokens < 1", chat_body(max_tokens=0), "max_tokens", ">= 1"),
    ("max_completion_tokens < 1", chat_body(max_completion_tokens=-5), "max_completion_tokens", ">= 1"),
    ("max_tokens wrong type", chat_body(max_tokens="x"), "max_tokens", "got `str` - at `$.max_tokens`"),
    ("temperature < 0", chat_body(temperature=-0.1), "temperature", ">= 0"),
    ("temperature > 2", chat_body(temperature=2.5), "temperature", "<= 2"),
    ("top_p 0", chat_body(top_p=0), "top_p", "> 0"),
    ("n = 2", chat_body(n=2), "n", "'n'"),
    ("tool without a name", chat_body(tools=[{"type": "function", "function": {}}]), "tools[0].function.name", "name"),
    ("tool_choice without tools", chat_body(tool_choice="required"), "tool_choice", "needs tools"),
    ("logprobs", chat_body(logprobs=True), "logprobs", "'logprobs'"),
    ("top_logprobs", chat_body(top_logprobs=3), "top_logprobs", "'top_logprobs'"),
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


async def drive_asgi(app: Any, body: bytes, disconnect_when: Callable[[list[dict]], bool]) -> list[dict]:
    """Call ``app`` as a server would for ``POST /v1/chat/completions`` and answer
    ``http.disconnect`` once ``disconnect_when(sent_messages)`` holds (checked every 10 ms)."""
    sent: list[dict] = []
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        while not disconnect_when(sent):
            await trio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return sent


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


# ------------------------------------------------------------------ cluster endpoints


def test_models_state_and_nodes() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == sorted(backend.state().model_cards)
        entry = next(m for m in models["data"] if m["id"] == MODEL)
        c = backend.state().model_cards[MODEL]
        assert entry == {
            "id": MODEL,
            "object": "model",
            "created": entry["created"],
            "owned_by": "exo-p2p",
            "n_layers": 30,
            "storage_size": c.storage_size,
            "context_length": 8192,
            "tasks": ["generate"],  # a card from before kinds
        }
        local = (await client.get("/models")).json()
        assert local == [
            {
                "model": MODEL,
                "n_layers": 30,
                "storage_size": c.storage_size,
                "hidden_size": 576,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "context_length": 8192,
                "source": None,  # the fake backend cannot say
                "family": "llama",
                "quantization": "",
                "shardings": ["pipeline", "tensor"],
                "sharding_notes": {},
                "tasks": ["generate"],
            }
        ]
        await client.post("/instances", json={"model": MODEL})
        state = (await client.get("/state")).json()
        assert state["state_hash"] == state_hash(backend.state()) and len(state["state_hash"]) == 64
        assert state["last_event_idx"] == backend.state().last_event_idx == 2
        assert state["term"] == 1 and state["node_id"] == "node-a" and state["master"] == "node-a"
        assert state["warnings"] == ["no peers found for 12 s"] and state["counters"] == {"dropped": 3, "requests_moved": 0, "requests_move_failed": 0}
        assert set(state["instances"]) == set(backend.state().instances)
        assert msgspec.convert({k: state[k] for k in State.__struct_fields__}, State) == backend.state()
        nodes = (await client.get("/nodes")).json()
        assert nodes == [
            {
                "node_id": "node-a",
                "friendly_name": "box-a",
                "is_self": True,
                "is_master": True,
                "memory_total": 16 * 2**30,
                "memory_available": 8 * 2**30,
                "addrs": ["/ip4/127.0.0.1/tcp/52514/p2p/node-a"],
                "last_seen": 0.0,
                "links": [],
            }
        ]

    run_api(body)


def test_instances_crud_shapes() -> None:
    shard_keys = {"node_id", "runner_id", "rank", "start_layer", "end_layer", "share_bytes", "status", "weights_dtype",
                  "bytes_done", "bytes_total", "bytes_per_second", "bytes_from_peers",
                  "bytes_from_hub"}  # the last five: while downloading (docs/models.md)

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post("/instances", json={"model": "default", "min_nodes": 1, "sharding": "pipeline", "nodes": "node-a, ,b"})
        assert r.status_code == 201, r.text
        created = r.json()
        (place,) = [c for c in backend.commands if isinstance(c, PlaceInstance)]
        assert (place.model_id, place.min_nodes, place.sharding, place.nodes) == (MODEL, 1, "pipeline", ("node-a", "b"))
        assert set(created) == {"instance_id", "model", "sharding", "status", "reason", "layers_loaded", "layers_total", "shards",
                                "bytes_downloaded", "bytes_to_download", "bytes_from_peers", "bytes_from_hub"}
        assert (created["bytes_downloaded"], created["bytes_to_download"]) == (0, 0)
        assert created["shards"][0]["bytes_done"] is None
        assert (created["model"], created["sharding"], created["status"], created["reason"]) == (MODEL, "pipeline", "loading", None)
        assert (created["layers_loaded"], created["layers_total"]) == (3, 30)
        assert [set(s) for s in created["shards"]] == [shard_keys]
        assert created["shards"][0]["status"] == "loading" and created["shards"][0]["end_layer"] == 30
        listed = (await client.get("/instances")).json()
        assert listed == [created]
        one = await client.get(f"/instances/{created['instance_id']}")
        assert one.status_code == 200 and one.json() == created
        r = await client.post("/instances", json={"model": MODEL, "nodes": ["x", "y,z"]})
        assert r.status_code == 201
        assert [c for c in backend.commands if isinstance(c, PlaceInstance)][-1].nodes == ("x", "y", "z")
        deleted = await client.delete(f"/instances/{created['instance_id']}")
        assert deleted.status_code == 200 and deleted.json() == {"deleted": created["instance_id"]}
        assert_openai_error(await client.get(f"/instances/{created['instance_id']}"), 404)
        assert_openai_error(await client.delete(f"/instances/{created['instance_id']}"), 404)
        assert len((await client.get("/instances")).json()) == 1

    run_api(body, model_aliases={"default": MODEL})


def test_place_answered_before_the_instance_is_in_state_is_loading() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        backend.place_lags = True
        r = await client.post("/instances", json={"model": MODEL})
        assert r.status_code == 201
        view = r.json()
        assert (view["status"], view["layers_loaded"], view["layers_total"]) == ("loading", 0, 30)
        assert [s["status"] for s in view["shards"]] == ["pending"]
        assert backend.state().instances == {}

    run_api(body)


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        ({"model": "nope"}, 404, "not found"),
        ({"model": BIG}, 400, "insufficient memory"),
        ({"model": MODEL, "min_nodes": 0}, 400, "min_nodes"),
        ({"model": MODEL, "sharding": "diagonal"}, 400, "sharding"),
        ({"min_nodes": 2}, 400, "model"),
        ({"model": MODEL, "nodes": 5}, 400, "nodes"),
    ],
)
def test_place_errors(payload: dict, status: int, needle: str) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        error = assert_openai_error(await client.post("/instances", json=payload), status)
        assert needle in error["message"]
        assert backend.state().instances == {}

    run_api(body)


def test_previews() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.get("/instances/previews", params={"model": MODEL, "nodes": "a,b"})
        assert r.status_code == 200 and r.json() == [{"model": MODEL, "sharding": "pipeline", "nodes": ["a", "b"]}]
        assert_openai_error(await client.get("/instances/previews", params={"model": "nope"}), 404)
        assert assert_openai_error(await client.get("/instances/previews"), 400)["param"] == "model"

    run_api(body)


def test_unknown_path_wrong_method_and_internal_error_are_json() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        assert_openai_error(await client.get("/v2/nothing"), 404)
        r = await client.get("/v1/chat/completions")
        assert assert_openai_error(r, 405)["code"] == "method_not_allowed"
        assert "POST" in r.headers["allow"]
        backend.fail_state = True
        error = assert_openai_error(await client.get("/state"), 500)
        assert error["type"] == "server_error" and "secret" not in error["message"]
        backend.fail_state = False
        assert (await client.get("/state")).status_code == 200

    with structlog.testing.capture_logs() as events:
        run_api(body)
    logged = [e for e in events if e["event"] == "api.unhandled_error"]
    assert len(logged) == 1 and logged[0]["log_level"] == "error" and logged[0]["path"] == "/state"


def test_body_limit_413_without_reading_the_whole_body() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        big = b'{"model": "' + b"m" * 5000 + b'", "messages": []}'
        error = assert_openai_error(await client.post("/v1/chat/completions", content=big, headers=JSON), 413)
        assert "4096 bytes" in error["message"]
        pulled = 0

        async def chunked() -> Any:
            nonlocal pulled
            for _ in range(1000):
                pulled += 1
                yield b" " * 1000

        assert_openai_error(await client.post("/instances", content=chunked(), headers=JSON), 413)
        assert pulled < 10  # stopped reading at the limit, not after 1 MB
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200

    run_api(body, max_body_bytes=4096)


# --------------------------------------------------------------- real server + openai


def run_served(body: Callable[[str, FakeMaster], Awaitable[None]], timeout: float = 30.0, **app_kwargs: Any) -> None:
    """Run ``body(base_url, backend)`` against the app served by hypercorn on 127.0.0.1:0;
    the server is shut down through its ``shutdown_event`` and must return promptly."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            stop = trio.Event()
            done = trio.Event()

            async def run_server(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
                await serve(create_app(backend, **app_kwargs), "127.0.0.1", 0, task_status=task_status, shutdown_event=stop)
                done.set()

            port = await nursery.start(run_server)
            assert isinstance(port, int) and port > 0
            url = f"http://127.0.0.1:{port}"
            with trio.fail_after(timeout):
                await body(url, backend)
            stop.set()
            with trio.fail_after(10):
                await done.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.integration
def test_openai_client_against_real_server(caplog: pytest.LogCaptureFixture) -> None:
    openai = pytest.importorskip("openai")
    caplog.set_level(logging.INFO)

    def use_client(base_url: str) -> tuple[Any, list[Any]]:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=10)
        try:
            completion = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
            )
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            try:
                client.chat.completions.create(model=UNPLACED, messages=[{"role": "user", "content": "hi"}])
            except openai.ConflictError as exc:
                chunks.append(exc)
            return completion, chunks
        finally:
            client.close()

    async def body(url: str, backend: FakeMaster) -> None:
        completion, chunks = await trio.to_thread.run_sync(use_client, url)
        assert completion.choices[0].message.content == "".join(TOKENS)
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.completion_tokens == len(TOKENS)
        conflict = chunks.pop()
        assert conflict.status_code == 409
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(TOKENS)
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert chunks[-1].usage.total_tokens == 12 + len(TOKENS)

    run_served(body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


@pytest.mark.integration
def test_real_server_disconnect_cancels_generation() -> None:
    async def body(url: str, backend: FakeMaster) -> None:
        backend.script = lambda cmd: reply_script(cmd.task_id, ["tok"] * 500, delay=0.02)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
                assert r.status_code == 200
                async with aclosing(r.aiter_lines()) as lines:
                    async for line in lines:
                        if '"tok"' in line:
                            break
        with trio.fail_after(5):
            await backend.cancel_seen.wait()
        (submit,) = submits(backend)
        assert backend.cancelled == {submit.task_id}
        with trio.fail_after(5):
            while submit.task_id in backend.channels:
                await trio.sleep(0.01)
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            assert (await client.get("/state")).status_code == 200

    run_served(body)


@pytest.mark.integration
def test_bind_failure_is_a_clear_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        app = create_app(FakeMaster(None))  # type: ignore[arg-type]  # never generates
        with pytest.raises(ApiBindError) as info:
            trio.run(serve, app, "127.0.0.1", port)
        assert isinstance(info.value, OSError)
        assert str(info.value) == f"port {port} on 127.0.0.1 is in use"


@pytest.mark.integration
def test_real_server_413_then_keeps_serving() -> None:
    async def body(url: str, backend: FakeMaster) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            r = await client.post("/v1/chat/completions", content=b"x" * 10_000_000, headers=JSON)
            assert assert_openai_error(r, 413)["code"] == "request_too_large"
            r = await client.post("/v1/chat/completions", content=b'{"model": "\xff", "messages": []}', headers=JSON)
            assert "UTF-8" in assert_openai_error(r, 400)["message"]
            assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200

    run_served(body)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["shutdown_event", "cancel"])
def test_shutdown_with_a_stream_open_is_quiet_and_cancels_it(
    how: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            backend = FakeMaster(nursery)
            backend.script = lambda cmd: reply_script(cmd.task_id, ["tok"] * 2000, delay=0.01)
            stop = trio.Event()
            returned = trio.Event()

            async def run_server(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
                with trio.CancelScope() as scope:
                    server_scope.append(scope)
                    app = create_app(backend)
                    await serve(app, "127.0.0.1", 0, task_status=task_status, shutdown_event=stop, graceful_timeout=0.5)
                returned.set()

            server_scope: list[trio.CancelScope] = []
            url = f"http://127.0.0.1:{await nursery.start(run_server)}"
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                async with client.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
                    async with aclosing(r.aiter_lines()) as lines:
                        async for line in lines:
                            if '"tok"' in line:
                                break
                    t0 = trio.current_time()
                    if how == "cancel":
                        server_scope[0].cancel()
                    else:
                        stop.set()
                    with trio.fail_after(5):
                        await returned.wait()
                    assert trio.current_time() - t0 < 3.0
            assert len(backend.cancelled) == 1 and not backend.channels
            nursery.cancel_scope.cancel()

    with structlog.testing.capture_logs() as events:
        trio.run(main)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [(r.name, r.getMessage()) for r in errors]
    assert not [e for e in events if e["log_level"] in ("error", "critical", "exception")], events
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
