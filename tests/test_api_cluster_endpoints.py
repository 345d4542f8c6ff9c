"""The cluster endpoints of the API against a fake master (docs/api.md): ``/v1/models``,
``/models``, ``/state``, ``/nodes``, ``/instances`` and its previews; and the app's JSON answers
to unknown paths, wrong methods, internal errors and bodies over the limit.
"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
import structlog
import structlog.testing

from exo_p2p.state import state_hash
from exo_p2p.types import PlaceInstance, State
from tests.support.fake_master import BIG, FakeMaster, JSON, MODEL, assert_openai_error, chat_body, run_api


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
            "capabilities": [],  # text only
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
                "capabilities": [],
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
                "speed": None,  # not measured (docs/placement-speed.md)
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
                                "bytes_downloaded", "bytes_to_download", "bytes_from_peers", "bytes_from_hub",
                                "keep_alive", "last_used", "expires_at", "pinned", "on_demand"}
        assert (created["keep_alive"], created["expires_at"], created["pinned"]) == (None, None, False)  # by hand: until deleted
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
