"""A fake node API for the CLI tests (docs/cli.md), served on 127.0.0.1 from a stdlib HTTP
server in a thread; run as a script (``python tests/support/fake_node.py --api-port N
--data-dir D``) it is the stand-in node process for ``exo-p2p run``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest


GIB = 1024**3
SELF_ID = "12D3KooWSelfSelfSelfSelfSelfSelfSelfSelfSelfSelfSelf"
PEER_ID = "12D3KooWPeerPeerPeerPeerPeerPeerPeerPeerPeerPeerPeer"


class FakeNode:
    """The state behind the fake API. Instances load ``layers_per_poll`` layers per
    ``GET /instances/{id}``; ``fail_reason`` fails them on the first poll instead."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict, object]] = []
        self.instances: dict[str, dict] = {}
        self.layers_total = 30
        self.layers_per_poll = 10
        self.fail_reason: str | None = None
        self.place_error: tuple[int, str] | None = None
        self.chat_tokens = ["The capital", " of France", " is Paris", "."]
        self.chat_error_after: int | None = None
        self.warnings = ["no peers found for 12 s"]
        self.next_id = 0
        self.finish_reason = "stop"
        self.warmup_polls = 0  # polls a fully loaded instance stays "warming_up" before ready
        self.unsupported: list[dict] = []  # GET /models/unsupported
        self.place_unconfirmed = False  # POST /instances places, but answers the master's 503 "not confirmed"
        self.strict_models = False  # chat and embeddings of a model not in models(): 404 as a real node's
        self.mdns: bool | None = None  # GET /state's "mdns" (None: left out, as a node from before it)

    # -- routes -------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "node_id": SELF_ID,
            "master": SELF_ID,
            "warnings": list(self.warnings),
            "state_hash": "ab" * 32,
            "last_event_idx": 7,
            **({} if self.mdns is None else {"mdns": self.mdns}),
        }

    def nodes(self) -> list[dict]:
        return [
            {
                "node_id": SELF_ID,
                "friendly_name": "alpha",
                "is_self": True,
                "is_master": True,
                "memory_total": 16 * GIB,
                "memory_available": 6 * GIB,
                "addrs": [f"/ip4/127.0.0.1/tcp/52514/p2p/{SELF_ID}"],
                "last_seen": 0.0,
            },
            {
                "node_id": PEER_ID,
                "friendly_name": "beta",
                "is_self": False,
                "is_master": False,
                "memory_total": 8 * GIB,
                "memory_available": None,
                "addrs": [f"/ip4/127.0.0.2/tcp/52514/p2p/{PEER_ID}"],
                "last_seen": 2.5,
            },
        ]

    def models(self) -> list[dict]:
        return [
            {
                "model": "smollm2-135m-instruct",
                "n_layers": 30,
                "storage_size": 108_000_000,
                "hidden_size": 576,
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "context_length": 8192,
            }
        ]

    def previews(self) -> list[dict]:
        return [
            {
                "sharding": "pipeline",
                "world_size": 1,
                "nodes": [SELF_ID],
                "layers": [[0, 30]],
                "bytes": [118_800_000],
                "error": None,
            },
            {
                "sharding": "tensor",
                "world_size": 2,
                "nodes": [],
                "layers": [],
                "bytes": [],
                "error": "tensor sharding needs 9 heads divisible by 2",
            },
        ]

    def place(self, body: dict) -> tuple[int, object]:
        if self.place_error:
            status, message = self.place_error
            return status, _error(message)
        self.next_id += 1
        instance_id = f"inst{self.next_id:04d}-{body['model']}"
        inst = {
            "instance_id": instance_id,
            "model": body["model"],
            "sharding": body.get("sharding", "pipeline"),
            "status": "loading",
            "reason": None,
            "layers_loaded": 0,
            "layers_total": self.layers_total,
            "shards": [
                {
                    "node_id": SELF_ID,
                    "runner_id": f"runner-{self.next_id}",
                    "rank": 0,
                    "start_layer": 0,
                    "end_layer": self.layers_total,
                    "share_bytes": 118_800_000,
                    "status": "loading",
                }
            ],
        }
        self.instances[instance_id] = inst
        if self.place_unconfirmed:  # placed, but the master's answer came before the cluster confirmed it
            return 503, _error("the cluster did not confirm the change within 10 s; retry")
        return 201, inst

    def poll(self, instance_id: str) -> tuple[int, object]:
        inst = self.instances.get(instance_id)
        if inst is None:
            return 404, _error(f"no instance {instance_id}")
        if inst["status"] == "loading":
            if self.fail_reason:
                inst.update(status="failed", reason=self.fail_reason)
            else:
                loaded = min(inst["layers_total"], inst["layers_loaded"] + self.layers_per_poll)
                inst["layers_loaded"] = loaded
                warming = inst.setdefault("_warmup_left", self.warmup_polls)
                if loaded == inst["layers_total"] and warming > 0:
                    inst["_warmup_left"] -= 1
                    for shard in inst["shards"]:
                        shard["status"] = "warming_up"
                elif loaded == inst["layers_total"]:
                    inst["status"] = "ready"
                    for shard in inst["shards"]:
                        shard["status"] = "ready"
        return 200, inst

    def delete(self, instance_id: str) -> tuple[int, object]:
        if self.instances.pop(instance_id, None) is None:
            return 404, _error(f"no instance {instance_id}")
        return 200, {"instance_id": instance_id, "deleted": True}

    def sse_events(self, body: dict) -> list[str]:
        events = []
        for i, token in enumerate(self.chat_tokens):
            if self.chat_error_after is not None and i == self.chat_error_after:
                events.append(json.dumps(_error("runner died while generating")))
                return events
            chunk = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": {"content": token}}],
            }
            events.append(json.dumps(chunk))
        final = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": self.finish_reason}],
        }
        return events + [json.dumps(final), "[DONE]"]


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def make_handler(node: FakeNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            path = url.path
            with node.lock:
                node.requests.append((method, path, query, body))
                if method == "GET" and path == "/state":
                    return self._send(200, node.state())
                if method == "GET" and path == "/nodes":
                    return self._send(200, node.nodes())
                if method == "GET" and path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": m["model"]} for m in node.models()]})
                if method == "GET" and path == "/models":
                    return self._send(200, node.models())
                if method == "GET" and path == "/models/unsupported":
                    return self._send(200, node.unsupported)
                if method == "GET" and path == "/instances":
                    return self._send(200, list(node.instances.values()))
                if method == "GET" and path == "/instances/previews":
                    if query.get("model") not in {m["model"] for m in node.models()}:
                        return self._send(404, _error(f"unknown model {query.get('model')}"))
                    return self._send(200, node.previews())
                if method == "GET" and path.startswith("/instances/"):
                    return self._send(*node.poll(path.removeprefix("/instances/")))
                if method == "POST" and path == "/instances":
                    return self._send(*node.place(body))
                if method == "DELETE" and path.startswith("/instances/"):
                    return self._send(*node.delete(path.removeprefix("/instances/")))
                known = sorted(m["model"] for m in node.models())
                if node.strict_models and path in ("/v1/chat/completions", "/v1/embeddings") and body.get("model") not in known:
                    return self._send(404, _error(f"unknown model {body.get('model')}" + (
                        f"; models in the cluster: {', '.join(known)}" if "chat" in path else "")))  # the master's, a route's
                if method == "POST" and path == "/v1/chat/completions":
                    events = node.sse_events(body)
                else:
                    return self._send(404, _error(f"no route {method} {path}"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.005)
            self.close_connection = True

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    return Handler


class Served:
    """A ``FakeNode`` served on 127.0.0.1 in a thread; ``close()`` stops and frees it."""

    def __init__(self, port: int = 0) -> None:
        self.node = FakeNode()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(self.node))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _, _ in self.node.requests if method in (None, m)]


@pytest.fixture
def served():
    s = Served()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    from exo_p2p.cli.placement import waiting

    monkeypatch.setattr(waiting, "POLL_INTERVAL", 0.01)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def invoke(args: list[str], env: dict | None = None, input: str | None = None):
    """Run the CLI in-process; no ``EXO_P2P_API`` from the outer environment; wide tables."""
    from typer.testing import CliRunner

    from exo_p2p.cli.main import app

    full_env = {"EXO_P2P_API": None, "COLUMNS": "200", **(env or {})}
    return CliRunner().invoke(app, args, env=full_env, input=input, catch_exceptions=False)


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def _serve_as_node(argv: list[str]) -> None:
    """``--api-port N --data-dir D``: serve a ``FakeNode`` on 127.0.0.1:N until SIGTERM,
    logging requests to stdout and writing its pid to D/fake-node.pid."""
    port = int(argv[argv.index("--api-port") + 1])
    data_dir = Path(argv[argv.index("--data-dir") + 1])
    (data_dir / "fake-node.pid").write_text(str(os.getpid()))
    time.sleep(0.3)  # the CLI must wait for the API to come up
    served = Served(port)
    if "--stall" in argv:
        served.node.layers_per_poll = 0

    class Logged(list):
        def append(self, item):  # type: ignore[override]
            print(item[0], item[1], flush=True)
            super().append(item)

    served.node.requests = Logged()
    served.thread.join()


if __name__ == "__main__":
    _serve_as_node(sys.argv[1:])
