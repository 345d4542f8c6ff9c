"""The bounds of what one API request may carry into the cluster (``exo_p2p.api.bounds``):
stop strings, logit bias, node filters, model names and the encoded command as a whole are
refused past their limits with a 400 in each family's error shape, before anything is sent to
the master (``count_tokens``: tests/test_count_tokens_bounds.py). In process, with
the fake backend of ``tests/test_api.py`` (no socket, no process: the unit tier)."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
import trio

from exo_p2p.api import create_app
from exo_p2p.api.bounds import (
    MAX_COMMAND_BYTES,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_NODE_NAME_CHARS,
    MAX_NODE_NAMES,
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
)
from exo_p2p.api.schemas import MAX_NAME_CHARS
from exo_p2p.cluster.sequencing import first_batch
from exo_p2p.net.config import GossipParams, NetConfig
from exo_p2p.types import ChatMessage, GenerationParams, IndexedEvent, PlaceInstance, SubmitTask, TaskCreated, TextGeneration
from tests.support.family_errors import family_error

try:
    from tests.support.fake_master import MODEL, FakeMaster, run_api, submits
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from test_api import MODEL, FakeMaster, run_api, submits  # type: ignore[no-redef]


def _chat(text: str, stop: Any = None) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}]} | ({} if stop is None else {"stop": stop})


def _completion(text: str, stop: Any = None) -> dict[str, Any]:
    return {"model": MODEL, "prompt": text} | ({} if stop is None else {"stop": stop})


def _anthropic(text: str, stop: Any = None) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
    return body | ({} if stop is None else {"stop_sequences": stop})


def _ollama(key: str, text: str, stop: Any = None) -> dict[str, Any]:
    body = {"model": MODEL, "stream": False, key: [{"role": "user", "content": text}] if key == "messages" else text}
    return body | ({} if stop is None else {"options": {"stop": stop}})


GENERATIONS = {
    "/v1/chat/completions": (_chat, "stop"),
    "/v1/completions": (_completion, "stop"),
    "/v1/responses": (lambda text, stop=None: {"model": MODEL, "input": text}, None),
    "/v1/messages": (_anthropic, "stop_sequences"),
    "/api/chat": (lambda text, stop=None: _ollama("messages", text, stop), "options.stop"),
    "/api/generate": (lambda text, stop=None: _ollama("prompt", text, stop), "options.stop"),
}
"""Every generation endpoint: its body for a text and stop strings, and its stop field."""
STOPPABLE = [path for path, (_, field) in GENERATIONS.items() if field]


@pytest.mark.parametrize("path", STOPPABLE)
def test_stop_strings_past_their_count_or_bytes_are_a_400_and_nothing_is_submitted(path: str) -> None:
    make, field = GENERATIONS[path]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        too_many = [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]
        message, param = family_error(await client.post(path, json=make("hi", too_many)), 400)
        assert f"{field} has {MAX_STOP_STRINGS + 1} stop strings" in message
        assert param == field or not path.startswith("/v1/c")  # the OpenAI shape names it
        too_long = ["ok", "é" * (MAX_STOP_BYTES // 2) + "x"]  # 257 bytes, 129 characters
        message, param = family_error(await client.post(path, json=make("hi", too_long)), 400)
        assert f"{field}[1] is {MAX_STOP_BYTES + 1} bytes" in message
        assert param == f"{field}[1]" or not path.startswith("/v1/c")
        assert not submits(backend)
        at_limit = [f"{i:02d}" + "é" * ((MAX_STOP_BYTES - 2) // 2) for i in range(MAX_STOP_STRINGS)]
        assert (await client.post(path, json=make("hi", at_limit))).status_code == 200
        assert submits(backend)[-1].params.stop == tuple(at_limit)

    run_api(body)


@pytest.mark.parametrize("path", list(GENERATIONS))
def test_a_generation_whose_command_exceeds_the_bound_is_a_400_in_its_family_shape(path: str) -> None:
    """The prompt has no bound of its own: the encoded ``SubmitTask`` has."""
    make = GENERATIONS[path][0]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        r = await client.post(path, json=make("x" * MAX_COMMAND_BYTES))
        message, _ = family_error(r, 400)
        assert f"limit of {MAX_COMMAND_BYTES} bytes" in message and "replicated" in message
        if path.startswith("/v1/") and not path.startswith("/v1/messages"):
            assert r.json()["error"]["code"] == "request_too_large"
        assert r.headers["x-should-retry"] == "false"
        assert not submits(backend) and not backend.channels
        assert (await client.post(path, json=make("x" * (MAX_COMMAND_BYTES - 1024)))).status_code == 200
        (accepted,) = submits(backend)
        assert len(msgspec.msgpack.encode(accepted)) <= MAX_COMMAND_BYTES

    run_api(body)


def test_the_command_bound_keeps_the_largest_task_well_below_the_gossip_and_frame_limits() -> None:
    """The largest accepted command's ``TaskCreated`` event, as the master sequences it, is
    published as one gossip message of at most a quarter of the payload limit plus its
    envelope, and is 1/512 of a request frame."""
    gossip, frame = GossipParams().max_payload_bytes, NetConfig.__dataclass_fields__["max_frame_bytes"].default
    assert MAX_COMMAND_BYTES * 4 <= gossip and MAX_COMMAND_BYTES * 512 <= frame
    submit = SubmitTask.generation(command_id="c" * 36, task_id="t" * 36, model_id=MODEL, api_node_id="n" * 52,  # type: ignore[arg-type]
                              params=GenerationParams(messages=(ChatMessage("user", "x" * (MAX_COMMAND_BYTES - 1024)),)))
    assert len(msgspec.msgpack.encode(submit)) <= MAX_COMMAND_BYTES
    task = TextGeneration(task_id=submit.task_id, instance_id="i" * 36, model_id=submit.model_id,  # type: ignore[arg-type]
                          params=submit.params, api_node_id=submit.api_node_id, created_idx=2**40)
    event = IndexedEvent(term=2**31, idx=2**40, event=TaskCreated(task=task))
    n, data = first_batch([event], 64, gossip)
    assert n == 1 and len(data) <= MAX_COMMAND_BYTES + 256 <= gossip // 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_logit_bias_keys_of_thousands_of_digits_and_too_many_entries_are_a_400(path: str) -> None:
    make = GENERATIONS[path][0]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for bias in ({"9" * 5000: 1}, {"0" * 4400 + "5": 1}, {str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)}):
            message, param = family_error(await client.post(path, json=make("hi") | {"logit_bias": bias}), 400)
            assert param == "logit_bias" and len(message) < 500
        assert not submits(backend)
        bias = {str(i): -100 for i in range(MAX_LOGIT_BIAS_ENTRIES)}
        assert (await client.post(path, json=make("hi") | {"logit_bias": bias})).status_code == 200
        assert len(submits(backend)[0].params.logit_bias) == MAX_LOGIT_BIAS_ENTRIES

    run_api(body)


@pytest.mark.parametrize("option", ["temperature", "top_k", "seed", "num_predict", "repeat_last_n"])
def test_an_ollama_option_of_hundreds_of_digits_is_a_400_not_a_500(option: str) -> None:
    """JSON integers of a few hundred digits decode; no float holds them."""

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        for path in ("/api/chat", "/api/generate"):
            for value in (10**400, -(10**400)):
                message, _ = family_error(await client.post(path, json=GENERATIONS[path][0]("hi") | {"options": {option: value}}), 400)
                assert f"options.{option}" in message
        assert not submits(backend)

    run_api(body)


@pytest.mark.parametrize("path", list(GENERATIONS))
def test_a_model_name_past_its_bound_is_a_400(path: str) -> None:
    make = GENERATIONS[path][0]

    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        family_error(await client.post(path, json=make("hi") | {"model": "m" * (MAX_NAME_CHARS + 1)}), 400)
        family_error(await client.post("/instances", json={"model": "m" * (MAX_NAME_CHARS + 1)}), 400)
        assert not backend.commands

    run_api(body)


@pytest.mark.parametrize("nodes", ["", " ", ",", ", ,", [], [""], [",", " "]])
def test_a_nodes_filter_that_names_no_node_is_a_400_not_any_node(nodes: Any) -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        _, param = family_error(await client.post("/instances", json={"model": MODEL, "nodes": nodes}), 400)
        assert param == "nodes" and not backend.commands and not backend.state().instances
        if isinstance(nodes, str):
            _, param = family_error(await client.get("/instances/previews", params={"model": MODEL, "nodes": nodes}), 400)
            assert param == "nodes"

    run_api(body)


def test_a_nodes_filter_is_bounded_in_names_and_characters_and_still_works() -> None:
    async def body(client: httpx.AsyncClient, backend: FakeMaster) -> None:
        many = ",".join(f"n{i}" for i in range(MAX_NODE_NAMES + 1))
        for nodes in (many, ["a", "x" * (MAX_NODE_NAME_CHARS + 1)]):
            assert family_error(await client.post("/instances", json={"model": MODEL, "nodes": nodes}), 400)[1] == "nodes"
        assert family_error(await client.get("/instances/previews", params={"model": MODEL, "nodes": many}), 400)[1] == "nodes"
        assert not backend.commands
        assert (await client.post("/instances", json={"model": MODEL, "nodes": " a, b,,"})).status_code == 201
        assert [c.nodes for c in backend.commands if isinstance(c, PlaceInstance)] == [("a", "b")]
        r = await client.get("/instances/previews", params={"model": MODEL, "nodes": "a,,b"})
        assert r.status_code == 200 and r.json()[0]["nodes"] == ["a", "b"]
        r = await client.get("/instances/previews", params={"model": MODEL})  # no filter at all: any node
        assert r.status_code == 200 and r.json()[0]["nodes"] == [backend.node_id]

    run_api(body)


@pytest.mark.parametrize(("declared", "status"), [("²", 200), ("9" * 5000, 413), ("0" * 5000 + "12", 200), ("12x", 200),
                                                  ("-1", 200), (str(8 * 1024 * 1024 + 1), 413)])
def test_a_content_length_header_that_is_no_number_or_thousands_of_digits_is_never_a_500(declared: str, status: int) -> None:
    """Sent straight to the ASGI app (a server may refuse such a header itself)."""
    body = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "hi"}]}'

    async def main() -> list[dict]:
        async with trio.open_nursery() as nursery:
            app = create_app(FakeMaster(nursery))
            sent: list[dict] = []
            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                "headers": [(b"content-type", b"application/json"), (b"content-length", declared.encode("latin-1"))],
                "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
            }  # fmt: skip
            messages = iter([{"type": "http.request", "body": body, "more_body": False}])

            async def receive() -> dict:
                for message in messages:
                    return message
                await trio.sleep_forever()  # the client stays connected

            async def send(message: dict) -> None:
                sent.append(message)

            with trio.fail_after(10):
                await app(scope, receive, send)
            nursery.cancel_scope.cancel()
        return sent

    start = next(m for m in trio.run(main) if m["type"] == "http.response.start")
    assert start["status"] == status
