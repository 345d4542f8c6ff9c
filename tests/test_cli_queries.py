"""The ``exo-p2p`` CLI against the fake node API of ``tests/support/fake_node.py`` served on
127.0.0.1 (docs/cli.md: the
query commands (``nodes``, ``models``, ``instances``, ``previews``) in tables and JSON, and
how the CLI finds and names its node API (``--api``, the environment, errors).

The fake API (``FakeNode``) speaks the node's HTTP API (``/nodes``, ``/models``, ``/state``,
``/instances``, ``/instances/previews``, ``/v1/chat/completions`` with SSE) from a stdlib
HTTP server in a thread, records every request and lets a test script placement errors,
loading progress and failures. Run as a script (``python test_cli.py --api-port N
--data-dir D``) it is the stand-in node process for ``exo-p2p run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.fake_node import GIB, PEER_ID, SELF_ID, Served, closed_port, error_lines, fast_polls, invoke, served


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture
def served2():
    s = Served()
    yield s
    s.close()


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
    assert f"  beta   /ip4/127.0.0.2/tcp/52514/p2p/{PEER_ID}\n" in out  # whole, for --bootstrap
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


# -- a command line a new user trusts -------------------------------------------------------


ids = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40)


@given(st.lists(ids, min_size=1, max_size=30, unique=True))
def test_short_ids_are_unique_prefixes(values):
    from exo_p2p.cli.output.readable import SHORT_ID, short_ids

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
def test_api_url_with_a_path_names_the_right_url(served):
    result = invoke(["models", "--api", served.url + "/v1"])
    assert result.exit_code == 2
    (line,) = error_lines(result)
    assert line == f"error: --api {served.url}/v1: give the node's address without a path: --api {served.url} (OpenAI clients take …/v1; exo-p2p commands take the node's address)"
    assert served.paths() == []


@pytest.mark.integration
def test_previews_of_an_unknown_model_lists_the_known_ones(served):
    result = invoke(["previews", "gpt-5", "--api", served.url])
    assert result.exit_code == 1
    (line,) = error_lines(result)
    assert line == "error: unknown model gpt-5; models in the cluster: smollm2-135m-instruct (`exo-p2p models` lists them)"
    (line,) = error_lines(invoke(["previews", "smollm2-135m-instrct", "--api", served.url]))  # the one wording
    assert line == "error: unknown model smollm2-135m-instrct — did you mean smollm2-135m-instruct? (`exo-p2p models` lists them)"


def test_sizes_under_a_gib_are_in_mib():
    from exo_p2p.cli.output.readable import gib

    assert gib(98_000_000) == "93.5 MiB" and gib(49_000_000) == "46.7 MiB"
    assert gib(16 * GIB) == "16.0 GiB" and gib(None) == "unknown"


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


# -- the stand-in node process for `run` ---------------------------------------------------


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
