"""Messages a user can act on (docs/cli.md): the missing or refused API key names
``--api-key`` and ``EXO_P2P_API_KEY``, which every client command takes; errors and tables
name nodes by their names (whole ids only in ``--json``); ``chat`` ends with one line of
figures on stderr (``--quiet`` drops it).

The commands run in-process against a fake node API behind an ``httpx.MockTransport``
(``exo_p2p.cli.node_api.client.set_transport``): no socket, no process.
"""

from __future__ import annotations

import json

import httpx
import pytest

from exo_p2p.cli.node_api import client as client_module
from exo_p2p.cli.messages import (
    AnswerStats,
    api_key_message,
    check_api_key,
    name_node_ids,
    named_reasons,
    stats_line,
)

ALPHA = "12D3KooW" + "Ahpha" * 8 + "Ahph"  # base58: no 0, O, I or l
BETA = "12D3KooWBetaBetaBetaBetaBetaBetaBetaBetaBetaBetaBeta1"
KEY = "s3cret-key"
URL = "http://node.test:52515"


class MockNode:
    """The routes the commands use; ``key`` (None: open) is required as a Bearer token."""

    def __init__(self, key: str | None = None) -> None:
        self.key = key
        self.auth: list[tuple[str, str | None]] = []
        self.bodies: list[dict] = []

    def nodes(self) -> list[dict]:
        return [{"node_id": ALPHA, "friendly_name": "alpha", "is_self": True, "is_master": True, "addrs": []},
                {"node_id": BETA, "friendly_name": "beta", "is_self": False, "is_master": False, "addrs": []}]

    def instances(self) -> list[dict]:
        shards = [{"node_id": ALPHA, "rank": 0, "start_layer": 0, "end_layer": 30, "status": "ready"}]
        return [{"instance_id": "inst-ready", "model": "m", "status": "ready", "sharding": "pipeline", "shards": shards},
                {"instance_id": "inst-failed", "model": "other", "status": "failed", "sharding": "pipeline", "shards": [],
                 "reason": f"runner on node {BETA} failed: out of memory"}]

    def sse(self) -> bytes:
        chunks = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in ("Par", "is", ".")]
        chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                   {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}]
        return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"

    def handle(self, request: httpx.Request) -> httpx.Response:
        given = request.headers.get("authorization")
        self.auth.append((request.url.path, given))
        if request.content:
            self.bodies.append(json.loads(request.content))
        if self.key is not None and given != f"Bearer {self.key}":
            what = "invalid API key" if given else "missing API key"
            return httpx.Response(401, json={"error": {"message": f"{what}: this node requires Authorization: Bearer KEY",
                                                        "code": "invalid_api_key"}})
        route = (request.method, request.url.path)
        answers = {
            ("GET", "/state"): {"node_id": ALPHA, "master": ALPHA, "warnings": [f"peer {BETA} is slow"]},
            ("GET", "/nodes"): self.nodes(),
            ("GET", "/instances"): self.instances(),
            ("GET", "/models"): [{"model": "m", "n_layers": 30, "storage_size": 1}],
            ("GET", "/instances/previews"): [{"sharding": "pipeline", "world_size": 2, "error": f"node {BETA} has too little memory"}],
            ("POST", "/models/pull"): {"state": "done", "bytes_total": 10, "bytes_by_peer": {BETA: 10}},
            ("DELETE", "/models/m"): {"paths": []},
            ("DELETE", "/instances/inst-ready"): {"deleted": True},
        }
        if route == ("POST", "/v1/chat/completions"):
            return httpx.Response(200, content=self.sse(), headers={"content-type": "text/event-stream"})
        if route == ("POST", "/instances"):
            return httpx.Response(400, json={"error": {"message": f"node {BETA} has 1.0 GiB free; the shard needs 2.0 GiB"}})
        if route in answers:
            return httpx.Response(200, json=answers[route])
        return httpx.Response(404, json={"error": {"message": f"no route {request.method} {request.url.path}"}})


@pytest.fixture()
def node(monkeypatch: pytest.MonkeyPatch):
    fake = MockNode()
    monkeypatch.setattr(client_module, "last_node", None)
    monkeypatch.setattr(client_module, "answered_by", None)
    monkeypatch.delenv("EXO_P2P_API_KEY", raising=False)
    client_module.set_transport(httpx.MockTransport(fake.handle))
    try:
        yield fake
    finally:
        client_module.set_transport(None)


def invoke(args: list[str], env: dict | None = None, input: str | None = None):
    from typer.testing import CliRunner

    from exo_p2p.cli.main import app

    return CliRunner().invoke(app, args, env={"EXO_P2P_API": URL, "COLUMNS": "200", **(env or {})},
                              input=input, catch_exceptions=False)


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


# -- the API key ----------------------------------------------------------------------------


def test_the_key_message_names_the_option_and_the_variable() -> None:
    missing = api_key_message(URL, None)
    refused = api_key_message(URL, "$EXO_P2P_API_KEY")
    for text in (missing, refused):
        assert "--api-key KEY" in text and "EXO_P2P_API_KEY=KEY" in text and URL in text
    assert "requires an API key" in missing and "refused the API key from $EXO_P2P_API_KEY" in refused


def test_a_key_is_checked() -> None:
    assert check_api_key("  k  ", "--api-key") == "k"
    for bad in ("", "   ", "clé", "a\nb"):
        with pytest.raises(ValueError, match="--api-key"):
            check_api_key(bad, "--api-key")


def test_a_node_that_needs_a_key_says_how_to_give_it(node: MockNode) -> None:
    node.key = KEY
    result = invoke(["models"])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert "requires an API key" in line and "--api-key KEY" in line and "EXO_P2P_API_KEY" in line
    (line,) = error_lines(invoke(["ps", "--api-key", "wrong"]))
    assert "refused the API key from --api-key" in line and "EXO_P2P_API_KEY" in line
    (line,) = error_lines(invoke(["ps"], env={"EXO_P2P_API_KEY": "wrong"}))
    assert "refused the API key from $EXO_P2P_API_KEY" in line
    assert invoke(["ps", "--api-key", KEY]).exit_code == 0
    assert invoke(["--api-key", KEY, "ps"]).exit_code == 0  # before the subcommand too
    assert invoke(["ps"], env={"EXO_P2P_API_KEY": KEY}).exit_code == 0
    assert invoke(["ps", "--api-key", ""]).exit_code == 2


def test_every_client_command_takes_api_key() -> None:
    import typer.main

    from exo_p2p.cli.main import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    clients = set(commands) - {"node", "cluster-secret"}
    assert {"models", "ps", "place", "stop", "delete", "chat", "run", "nodes", "previews", "doctor", "pull", "rm", "invite"} <= clients
    for name in clients:
        group = getattr(commands[name], "commands", None)  # a group (``logs``): each of its commands
        for sub, command in (group.items() if group else [("", commands[name])]):
            assert any("--api-key" in p.opts for p in command.params), f"{name} {sub}".strip()
    node_key = next(p for p in commands["node"].params if "--api-key" in p.opts)
    assert node_key.multiple and node_key.envvar == "EXO_P2P_API_KEY"  # the node's own keys, unchanged


CLIENT_RUNS = [["nodes"], ["models"], ["ps"], ["instances", "--json"], ["previews", "m"], ["place", "m", "--replica"],
               ["stop", "m"], ["delete", "inst-ready"], ["chat", "hi"], ["run", "m", "hi", "--api", URL],
               ["pull", "m"], ["rm", "m"], ["doctor", "--mdns-seconds", "0"]]


@pytest.mark.parametrize("argv", CLIENT_RUNS, ids=lambda a: a[0])
def test_each_client_command_sends_the_key_it_is_given(node: MockNode, argv: list[str]) -> None:
    node.key = KEY
    result = invoke([*argv, "--api-key", KEY])
    assert "API key" not in result.stderr, result.stderr
    assert node.auth and all(given == f"Bearer {KEY}" for _, given in node.auth), node.auth


# -- nodes by their names -------------------------------------------------------------------


def test_node_ids_become_names() -> None:
    names = {ALPHA: "alpha", BETA: "beta"}
    assert name_node_ids(f"node {BETA} is gone; {ALPHA} stays", names) == "node beta is gone; alpha stays"
    gone = "12D3KooWGoneGoneGoneGoneGoneGoneGoneGoneGoneGoneGone"
    assert name_node_ids(f"node {gone} is gone", names) == f"node {gone} is gone"  # not known: the id stays
    assert name_node_ids(f"{ALPHA}, {BETA}", {ALPHA: "mac", BETA: "mac"}) == f"mac ({ALPHA[:12]}…), mac ({BETA[:12]}…)"
    assert name_node_ids("no id at all", names) == "no id at all"
    failed = {"instance_id": "i", "reason": f"node {BETA} left"}
    assert named_reasons([failed], names) == [{"instance_id": "i", "reason": "node beta left"}]
    assert failed["reason"] == f"node {BETA} left"  # a copy


def test_errors_and_tables_name_nodes_and_json_keeps_ids(node: MockNode) -> None:
    result = invoke(["place", "m", "--replica"])
    assert result.exit_code == 1
    assert error_lines(result) == ["error: node beta has 1.0 GiB free; the shard needs 2.0 GiB"]
    table = invoke(["ps"]).stdout
    assert "runner on node beta failed: out of memory" in table and BETA not in table
    assert BETA in invoke(["ps", "--json"]).stdout
    previews = invoke(["previews", "m"]).stdout
    assert "node beta has too little memory" in previews and BETA not in previews
    result = invoke(["nodes"])
    assert "warning: peer beta is slow" in result.stderr
    assert "from beta: 0.0 MB" in invoke(["pull", "m"]).stdout


# -- the figures after an answer ------------------------------------------------------------


def test_the_figures_line() -> None:
    stats = AnswerStats(started=10.0)
    for t in (10.5, 11.0, 11.5):
        stats.delta(t)
    stats.finish_reason = "stop"
    assert stats_line(stats) == "TTFT 0.50 s · 3 tokens at 2.0 tokens/s · finish reason: stop (the answer ended)"
    stats.completion_tokens, stats.finish_reason = 5, "length"
    assert stats_line(stats) == "TTFT 0.50 s · 5 tokens at 4.0 tokens/s · finish reason: length (the token limit)"
    one = AnswerStats(started=0.0)
    one.delta(0.25)
    assert stats_line(one) == "TTFT 0.25 s · 1 token · finish reason: none (the stream ended without one)"
    assert stats_line(AnswerStats(started=0.0)) == "0 tokens · finish reason: none (the stream ended without one)"


def test_the_usage_chunk_reaches_its_callback() -> None:
    usages: list[dict] = []
    payloads = ['{"choices": [{"delta": {"content": "a"}}]}', '{"choices": [], "usage": {"completion_tokens": 1}}', "[DONE]"]
    assert list(client_module.chat_deltas(payloads, on_usage=usages.append)) == ["a"]
    assert usages == [{"completion_tokens": 1}]


def test_chat_ends_with_the_figures_on_stderr_unless_quiet(node: MockNode) -> None:
    result = invoke(["chat", "hi"])
    assert result.exit_code == 0 and result.stdout == "Paris.\n"
    last = error_lines(result)[-1]
    assert last.startswith("TTFT ") and "3 tokens at" in last and "tokens/s" in last and last.endswith("finish reason: stop (the answer ended)")
    assert node.bodies[-1]["stream_options"] == {"include_usage": True}
    quiet = invoke(["chat", "hi", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stdout == "Paris.\n" and quiet.stderr == ""
    chatting = invoke(["chat"], input="hello\nagain\n/bye\n")
    assert sum(line.startswith("TTFT ") for line in error_lines(chatting)) == 2  # one line per answer
