"""The ``exo-p2p`` CLI against a fake node API served on 127.0.0.1 (docs/cli.md).

The fake API (``FakeNode``) speaks the node's HTTP API (``/nodes``, ``/models``, ``/state``,
``/instances``, ``/instances/previews``, ``/v1/chat/completions`` with SSE) from a stdlib
HTTP server in a thread, records every request and lets a test script placement errors,
loading progress and failures. Run as a script (``python test_cli.py --api-port N
--data-dir D``) it is the stand-in node process for ``exo-p2p run``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

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

    # -- routes -------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "node_id": SELF_ID,
            "master": SELF_ID,
            "warnings": list(self.warnings),
            "state_hash": "ab" * 32,
            "last_event_idx": 7,
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


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def served():
    s = Served()
    yield s
    s.close()


@pytest.fixture
def served2():
    s = Served()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    from exo_p2p.cli import waiting

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


# -- --api resolution -----------------------------------------------------------------------


def _probe(server) -> list[str]:
    """Paths a node was asked, less the cluster-wide and unsupported models lists `models` also
    asks for."""
    return [p for p in server.paths() if p not in ("/models/cluster", "/models/unsupported")]


@pytest.mark.integration
def test_api_flag_before_and_after_subcommand_and_env(served, served2):
    assert invoke(["--api", served.url, "models"]).exit_code == 0
    assert _probe(served) == ["/models"] and _probe(served2) == []

    assert invoke(["models", "--api", served2.url]).exit_code == 0
    assert _probe(served2) == ["/models"] and _probe(served) == ["/models"]

    assert invoke(["models"], env={"EXO_P2P_API": served.url}).exit_code == 0
    assert _probe(served) == ["/models", "/models"]

    # an explicit flag wins over the environment; after the subcommand wins over before it
    assert invoke(["models", "--api", served2.url], env={"EXO_P2P_API": served.url}).exit_code == 0
    assert invoke(["--api", served.url, "models", "--api", served2.url]).exit_code == 0
    assert _probe(served) == ["/models", "/models"]
    assert _probe(served2) == ["/models"] * 3


@pytest.mark.integration
def test_api_without_scheme_is_accepted(served):
    hostport = served.url.removeprefix("http://")
    result = invoke(["instances", "--api", hostport, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []


# -- --json ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_nodes_json_is_only_json_with_fields_and_warnings_on_stderr(served):
    result = invoke(["nodes", "--json", "--api", served.url])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [n["node_id"] for n in listed] == [SELF_ID, PEER_ID]
    for n in listed:
        assert {"node_id", "is_self", "is_master", "memory_total", "memory_available", "addrs"} <= n.keys()
    assert listed[0]["memory_total"] == 16 * GIB and listed[0]["is_self"] is True
    assert listed[1]["memory_available"] is None
    assert "warning: no peers found for 12 s" in result.stderr
    assert "no peers" not in result.stdout


@pytest.mark.integration
def test_instances_json_fields(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    result = invoke(["instances", "--json", "--api", served.url])
    assert result.exit_code == 0, result.output
    (inst,) = json.loads(result.stdout)
    assert {"instance_id", "model", "status", "shards"} <= inst.keys()
    assert inst["status"] == "loading" and inst["model"] == "smollm2-135m-instruct"
    (shard,) = inst["shards"]
    assert {"node_id", "rank", "start_layer", "end_layer"} <= shard.keys()
    assert (shard["rank"], shard["start_layer"], shard["end_layer"]) == (0, 0, 30)


@pytest.mark.integration
def test_models_json_fields(served):
    result = invoke(["models", "--json", "--api", served.url])
    assert result.exit_code == 0, result.output
    (model,) = json.loads(result.stdout)
    assert {"model", "n_layers", "storage_size"} <= model.keys()
    assert (model["model"], model["n_layers"], model["storage_size"]) == ("smollm2-135m-instruct", 30, 108_000_000)


@pytest.mark.integration
def test_previews_json_passes_model_and_nodes(served):
    result = invoke(["previews", "smollm2-135m-instruct", "--nodes", "alpha, beta", "--json", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert [p["sharding"] for p in json.loads(result.stdout)] == ["pipeline", "tensor"]
    (query,) = [q for m, p, q, _ in served.node.requests if p == "/instances/previews"]
    assert query == {"model": "smollm2-135m-instruct", "nodes": "alpha,beta"}


# -- human output ---------------------------------------------------------------------------


@pytest.mark.integration
def test_nodes_table_shows_gib_master_and_warning(served):
    result = invoke(["nodes", "--api", served.url])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert SELF_ID[:16] + "…" in out
    assert f"  beta  /ip4/127.0.0.2/tcp/52514/p2p/{PEER_ID}\n" in out  # whole, for --bootstrap
    assert "6.0 GiB / 16.0 GiB" in out and "unknown / 8.0 GiB" in out
    assert "alpha (this node)" in out and "2 s ago" in out and "now" in out
    assert "*" in out
    assert result.stderr.strip() == "warning: no peers found for 12 s"


@pytest.mark.integration
def test_previews_table_shows_placement_or_why_not(served):
    result = invoke(["previews", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert "not possible: tensor sharding needs 9 heads divisible by 2" in result.stdout
    assert "alpha: layers [0, 30), 113.3 MiB" in result.stdout


@pytest.mark.integration
def test_models_lists_what_the_node_cannot_serve_with_the_reason(served):
    served.node.unsupported = [{"model": "odd", "source": "dir", "path": "/m/odd.gguf",
                                "reason": "GGUF tensor type IQ2_XXS is not supported"}]
    table = invoke(["models", "--api", served.url])
    assert table.exit_code == 0 and "cannot serve" in table.stdout
    assert "odd" in table.stdout and "IQ2_XXS is not supported" in table.stdout
    listed = invoke(["models", "--json", "--api", served.url])
    assert listed.exit_code == 0
    rows = {m["model"]: m for m in json.loads(listed.stdout)}
    assert "IQ2_XXS is not supported" in rows["odd"]["unsupported"] and "smollm2-135m-instruct" in rows


@pytest.mark.integration
def test_models_and_instances_tables(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    models = invoke(["models", "--api", served.url])
    assert models.exit_code == 0 and "smollm2-135m-instruct" in models.stdout and "103.0 MiB" in models.stdout
    insts = invoke(["instances", "--api", served.url])
    assert insts.exit_code == 0, insts.output
    assert "loading 0/30 layers" in insts.stdout
    assert "rank 0: alpha layers [0, 30)" in insts.stdout


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_unreachable_node_is_one_line_and_exit_1():
    url = f"http://127.0.0.1:{closed_port()}"
    for args in (["nodes", "--api", url], ["--api", url, "instances", "--json"], ["chat", "hi", "--api", url]):
        result = invoke(args)
        assert result.exit_code == 1
        assert result.stdout == ""
        assert error_lines(result) == [
            f"error: cannot reach the exo-p2p node at {url}: connection refused "
            "(start one with `exo-p2p node`)"
        ]


@pytest.mark.integration
def test_unreachable_node_in_a_real_process_has_no_traceback():
    url = f"http://127.0.0.1:{closed_port()}"
    env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
    proc = subprocess.run(
        [sys.executable, "-m", "exo_p2p", "--api", url, "nodes"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot reach the exo-p2p node at {url}: connection refused (start one with `exo-p2p node`)"
    ]


@pytest.mark.integration
def test_real_process_json_via_env(served):
    env = {**os.environ, "EXO_P2P_API": served.url}
    proc = subprocess.run(
        [sys.executable, "-m", "exo_p2p", "models", "--json"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["model"] == "smollm2-135m-instruct"


@pytest.mark.integration
def test_api_400_prints_message_and_exits_1(served):
    message = (
        "needs 33.0 GiB (35433480192 bytes: 30.0 GiB + 10%); the largest candidate cycle "
        "(node-a, node-b) has 24.0 GiB (25769803776 bytes)"
    )
    served.node.place_error = (400, message)
    result = invoke(["place", "big-model", "--min-nodes", "2", "--sharding", "tensor", "--nodes", "a,b", "--api", served.url])
    assert result.exit_code == 1
    assert error_lines(result) == [f"error: {message}"]
    (body,) = [b for m, p, _, b in served.node.requests if m == "POST"]
    assert body == {"model": "big-model", "min_nodes": 2, "sharding": "tensor", "nodes": ["a", "b"]}
    assert served.node.instances == {}


@pytest.mark.integration
def test_bad_sharding_is_a_usage_error(served):
    result = invoke(["place", "m", "--sharding", "diagonal", "--api", served.url])
    assert result.exit_code == 2
    assert served.paths() == []


def test_bad_memory_limit_exits_2_with_one_line(monkeypatch):
    from exo_p2p.cli import cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    result = invoke(["node", "--memory-limit", "12 potatoes"])
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line.startswith("error: --memory-limit: invalid size '12 potatoes'")
    assert started == []


def test_node_flags_build_the_config(monkeypatch, tmp_path):
    from exo_p2p.cli import cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    secret = tmp_path / "secret"
    secret.write_text("00" * 32)
    args = [
        "node", "--api-port", "6000", "--api-host", "0.0.0.0", "--listen-port", "0",
        "--listen-host", "127.0.0.1", "--data-dir", str(tmp_path / "d"), "--memory-limit", "512MiB",
        "--models-dir", str(tmp_path / "m1"), "--models-dir", str(tmp_path / "m2"),
        "--log-format", "json", "--log-level", "DEBUG", "--cluster", "lab",
        "--cluster-secret", str(secret), "--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGsG9UpqnLmq5B4zrznCrWuMJehSwkNutRzKTM4hkPbfM",
        "--bootstrap", "/ip4/127.0.0.1/tcp/2/p2p/12D3KooWK1tzYBDEUQtJqjQw6LkzigCF17xp3jneLr4QbNEJbt8s", "--priority", "3", "--new-identity",
        "--name", "gamma", "--queue-limit", "8", "--prefill-chunk-size", "64", "--no-mdns",
    ]  # fmt: skip
    result = invoke(args)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.api_port == 6000 and config.api_host == "0.0.0.0"
    assert config.listen_port == 0 and config.listen_host == "127.0.0.1"
    assert config.data_dir == tmp_path / "d"
    assert config.memory_limit == 512 * 1024**2
    assert config.models_dirs == [tmp_path / "m1", tmp_path / "m2"]
    assert (config.log_format, config.log_level, config.cluster) == ("json", "debug", "lab")
    assert config.cluster_secret_file == secret
    assert config.bootstrap == ["/ip4/127.0.0.1/tcp/1/p2p/12D3KooWGsG9UpqnLmq5B4zrznCrWuMJehSwkNutRzKTM4hkPbfM", "/ip4/127.0.0.1/tcp/2/p2p/12D3KooWK1tzYBDEUQtJqjQw6LkzigCF17xp3jneLr4QbNEJbt8s"]
    assert (config.priority, config.new_identity, config.friendly_name) == (3, True, "gamma")
    assert (config.queue_limit, config.engine.prefill_chunk_size, config.mdns) == (8, 64, False)


def test_node_defaults_come_from_config(monkeypatch, tmp_path):
    from exo_p2p import config as cfg
    from exo_p2p.cli import cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    result = invoke(["node"], env={"EXO_P2P_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.data_dir == tmp_path / "home"
    assert (config.api_host, config.api_port) == (cfg.DEFAULT_API_HOST, cfg.DEFAULT_API_PORT)
    assert config.listen_port == cfg.DEFAULT_LISTEN_PORT
    assert config.memory_limit is None and config.mdns is True and config.bootstrap == []
    from exo_p2p.defaults import NODE_PROMPT_CACHE_BYTES
    from exo_p2p.types.engine import EngineSettings

    # every engine default from exo_p2p.defaults; a node keeps a prompt cache
    assert config.engine == EngineSettings(prompt_cache_bytes=NODE_PROMPT_CACHE_BYTES) == cfg.NodeConfig(data_dir=tmp_path).engine


def test_node_engine_flags_make_one_record(tmp_path):
    from exo_p2p.cli.errors import CliError
    from exo_p2p.cli.node_cmd import build_node_config
    from exo_p2p.defaults import PREFILL_CHUNK_SIZE
    from exo_p2p.types.engine import EngineSettings

    config = build_node_config(data_dir=tmp_path, max_batch=4, prompt_cache_bytes=1000, kv_cache_bytes=5000)
    assert config.engine == EngineSettings(PREFILL_CHUNK_SIZE, 4, 1000, 5000)  # only given ones override
    with pytest.raises(CliError) as bad:
        build_node_config(data_dir=tmp_path, max_batch=0)
    assert bad.value.exit_code == 2 and "--max-batch" in str(bad.value)


def test_node_setting_flags_are_checked_in_order_and_kept_normalized():
    """``settings.apply.field_values``: only the flags given become fields (the log level
    lower-cased); the first bad one, in table order, is the usage error."""
    from exo_p2p.settings.apply import SettingError, field_values

    assert field_values({}) == {}
    assert field_values({"memory_limit": "1GiB", "cpu_weights": "stored", "routing": "load", "log_format": "json",
                         "log_level": "DEBUG"}) == {
        "memory_limit": 1 << 30, "cpu_weights": "stored", "routing": "load", "log_format": "json", "log_level": "debug"}
    with pytest.raises(SettingError) as bad:
        field_values({"memory_limit": "64", "routing": "nearest", "log_level": "loud"})
    assert "less than 64 MiB" in str(bad.value)
    with pytest.raises(SettingError, match="--routing"):
        field_values({"request_log_bytes": -1, "routing": "nearest"})  # in table order, not the order given


def test_node_exit_code_is_passed_on(monkeypatch, tmp_path):
    from exo_p2p.cli import cluster_cmds

    monkeypatch.setattr(cluster_cmds, "run_node", lambda config: 1)
    assert invoke(["node", "--data-dir", str(tmp_path)]).exit_code == 1


def test_node_without_a_node_runtime_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "exo_p2p.node", None)  # makes the import fail
    result = invoke(["node", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert line.startswith("error: this installation cannot run a node:")


def test_missing_cluster_secret_file_exits_2(monkeypatch, tmp_path):
    from exo_p2p.cli import cluster_cmds

    monkeypatch.setattr(cluster_cmds, "run_node", lambda config: pytest.fail("must not start"))
    result = invoke(["node", "--cluster-secret", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert len(error_lines(result)) == 1


# -- place ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_place_waits_with_progress_until_ready(served):
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    polls = [p for p in served.paths("GET") if p.startswith("/instances/inst")]
    assert len(polls) == 3  # 10 layers per poll, 30 layers
    (inst,) = served.node.instances.values()
    assert inst["status"] == "ready"
    assert f"instance {inst['instance_id']} is ready" in result.stdout
    assert "30/30" in result.stderr and "layers" in result.stderr


@pytest.mark.integration
def test_place_no_wait_returns_at_once(served):
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert served.paths("GET") == ["/state", "/instances"]  # only the replica check (State first), no polling
    assert "placed smollm2-135m-instruct as instance inst0001" in result.stdout


@pytest.mark.integration
def test_place_failed_instance_exits_1_with_reason(served):
    served.node.fail_reason = "runner exited with code -9 while loading layer 12"
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    assert error_lines(result)[-1] == (
        "error: instance inst0001-smollm2-135m-instruct of smollm2-135m-instruct failed: "
        "runner exited with code -9 while loading layer 12"
    )


@pytest.mark.integration
def test_place_timeout_exits_1(served):
    served.node.layers_per_poll = 0
    result = invoke(["place", "smollm2-135m-instruct", "--timeout", "0.2", "--api", served.url])
    assert result.exit_code == 1
    assert "is not ready after 0.2 s (status loading, 0/30 layers)" in error_lines(result)[-1]


@pytest.mark.integration
def test_delete_by_id_and_unique_prefix(served):
    served.node.place({"model": "a"})
    served.node.place({"model": "b"})
    result = invoke(["delete", "inst0001-a", "--api", served.url])
    assert result.exit_code == 0 and "deleted instance inst0001-a" in result.stdout
    result = invoke(["delete", "inst0002", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert served.node.instances == {}
    result = invoke(["delete", "inst0002", "--api", served.url])
    assert result.exit_code == 1 and error_lines(result) == ["error: no instance inst0002 (`exo-p2p instances` lists the ids)"]


# -- chat -----------------------------------------------------------------------------------


def _chat_bodies(served) -> list[dict]:
    return [b for m, p, _, b in served.node.requests if p == "/v1/chat/completions"]


@pytest.mark.integration
def test_chat_streams_text_from_sse(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.instances["inst0001-smollm2-135m-instruct"]["status"] = "ready"
    result = invoke(
        ["chat", "What is the capital of France?", "--max-tokens", "20", "--temperature", "0", "--system", "Be brief.", "--api", served.url]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"
    (body,) = _chat_bodies(served)
    assert body["model"] == "smollm2-135m-instruct" and body["stream"] is True
    assert (body["max_tokens"], body["temperature"]) == (20, 0.0)
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]


@pytest.mark.integration
def test_chat_model_defaults(served):
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "smollm2-135m-instruct"  # nothing placed
    served.node.place({"model": "other-model"})
    served.node.instances["inst0001-other-model"]["status"] = "ready"
    assert invoke(["chat", "hi", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "other-model"
    assert invoke(["chat", "hi", "-m", "third", "--api", served.url]).exit_code == 0
    assert _chat_bodies(served)[-1]["model"] == "third"
    assert "max_tokens" not in _chat_bodies(served)[-1]


@pytest.mark.integration
def test_chat_error_mid_stream_exits_1(served):
    served.node.chat_error_after = 2
    result = invoke(["chat", "hi", "--api", served.url])
    assert result.exit_code == 1
    assert result.stdout.startswith("The capital of France")
    assert error_lines(result) == ["error: runner died while generating"]


@pytest.mark.integration
def test_interactive_chat_keeps_the_conversation(served):
    result = invoke(["chat", "--api", served.url], input="hello\n\nagain\n/bye\nnever sent\n")
    assert result.exit_code == 0, result.output
    first, second = _chat_bodies(served)
    assert first["messages"] == [{"role": "user", "content": "hello"}]
    assert second["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "again"},
    ]
    assert result.stdout.count("The capital of France is Paris.\n") == 2


# -- cluster-secret -------------------------------------------------------------------------


def test_cluster_secret_writes_a_0600_file(tmp_path):
    path = tmp_path / "cluster.key"
    old = os.umask(0)
    try:
        result = invoke(["cluster-secret", str(path)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) == 64 and int(secret, 16) >= 0
    again = invoke(["cluster-secret", str(path)])
    assert again.exit_code == 1 and "exists" in error_lines(again)[0]
    assert path.read_text().strip() == secret
    assert invoke(["cluster-secret", str(path), "--force"]).exit_code == 0
    assert path.read_text().strip() != secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_cluster_secret_printed_when_no_file():
    first, second = invoke(["cluster-secret"]), invoke(["cluster-secret"])
    assert first.exit_code == 0
    assert len(first.stdout.strip()) == 64 and first.stdout != second.stdout


# -- SSE parsing (property) -----------------------------------------------------------------


_line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"))


@given(st.lists(st.lists(_line_text, min_size=1, max_size=3), max_size=6))
def test_sse_data_round_trips(events):
    from exo_p2p.cli.chat_stream import iter_sse_data

    lines: list[str] = [": keep-alive comment", ""]
    for event in events:
        lines += ["event: message"] + [f"data: {part}" for part in event] + [""]
    assert list(iter_sse_data(lines)) == ["\n".join(e) for e in events]


@given(st.lists(st.text(min_size=1, max_size=8), max_size=10))
def test_chat_deltas_concatenate_and_stop_at_done(pieces):
    from exo_p2p.cli.chat_stream import chat_deltas

    payloads = [json.dumps({"choices": [{"index": 0, "delta": {"content": p}}]}) for p in pieces]
    payloads += ["[DONE]", json.dumps({"choices": [{"delta": {"content": "after done"}}]})]
    assert "".join(chat_deltas(payloads)) == "".join(pieces)


# -- run ------------------------------------------------------------------------------------


def _fake_node_command(monkeypatch):
    from exo_p2p.cli import local_node

    def command(api_port: int, data_dir: Path, private: bool = True) -> list[str]:
        # a private node's state dir is DATA_DIR/private-runs/run-XXXX (removed after the
        # run): the fake writes what the tests read into DATA_DIR itself
        home = data_dir.parent.parent if data_dir.parent.name == "private-runs" else data_dir
        (home / "private").write_text(str(private))
        (home / "state-dir").write_text(str(data_dir))
        return [sys.executable, __file__, "--api-port", str(api_port), "--data-dir", str(home)]

    monkeypatch.setattr(local_node, "node_command", command)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _no_default_node(monkeypatch) -> str:
    """Point the default API URL at a closed port (tests never use the real default)."""
    from exo_p2p.cli import endpoint

    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setattr(endpoint, "DEFAULT_API", url)
    return url


@pytest.mark.integration
def test_run_starts_a_node_places_answers_and_stops_it(monkeypatch, tmp_path):
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    result = invoke(["run", "smollm2-135m-instruct", "What is the capital of France?", "--max-tokens", "5",
                     "--data-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"
    assert "starting one for this command" in result.stderr and "30/30" in result.stderr
    pid = int((tmp_path / "fake-node.pid").read_text())
    assert _gone(pid)
    # its state was a fresh dir of its own (exo_p2p.cli.private_state), removed after
    state_dir = Path((tmp_path / "state-dir").read_text())
    assert state_dir.parent == tmp_path / "private-runs" and not state_dir.exists()
    log = (tmp_path / "run-node.log").read_text()
    assert "POST /instances" in log and "POST /v1/chat/completions" in log


@pytest.mark.integration
def test_run_uses_an_answering_node_and_an_existing_instance(served, tmp_path):
    served.node.place({"model": "smollm2-135m-instruct"})
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--api", served.url, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert served.paths("POST") == ["/v1/chat/completions"]  # waited for the loading one, no new placement
    assert not (tmp_path / "run-node.log").exists()


@pytest.mark.integration
def test_run_reports_a_node_that_does_not_start(monkeypatch, tmp_path):
    from exo_p2p.cli import local_node

    code = "import sys; print('loading things'); print('error: API port 1 on 127.0.0.1 is not available'); sys.exit(3)"
    monkeypatch.setattr(local_node, "node_command", lambda port, data_dir, private=True: [sys.executable, "-c", code])
    _no_default_node(monkeypatch)
    (tmp_path / "run-node.log").write_text("".join(f"stale line {i} of an earlier run\n" for i in range(30)))
    result = invoke(["run", "m", "hi", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    first = error_lines(result)[1]  # after "no node answers …; starting one"
    # the reason first, then only this run's lines
    assert first.startswith("error: could not start a node: API port 1 on 127.0.0.1 is not available (the node exited with code 3)"), first
    assert "loading things" in result.stderr and "stale line" not in result.stderr


@pytest.mark.integration
def test_run_does_not_start_a_node_for_a_remote_api(tmp_path):
    result = invoke(["run", "m", "hi", "--api", "http://192.0.2.1:9", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert error_lines(result)[0].startswith("error: nothing answers at http://192.0.2.1:9")


@pytest.mark.integration
def test_run_with_an_explicit_api_that_answers_nothing_is_an_error(monkeypatch, tmp_path):
    """An explicit --api (or EXO_P2P_API) that answers nothing is an error,
    not a reason to start a node elsewhere."""
    _fake_node_command(monkeypatch)
    url = f"http://127.0.0.1:{closed_port()}"
    for args, env in (([ "--api", url], None), ([], {"EXO_P2P_API": url})):
        result = invoke(["run", "m", "hi", *args, "--data-dir", str(tmp_path)], env=env)
        assert result.exit_code == 1
        (line,) = error_lines(result)
        assert line.startswith(f"error: nothing answers at {url}")
        assert not (tmp_path / "private").exists()  # no node was started


@pytest.mark.integration
def test_run_starts_a_private_node_unless_lan(monkeypatch, tmp_path):
    """The node `run` starts is private (own cluster, no mDNS, loopback)."""
    from exo_p2p.cli.local_node import node_command

    argv = node_command(5000, tmp_path)
    assert "--no-mdns" in argv and argv[argv.index("--listen-host") + 1] == "127.0.0.1"
    cluster = argv[argv.index("--cluster") + 1]
    assert cluster.startswith("run-") and cluster != node_command(5000, tmp_path)[argv.index("--cluster") + 1]
    lan = node_command(5000, tmp_path, private=False)
    assert "--no-mdns" not in lan and "--cluster" not in lan and "--listen-host" not in lan
    # and `run` asks for the private one unless --lan
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "private").read_text() == "True" and "private: loopback only, no mDNS" in result.stderr
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--lan", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "private").read_text() == "False"


@pytest.mark.integration
def test_running_node_is_stopped_when_the_block_is_interrupted(monkeypatch, tmp_path):
    from rich.console import Console

    from exo_p2p.cli.local_node import running_node

    _fake_node_command(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        with running_node(tmp_path, Console(stderr=True), start_timeout=30) as url:
            assert url.startswith("http://127.0.0.1:")
            raise KeyboardInterrupt
    assert _gone(int((tmp_path / "fake-node.pid").read_text()))


@pytest.mark.integration
def test_stop_process_kills_a_node_that_ignores_sigterm():
    from exo_p2p.cli.local_node import stop_process

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        started = time.monotonic()
        stop_process(proc, timeout=0.5)
        assert proc.returncode == -9
        assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


@pytest.mark.integration
def test_ctrl_c_while_waiting_exits_130_quietly(tmp_path):
    import signal

    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    node = subprocess.Popen(
        [sys.executable, __file__, "--api-port", str(port), "--data-dir", str(tmp_path), "--stall"],
        stdout=subprocess.DEVNULL,
    )
    cli = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "fake node did not come up"
                time.sleep(0.1)
        env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
        # A terminal starts a command with SIGINT at its default; a suite started in the
        # background (`cmd &` in a script, nohup, some CI runners) passes SIGINT down ignored,
        # and Python then (rightly, as POSIX programs do) never turns it into
        # KeyboardInterrupt: give the CLI the terminal's disposition.
        cli = subprocess.Popen(
            [sys.executable, "-m", "exo_p2p", "place", "m", "--api", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        placed = cli.stdout.readline()
        assert placed.startswith("placed m as instance")
        time.sleep(0.5)
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=30)
        assert cli.returncode == 130
        assert "Traceback" not in err and "error" not in err
        # it says the instance stays placed and how to delete it
        instance_id = placed.split("as instance ", 1)[1].split()[0]
        assert f"instance {instance_id} stays placed and keeps loading" in err, err
        assert f"exo-p2p delete {instance_id}" in err
    finally:
        for proc in (cli, node):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("exo_p2p.node") is None, reason="exo_p2p.node not built yet")
def test_run_with_a_real_node_answers_and_leaves_nothing(tmp_path):
    import psutil

    env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
    env["HF_HUB_OFFLINE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from exo_p2p.cli import endpoint, main; "
         f"endpoint.DEFAULT_API = 'http://127.0.0.1:{closed_port()}'; sys.argv[0] = 'exo-p2p'; main.main()",
         "run", "smollm2-135m-instruct", "What is the capital of France?",
         "--temperature", "0", "--max-tokens", "24", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + (tmp_path / "run-node.log").read_text()
    assert "Paris" in proc.stdout
    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []


# -- a command line a new user trusts -------------------------------------------------------


@pytest.mark.integration
def test_length_limit_is_said_on_stderr(served):
    served.node.finish_reason = "length"
    result = invoke(["chat", "hi", "--max-tokens", "4", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert result.stdout == "The capital of France is Paris.\n"  # stdout keeps only the answer
    assert "cut at the length limit of 4 tokens" in result.stderr and "--max-tokens 16" in result.stderr
    served.node.finish_reason = "stop"
    result = invoke(["chat", "hi", "--api", served.url])
    assert "length limit" not in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_empty_prompt_is_refused(served, prompt):
    for command in (["chat", prompt], ["run", "smollm2-135m-instruct", prompt]):
        served.node.place({"model": "smollm2-135m-instruct"})
        result = invoke([*command, "--api", served.url])
        assert result.exit_code == 2
        (line,) = error_lines(result)
        assert line.startswith("error: the prompt is empty")
    assert served.paths("POST").count("/v1/chat/completions") == 0


@pytest.mark.integration
def test_place_bar_shows_phases_and_keeps_its_clock(served):
    from exo_p2p.cli.waiting import instance_phase

    served.node.warmup_polls = 3
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    phases = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if line.startswith("smollm2-135m-instruct: ")]
    assert phases == ["loading layers", "warming up", "ready"]
    shard = lambda status: {"status": status}  # noqa: E731
    assert instance_phase({"status": "loading", "shards": [shard("pending"), shard("loading")]}) == "preparing"
    assert instance_phase({"status": "loading", "shards": [shard("connecting"), shard("loading")]}) == "connecting ranks"
    assert instance_phase({"status": "loading", "shards": [shard("loaded"), shard("loading")]}) == "loading layers"
    assert instance_phase({"status": "loading", "shards": [shard("warming_up"), shard("ready")]}) == "warming up"
    assert instance_phase({"status": "ready", "shards": [shard("ready")]}) == "ready"


def test_bar_clock_runs_when_the_bar_is_full():
    from rich.progress import Progress

    from exo_p2p.cli.waiting import _Clock

    now = [0.0]
    progress = Progress(get_time=lambda: now[0])
    task_id = progress.add_task("m", total=6)
    now[0] = 5.0
    progress.update(task_id, completed=6)  # full: rich's TimeElapsedColumn stops here
    now[0] = 9.0
    task = progress.tasks[0]
    assert str(_Clock().render(task)) == "0:00:09"


ids = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40)


@given(st.lists(ids, min_size=1, max_size=30, unique=True))
def test_short_ids_are_unique_prefixes(values):
    from exo_p2p.cli.readable import SHORT_ID, short_ids

    short = short_ids(values)
    for ident, prefix in short.items():
        assert ident.startswith(prefix) and len(prefix) >= min(SHORT_ID, len(ident))
        # a prefix names one id only (unless the id itself is a prefix of another)
        matches = [o for o in values if o.startswith(prefix)]
        assert matches == [ident] or prefix == ident


@pytest.mark.integration
def test_instances_table_shows_short_ids_on_one_line_and_json_the_full_ids(served):
    for _ in range(3):
        served.node.place({"model": "smollm2-135m-instruct"})
    full = sorted(served.node.instances)
    result = invoke(["instances", "--api", served.url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for ident in full:
        assert ident not in result.stdout  # the whole id is too long for the table
    assert "inst0001" in result.stdout and "inst0002" in result.stdout
    as_json = invoke(["ps", "--json", "--api", served.url])
    assert sorted(i["instance_id"] for i in json.loads(as_json.stdout)) == full


@pytest.mark.integration
def test_placing_a_model_twice_does_not_add_a_replica_unless_asked(served):
    assert invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url]).exit_code == 0
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url])
    assert result.exit_code == 0, result.output  # the model is placed: what was asked holds
    assert "already has 1 instance (inst0001)" in result.stderr and "not placing another" in result.stderr
    assert "--replica adds a replica" in result.stderr
    assert len(served.node.instances) == 1
    result = invoke(["place", "smollm2-135m-instruct", "--no-wait", "--replica", "--api", served.url])
    assert result.exit_code == 0 and len(served.node.instances) == 2


@pytest.mark.integration
def test_placing_a_model_twice_in_a_terminal_asks_nothing_and_reads_no_input(served):
    """Pasted into a terminal, the lines after ``place`` are the shell's, not answers to a
    question: ``place`` of a placed model reads nothing, says so and ends with 0."""
    import pty

    served.node.place({"model": "smollm2-135m-instruct"})
    env = {k: v for k, v in os.environ.items() if k != "EXO_P2P_API"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pty's terminal
        os.execve(sys.executable, [sys.executable, "-m", "exo_p2p", "place", "smollm2-135m-instruct", "--no-wait",
                                   "--api", served.url], env)  # fmt: skip
    os.write(fd, b"exo-p2p chat hello\n")  # the next pasted line, typed ahead
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        seen += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"already has 1 instance" in seen and b"not placing another" in seen, seen
    assert b"?" not in seen.replace(b"exo-p2p chat hello", b""), seen  # no question was asked
    assert len(served.node.instances) == 1


@pytest.mark.integration
def test_api_url_with_a_path_names_the_right_url(served):
    result = invoke(["models", "--api", served.url + "/v1"])
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line == f"error: --api {served.url}/v1: give the node's address without a path: --api {served.url} (OpenAI clients take …/v1; exo-p2p commands take the node's address)"
    assert served.paths() == []


@pytest.mark.integration
def test_stderr_is_not_wrapped_when_it_is_not_a_terminal(monkeypatch, tmp_path):
    _fake_node_command(monkeypatch)
    _no_default_node(monkeypatch)
    long_dir = tmp_path / ("a-long-directory-name-" * 4)
    long_dir.mkdir()
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--data-dir", str(long_dir)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stderr.splitlines() if "starting one for this command" in line]
    assert line.endswith(f"data dir {long_dir})")


@pytest.mark.integration
def test_ps_ls_aliases_and_stop_model(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.place({"model": "smollm2-135m-instruct"})
    served.node.place({"model": "other"})
    assert invoke(["ps", "--api", served.url]).stdout == invoke(["instances", "--api", served.url]).stdout
    assert invoke(["ls", "--api", served.url]).stdout == invoke(["models", "--api", served.url]).stdout
    result = invoke(["stop", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert list(served.node.instances) == ["inst0003-other"]
    assert result.stdout.count("deleted instance") == 2
    result = invoke(["stop", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1 and error_lines(result) == ["error: no instance of smollm2-135m-instruct is placed (see `exo-p2p instances`)"]
    # `rm` deletes a model's pulled/fetched files from this node (docs/models.md), as in ollama
    assert invoke(["rm", "x", "--api", served.url]).exit_code == 1


@pytest.mark.integration
def test_delete_with_a_model_name_hints_at_stop(served):
    served.node.place({"model": "smollm2-135m-instruct"})
    result = invoke(["delete", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "is a model, not an instance id: `exo-p2p stop smollm2-135m-instruct`" in line
    result = invoke(["delete", "nope", "--api", served.url])
    assert error_lines(result) == ["error: no instance nope (`exo-p2p instances` lists the ids)"]


@pytest.mark.integration
def test_previews_of_an_unknown_model_lists_the_known_ones(served):
    result = invoke(["previews", "gpt-5", "--api", served.url])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert line == "error: unknown model gpt-5; known models: smollm2-135m-instruct (see `exo-p2p models`)"


def test_sizes_under_a_gib_are_in_mib():
    from exo_p2p.cli.readable import gib

    assert gib(98_000_000) == "93.5 MiB" and gib(49_000_000) == "46.7 MiB"
    assert gib(16 * GIB) == "16.0 GiB" and gib(None) == "unknown"


def test_help_shows_no_python_types_and_lists_the_env_vars():
    from exo_p2p.cli.main import app

    commands = ["node", "place", "run", "chat", "models", "instances", "previews", "delete", "stop", "doctor", "nodes", "cluster-secret"]
    for command in commands + []:
        result = invoke([command, "--help"])
        assert result.exit_code == 0
        for bad in ("<bool>", "<int", "<str>", "<float", "list[", "<path>"):
            assert bad not in result.stdout, (command, bad)
    node_help = invoke(["node", "--help-all"], env={"COLUMNS": "400"}).stdout
    import typer.main

    params = [p for p in typer.main.get_command(app).commands["node"].params if not p.hidden and p.name not in ("help", "help_all")]
    assert "environment variable (EXO_P2P_ and the flag's name: --api-port is EXO_P2P_API_PORT)" in node_help
    for param in params:
        assert param.envvar and (param.envvar.startswith("EXO_P2P_")), param.name
        derived = "EXO_P2P_" + param.opts[0][2:].upper().replace("-", "_")
        assert param.opts[0] in node_help and (param.envvar == derived or param.envvar in node_help), param.envvar
    assert "--install-completion" in invoke(["--help"]).stdout


def test_node_flags_from_env_and_config_file(monkeypatch, tmp_path):
    from exo_p2p.cli import cluster_cmds

    started = []
    monkeypatch.setattr(cluster_cmds, "run_node", started.append)
    data = tmp_path / "d"
    data.mkdir()
    (data / "config.toml").write_text('api-port = 6001\nname = "from-file"\nbootstrap = []\nno-mdns = true\nmodels_dir = ["/m"]\n')
    env = {"EXO_P2P_HOME": str(data), "EXO_P2P_NAME": "from-env", "EXO_P2P_QUEUE_LIMIT": "9", "EXO_P2P_LOG_FILE": str(tmp_path / "n.log")}
    assert invoke(["node"], env=env).exit_code == 0
    assert invoke(["node", "--name", "from-flag"], env=env).exit_code == 0
    file_only, flag = started
    assert (file_only.api_port, file_only.friendly_name, file_only.queue_limit, file_only.mdns) == (6001, "from-env", 9, False)
    assert file_only.models_dirs == [Path("/m")] and file_only.data_dir == data and file_only.log_file == tmp_path / "n.log"
    assert flag.friendly_name == "from-flag"  # the command line, then the environment, then the file
    started.clear()
    assert invoke(["node"], env={**env, "EXO_P2P_MODELS_DIR": "/a:/b", "EXO_P2P_NO_MDNS": "0", "EXO_P2P_PRIORITY": "4"}).exit_code == 0
    (from_env,) = started
    assert from_env.models_dirs == [Path("/a"), Path("/b")] and from_env.priority == 4 and from_env.mdns is True
    started[:] = [file_only, flag]
    (data / "config.toml").write_text("api_prot = 1\n")
    result = invoke(["node"], env=env)
    assert result.exit_code == 2 and "unknown setting 'api_prot'" in error_lines(result)[0]
    (data / "config.toml").write_text('api-port = "many"\n')
    result = invoke(["node"], env=env)
    assert result.exit_code == 2 and "config.toml: api-port:" in error_lines(result)[0]
    assert len(started) == 2


@pytest.mark.integration
def test_repl_leaves_a_newline_on_ctrl_c(served):
    from exo_p2p.cli.chat import repl
    from exo_p2p.cli.client import NodeClient

    notes = []

    def read(prompt):
        raise KeyboardInterrupt

    with NodeClient(served.url) as client, pytest.raises(KeyboardInterrupt):
        repl(client, "m", read=read, note=notes.append)
    assert notes[-1] == ""


@pytest.mark.integration
def test_client_waits_for_a_local_node_that_is_starting(tmp_path):
    """`exo-p2p node & exo-p2p models` — the client waits (a few seconds)
    for the node that is starting instead of failing with "connection refused"."""
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    # a process that looks like `exo-p2p node --api-port PORT` while the API is not up yet
    looks_like_a_node = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "exo_p2p", "node", "--api-port", str(port)]
    )
    late = {}
    starter = threading.Timer(1.5, lambda: late.setdefault("served", Served(port)))
    try:
        starter.start()
        started = time.monotonic()
        result = invoke(["models", "--api", url])
        assert result.exit_code == 0, result.output
        assert "waiting up to 20 s for the node at" in result.stderr
        assert 1.0 < time.monotonic() - started < 15
    finally:
        starter.cancel()
        looks_like_a_node.kill()
        looks_like_a_node.wait()
        if "served" in late:
            late["served"].close()
    # no such process: fails at once, as before
    started = time.monotonic()
    result = invoke(["models", "--api", f"http://127.0.0.1:{closed_port()}"])
    assert result.exit_code == 1 and time.monotonic() - started < 3


@pytest.mark.integration
def test_runner_output_becomes_json_lines(tmp_path):
    """With --log-format json a runner's prints, warnings and traceback are
    JSON lines too (the node sets the runner's log settings in its environment)."""
    code = (
        "from exo_p2p.logs.configure import configure_runner_output; configure_runner_output(); "
        "print('hello from a runner'); import os, sys; print('to stderr', file=sys.stderr); "
        "raise ValueError('boom')"
    )
    env = {**os.environ, "EXO_P2P_RUNNER_LOG": json.dumps({"format": "json", "node": "alpha"})}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    records = [json.loads(line) for line in proc.stderr.splitlines()]
    assert {r["node"] for r in records} == {"alpha"}
    lines = [r["line"] for r in records]
    assert "hello from a runner" in lines and "to stderr" in lines and any("ValueError: boom" in x for x in lines)


@pytest.mark.integration
def test_node_log_lines_carry_the_node_name_and_json_parses(tmp_path):
    """JSON logs in a real node process that cannot start (its port is taken): every
    line of its JSON log file parses and names the node; the terminal gets the one-line
    error only."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log_file = tmp_path / "node.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXO_P2P_")}
        proc = subprocess.run(
            [sys.executable, "-m", "exo_p2p", "node", "--name", "alpha", "--api-port", str(port), "--listen-port", "0",
             "--data-dir", str(tmp_path / "d"), "--log-format", "json", "--log-file", str(log_file), "--no-mdns"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: API port") and len(proc.stderr.strip().splitlines()) == 1
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert records and all(r["node"] == "alpha" for r in records)
    assert any(r["level"] == "error" and "API port" in r["event"] for r in records)
    # the console format names the node too
    console_log = tmp_path / "console.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = subprocess.run(
            [sys.executable, "-m", "exo_p2p", "node", "--name", "alpha", "--api-port", str(taken.getsockname()[1]),
             "--listen-port", "0", "--data-dir", str(tmp_path / "d"), "--log-file", str(console_log), "--no-mdns"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.startswith("error: API port")
    lines = console_log.read_text().splitlines()
    assert lines and all("node=alpha" in line for line in lines), lines


# -- the stand-in node process for `run` ---------------------------------------------------


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


def test_a_foreign_web_server_is_named_as_not_an_exo_p2p_api():
    """With another web server on the API port the CLI used to print the
    HTML page; it now says in one line that the URL is not an exo-p2p node."""
    import httpx

    from exo_p2p.cli.errors import error_message

    req = httpx.Request("GET", "http://127.0.0.1:52515/nodes")
    page = httpx.Response(404, text="<!DOCTYPE HTML>\n<html><body>Not Found</body></html>", headers={"content-type": "text/html"}, request=req)
    msg = error_message(page)
    assert msg == "http://127.0.0.1:52515 answered HTTP 404 with an HTML page: it is not an exo-p2p node API (wrong --api URL or port?)"
    assert "\n" not in msg
    ours = httpx.Response(404, json={"error": {"message": "unknown instance x", "type": "invalid_request_error", "param": None, "code": None}}, request=req)
    assert error_message(ours) == "unknown instance x"
