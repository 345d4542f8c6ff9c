"""A fake master behind a real API app: scripted chunks for each submitted generation, the
ASGI and served drivers, and the request and SSE helpers the API tests share.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio

from exo_p2p.api import NodeHealth, NodeSummary, create_app, serve
from exo_p2p.state import apply
from exo_p2p.types import CancelGeneration, Chunk, Command, CommandResult, DeleteInstance, ErrorInfo, FinishChunk, GenerationParams, IndexedEvent, Instance, InstanceCreated, InstanceDeleted, ModelCard, NodeId, PlaceInstance, PrefillProgressChunk, RunnerLoading, RunnerStatusUpdated, ShardMetadata, State, SubmitTask, TaskId, TokenChunk, new_id


MODEL = "smollm2-135m-instruct"
UNPLACED = "unplaced-model"
LOADING = "loading-model"
BIG = "huge-model"
TOKENS = ["Paris", " is", "", " the", " capital", "."]
"""The default scripted reply; the empty token must never become an SSE event."""
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
