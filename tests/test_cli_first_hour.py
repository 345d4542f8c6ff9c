"""What a new user meets in their first hour with the CLI (docs/cli.md): the headings and words
of ``logs requests``, refused generation requests in the records, ``top``'s node column and
rate, the wording of ``place`` / ``stop`` / ``chat`` errors, tables at 80 columns."""

from __future__ import annotations

import httpx
import pytest

from exo_p2p.api.access import AccessPolicy
from exo_p2p.cli.queries.requests_log import COLUMNS, header_line, record_line, route_text
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.metrics.request_log import RequestLog
from tests.support.fake_master import MODEL, chat_body
from tests.support.metrics_scrape import KEY, _run, value


def test_logs_requests_has_a_heading_and_no_dangling_units() -> None:
    head = header_line()
    for name, _, _ in COLUMNS:
        assert name in head
    refused = record_line({"started": 1.0, "status": 404, "family": "openai", "model": "nope", "outcome": "refused",
                           "request_id": "0123456789abcdef"})
    assert "-s" not in refused and "ttft" not in refused and "refused" in refused
    served = record_line({"started": 1.0, "status": 200, "family": "openai", "model": MODEL, "instance": "inst-12345678",
                          "prompt_tokens": 12, "cached_tokens": 4, "completion_tokens": 30, "ttft": 0.41234,
                          "decode_tps": 25.31, "finish_reason": "stop", "request_id": "0123456789abcdef",
                          "route": "only", "moves": 1})
    assert "0.412" in served and "25.3" in served and "only instance, moved 1x" in served
    # the cells sit under their headings: the ttft value ends where "ttft s" ends
    assert served.index("0.412") + len("0.412") == head.index("ttft s") + len("ttft s")
    assert route_text("prefix:120") == "cached prefix (120 chars)" and route_text("load") == "least loaded"


def test_refused_generation_requests_are_recorded() -> None:
    """A 400 (a body that fails the checks) is recorded like a 404, with the model it asked
    for; a 400 of a request that is not a generation is not."""
    observer = Observer(NodeMetrics(known_model=lambda m: m == MODEL), RequestLog(None))
    auth = {"authorization": f"Bearer {KEY}"}

    async def body(http: httpx.AsyncClient) -> None:
        bad = await http.post("/v1/chat/completions", json={**chat_body(), "temperature": "hot"}, headers=auth)
        assert bad.status_code == 400
        assert (await http.post("/v1/chat/completions", content=b"{not json", headers={**auth, "content-type": "application/json"})).status_code == 400
        assert (await http.post("/api/chat", json={"model": MODEL, "messages": 3}, headers=auth)).status_code == 400
        assert (await http.post("/v1/chat/completions", json=chat_body(model="nope"), headers=auth)).status_code == 404
        assert (await http.post("/instances", json={"model": 5}, headers=auth)).status_code == 400  # not a generation
        recs = (await http.get("/requests", headers=auth)).json()["records"]
        assert [(r["status"], r["family"], r["model"], r["outcome"]) for r in recs] == [
            (400, "openai", MODEL, "refused"), (400, "openai", "", "refused"), (400, "ollama", MODEL, "refused"),
            (404, "openai", "nope", "refused")]
        assert recs[0]["key_id"] is not None
        text = (await http.get("/metrics", headers=auth)).text
        assert value(text, "exo_requests_total", kind="generate", family="openai", model=MODEL, status="400") == 1

    _run(body, access=AccessPolicy.of([KEY]), observer=observer)


def test_top_tells_nodes_apart_and_shows_the_last_speed() -> None:
    """Every libp2p id begins ``12D3KooW``: nodes without a name (or sharing one) are shown
    by enough of their id to tell them apart; an instance with no tokens flowing shows the
    speed of its last request, marked ``last``."""
    from rich.console import Console

    from exo_p2p.cli.queries.top import frame, last_rates, rate_text

    one, two = "12D3KooWAbCdEfGh1111", "12D3KooWXyZaBcDe2222"
    state = {"master": one, "node_id": one, "nodes": {one: {"friendly_name": ""}, two: {"friendly_name": ""}},
             "runners": {}, "tasks": {},
             "instances": {"inst-1": {"model_id": "m", "shards": [{"node_id": one, "runner_id": "r"},
                                                                 {"node_id": two, "runner_id": "s"}]}}}
    last = last_rates([{"instance": "inst-1", "decode_tps": 3.0}, {"instance": "inst-1", "decode_tps": 12.34},
                       {"instance": None, "decode_tps": 9.0}, {"instance": "inst-1", "decode_tps": None}])
    assert last == {"inst-1": 12.34}
    console = Console(width=80, record=True)
    console.print(frame(state, {}, {"inst-1": 0.0}, last))
    out = console.export_text()
    assert "12D3KooWAbCd" in out and "12D3KooWXyZa" in out and "12.3 last" in out
    assert rate_text(None, None) == "-" and rate_text(0.0, None) == "0.0" and rate_text(7.25, 3.0) == "7.2"


def _words(table) -> list[str]:
    from exo_p2p.cli.output.fit import cell_text

    return [w for c in table.columns for cell in [c.header, *c.cells] for w in cell_text(cell).split()]


def _rendered(renderable, width: int = 80) -> str:
    from rich.console import Console

    console = Console(width=width, record=True)
    console.print(renderable)
    return console.export_text()


def _tables() -> list:
    from exo_p2p.cli.output import render

    self_id, peer_id = "12D3KooWSelfSelfSelfSelf", "12D3KooWPeerPeerPeerPeer"
    shards = [{"node_id": self_id, "rank": 0, "start_layer": 0, "end_layer": 15, "share_bytes": 59_000_000,
               "status": "connecting"},
              {"node_id": peer_id, "rank": 1, "start_layer": 15, "end_layer": 30, "share_bytes": 59_000_000,
               "status": "connecting"}]
    instances = [{"instance_id": "a1b2c3d4-1111-2222-3333-444455556666", "model": "smollm2-135m-instruct",
                  "sharding": "pipeline", "status": "loading", "layers_loaded": 10, "layers_total": 30, "shards": shards}]
    models = [{"model": "smollm2-135m-instruct", "family": "llama", "quantization": "4-bit, group 32, some modules 8-bit",
               "n_layers": 30, "storage_size": 108_000_000, "shardings": ["pipeline", "tensor"],
               "sharding_notes": {"tensor": "untested"}, "source": "embedded"},
              {"model": "qwen2.5-0.5b-instruct-4bit", "family": "qwen2", "quantization": "4-bit, group 64",
               "n_layers": 24, "storage_size": 300_000_000, "shardings": ["pipeline"], "source": "hf-cache"}]
    nodes = [{"node_id": self_id, "friendly_name": "alpha-workstation", "is_self": True, "is_master": True,
              "memory_total": 16 * 2**30, "memory_available": 6 * 2**30, "last_seen": 0.0},
             {"node_id": peer_id, "friendly_name": "beta", "memory_total": 8 * 2**30, "last_seen": 2.5}]
    previews = [{"sharding": "pipeline", "world_size": 2, "nodes": [self_id, peer_id], "layers": [[0, 15], [15, 30]],
                 "bytes": [59_000_000, 59_000_000], "error": None},
                {"sharding": "tensor", "world_size": 2, "error": "tensor sharding needs 9 heads divisible by 2"}]
    return [render.instances_table(instances, {self_id: "alpha-workstation"}), render.models_table(models),
            render.nodes_table(nodes), render.previews_table("smollm2-135m-instruct", previews, {})]


def test_tables_at_80_columns_cut_nothing_and_split_no_word() -> None:
    """Each table rendered 80 columns wide (a pipe, a narrow terminal): no line is wider, and
    every word of every cell is there whole (as a table with narrower columns, or as a list)."""
    from exo_p2p.cli.output.fit import fit

    for table in _tables():
        words = _words(table)
        out = _rendered(fit(table, 80))
        assert max(len(line) for line in out.splitlines()) <= 80, out
        missing = [w for w in words if w not in out]
        assert not missing, (missing, out)
    wide = _rendered(fit(_tables()[0], 200), 200)
    assert "rank 0: alpha-workstation layers [0, 15) 56.3 MiB connecting" in wide  # room: one line per shard


def test_fit_narrows_the_widest_column_first() -> None:
    from exo_p2p.cli.output.fit import column_widths

    assert column_widths([10, 40, 5], [8, 12, 5], 60) == [10, 40, 5]
    assert column_widths([10, 40, 5], [8, 12, 5], 30) == [9, 16, 5] or column_widths([10, 40, 5], [8, 12, 5], 30) == [10, 15, 5]
    assert column_widths([10, 40, 5], [8, 12, 5], 24) is None


@pytest.fixture
def served():
    from tests.support.fake_node import Served

    s = Served()
    yield s
    s.close()


@pytest.mark.integration
def test_place_min_nodes_says_it_waits_and_how_to_add_a_node(served, monkeypatch) -> None:
    from exo_p2p.cli.placement import commands as placement_cmds
    from tests.support.fake_node import error_lines, invoke

    monkeypatch.setattr(placement_cmds, "NODES_WAIT", 0.6)  # the fake cluster has 2 nodes, never 3
    result = invoke(["place", "smollm2-135m-instruct", "--min-nodes", "3", "--api", served.url])
    assert result.exit_code == 1
    assert "the cluster has 2 nodes; waiting up to 1 s for 1 more (--min-nodes 3)" in result.stderr
    (error,) = [line for line in error_lines(result) if line.startswith("error:")]
    assert "--min-nodes 3 needs 3 nodes, but the cluster has 2" in error and "`exo-p2p node`" in error
    assert "--bootstrap" in error and "min_nodes=" not in error and "mDNS finds it" in error
    assert "POST" not in [m for m, *_ in served.node.requests]
    served.node.mdns = False  # a --no-mdns node: mDNS finds no other node, only --bootstrap adds one
    result = invoke(["place", "smollm2-135m-instruct", "--min-nodes", "3", "--api", served.url])
    (error,) = [line for line in error_lines(result) if line.startswith("error:")]
    assert result.exit_code == 1 and "mDNS is off on this node (--no-mdns)" in error and "mDNS finds it" not in error
    assert "--bootstrap and an address `exo-p2p nodes` lists here" in error


@pytest.mark.integration
def test_place_min_nodes_of_a_placed_model_is_not_ignored(served) -> None:
    from tests.support.fake_node import invoke

    assert invoke(["place", "smollm2-135m-instruct", "--no-wait", "--api", served.url]).exit_code == 0
    result = invoke(["place", "smollm2-135m-instruct", "--min-nodes", "2", "--api", served.url])
    assert result.exit_code == 1
    assert "already has an instance (inst0001) on 1 node, fewer than --min-nodes 2" in result.stderr
    assert "exo-p2p stop smollm2-135m-instruct" in result.stderr and "--replica" in result.stderr
    # one node asked for, one node it has: place waits for it as before
    assert invoke(["place", "smollm2-135m-instruct", "--min-nodes", "1", "--api", served.url]).exit_code == 0


def test_place_and_chat_say_unknown_model_alike() -> None:
    """The master answers a placement and a request of a model it does not know in one
    wording (the CLI shows it as is, ``chat`` too)."""
    from exo_p2p.types import GenerationParams, PlaceInstance, State, SubmitTask
    from master.commands import handle_command

    place = handle_command(State(), PlaceInstance(command_id="c1", model_id="smolm2"))
    submit = handle_command(State(), SubmitTask.generation(command_id="c2", task_id="t", model_id="smolm2",
                                                      params=GenerationParams(messages=()), api_node_id="n"))
    for decision in (place, submit):
        assert decision.result.error.status == 404
        assert decision.result.error.message == "unknown model smolm2; models in the cluster: none"


def test_unknown_model_message_suggests_the_close_name() -> None:
    from exo_p2p.cli.messages import unknown_model_message

    known = ["smollm2-135m-instruct", "qwen2.5-0.5b-instruct"]
    assert unknown_model_message("smolm2-135m-instruct", known).startswith(
        "unknown model smolm2-135m-instruct — did you mean smollm2-135m-instruct?")
    assert "models in the cluster: qwen2.5-0.5b-instruct, smollm2-135m-instruct" in unknown_model_message("llama", known)


@pytest.mark.integration
def test_stop_and_place_of_a_misspelt_model(served) -> None:
    from tests.support.fake_node import error_lines, invoke

    result = invoke(["stop", "smolm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    assert error_lines(result) == ["error: unknown model smolm2-135m-instruct — did you mean smollm2-135m-instruct? "
                                   "(`exo-p2p models` lists them)"]
    result = invoke(["stop", "smollm2-135m-instruct", "--api", served.url])  # known, not placed
    assert result.exit_code == 1 and "no instance of smollm2-135m-instruct is placed" in result.stderr
    served.node.place_error = (404, "unknown model smollm2-135m-instuct; models in the cluster: smollm2-135m-instruct")
    result = invoke(["place", "smollm2-135m-instuct", "--api", served.url])
    assert result.exit_code == 1 and "error: unknown model smollm2-135m-instuct — did you mean smollm2-135m-instruct?" in result.stderr


def test_doctor_on_a_no_mdns_node_says_mdns_is_off() -> None:
    from exo_p2p.cli.queries.doctor_checks import Findings, diagnose

    me = {"node_id": "12D3KooWMe", "is_self": True, "friendly_name": "me", "addrs": ["/ip4/10.0.0.2/tcp/52514/p2p/x"]}
    off = "\n".join(diagnose(Findings(api_url="http://x", state={"mdns": False}, nodes=[me], mdns_types=[])))
    assert "mDNS: off on this node (--no-mdns)" in off and "hint: mDNS is off here" in off and "--bootstrap" in off
    assert "firewall" not in off and "5353" not in off
    on = "\n".join(diagnose(Findings(api_url="http://x", state={"mdns": True}, nodes=[me], mdns_types=[], mdns_seconds=2)))
    assert "hint: firewall: allow TCP port 52514" in on and "mDNS is off" not in on


def test_node_help_fits_a_screen_and_help_all_lists_every_flag() -> None:
    """``node --help`` at 80 columns: the common groups only, no default cut; ``--help-all``
    every flag the settings table has (but hidden ones)."""
    from exo_p2p.cli.cluster.node_flags import ALL_ONLY, HELP_PANELS
    from exo_p2p.settings.table import SETTINGS
    from tests.support.fake_node import invoke

    short = invoke(["node", "--help"], env={"COLUMNS": "80"})
    assert short.exit_code == 0
    lines = short.stdout.splitlines()
    assert len(lines) <= 90 and max(len(line) for line in lines) <= 80
    assert "…" not in short.stdout and "~/.local/share/exo-p2p" in short.stdout
    assert "--help-all" in short.stdout and "--api-port" in short.stdout and "--bootstrap" in short.stdout
    assert not [f for f in ALL_ONLY if f in short.stdout.replace("--help-all", "")]
    full = invoke(["node", "--help-all"], env={"COLUMNS": "80"})
    assert full.exit_code == 0 and "…" not in full.stdout
    shown = {s.flag for s in SETTINGS.values() if not s.hidden}
    assert not [f for f in shown if f not in full.stdout]
    assert shown == {f for flags in HELP_PANELS.values() for f in flags}  # every flag is in a group


def test_the_model_of_a_refused_body_is_read_safely() -> None:
    from exo_p2p.api.generation.rejected import asked_model

    assert asked_model(b'{"model": "m", "messages": 3}') == "m"
    assert asked_model(b"[" * 100_000) == "" and asked_model(b"{not json") == "" and asked_model(None) == ""
    assert asked_model(b'{"model": 5}') == "" and len(asked_model(b'{"model": "' + b"x" * 5000 + b'"}')) == 200


RECORDS = [{"started": 1.0, "status": 200, "family": "anthropic", "model": MODEL, "instance": "inst-12345678",
            "prompt_tokens": 1234, "cached_tokens": 1024, "completion_tokens": 300, "ttft": 12.41234, "decode_tps": 125.31,
            "finish_reason": "length", "request_id": "0123456789abcdef", "route": "load:busy", "moves": 2},
           {"started": 2.0, "status": 400, "family": "openai", "model": MODEL, "outcome": "refused",
            "request_id": "fedcba9876543210"}]


def test_logs_requests_rows_fit_80_columns_whole() -> None:
    """At 80 columns every row (heading included) fits, each value shown is whole and under
    its heading; route, request and family go first, and a wide terminal has every column."""
    from exo_p2p.cli.queries.requests_log import shown_columns

    head, *rows = [header_line(80), *(record_line(r, 80) for r in RECORDS)]
    assert max(len(line) for line in (head, *rows)) <= 80
    assert shown_columns(80) == ("time", "code", "model", "out", "ttft s", "tok/s", "end")
    assert "route" not in head and "family" not in head and "request" not in head
    assert "12.412" in rows[0] and "125.3" in rows[0] and "300" in rows[0] and MODEL in rows[0] and "length" in rows[0]
    assert rows[0].index("12.412") + len("12.412") == head.index("ttft s") + len("ttft s")
    assert " 400 " in rows[1] and "refused" in rows[1]
    wide = record_line(RECORDS[0], 200)
    assert "least loaded (prefix holder busy), moved 2x" in wide and "anthropic" in wide and "01234567" in wide
    assert shown_columns(100) == ("time", "code", "model", "instance", "in", "out", "ttft s", "tok/s", "end")


def test_logs_requests_command_uses_the_terminal_width(monkeypatch) -> None:
    """``exo-p2p logs requests`` in an 80-column terminal (COLUMNS) prints rows of at most 80
    characters; COLUMNS=200 every column (the node's API behind an ``httpx.MockTransport``)."""
    from typer.testing import CliRunner

    from exo_p2p.cli.main import app
    from exo_p2p.cli.node_api import client as client_module

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/requests"
        return httpx.Response(200, json={"records": RECORDS, "last": 2})

    monkeypatch.setattr(client_module, "answered_by", None)
    client_module.set_transport(httpx.MockTransport(handle))
    try:
        narrow = CliRunner().invoke(app, ["logs", "requests", "--api", "http://node.test:52515"], env={"COLUMNS": "80"})
        wide = CliRunner().invoke(app, ["logs", "requests", "--api", "http://node.test:52515"], env={"COLUMNS": "200"})
    finally:
        client_module.set_transport(None)
    assert narrow.exit_code == 0 and wide.exit_code == 0, (narrow.output, wide.output)
    lines = narrow.stdout.splitlines()
    assert len(lines) == 3 and max(len(line) for line in lines) <= 80 and "ttft s" in lines[0], narrow.stdout
    assert "route" in wide.stdout.splitlines()[0] and "least loaded (prefix holder busy)" in wide.stdout


def test_doctor_report_folds_at_80_columns_between_words() -> None:
    """The report's prose folds at 80 columns between words, under its ``hint:`` label; an
    address line stays whole (it is copied into --bootstrap)."""
    from exo_p2p.cli.output.readable import wrapped_lines
    from exo_p2p.cli.queries.doctor_checks import Findings, diagnose

    address = "/ip4/10.0.0.2/tcp/52514/p2p/12D3KooWKgXx4XFvd9svGjJUJbDCwjwcNjFf6fphCn7uB5DEW3te"
    me = {"node_id": "12D3KooWMe", "is_self": True, "friendly_name": "me", "addrs": [address]}
    lines = diagnose(Findings(api_url="http://x", state={"mdns": False}, nodes=[me], mdns_types=[]))
    assert max(map(len, lines)) > 80  # what a narrow terminal used to split mid-word
    out = wrapped_lines(lines, 80)
    assert " ".join(" ".join(out).split()) == " ".join(" ".join(lines).split())  # every word, whole, in order
    assert [line for line in out if address in line] == [f"  address: {address}"]
    assert all(len(line) <= 80 for line in out if address not in line), out
    hint = next(i for i, line in enumerate(out) if line.startswith("hint: mDNS is off"))
    assert out[hint + 1].startswith(" " * len("hint: ")) and not out[hint + 1].startswith(" " * 7)


def test_a_nodes_unknown_model_error_gets_the_clis_one_wording() -> None:
    """Whatever route answered (the master's list, a bare 404, the Anthropic family's
    ``model:`` prefix), every command says ``unknown model NAME — did you mean …`` alike."""
    from exo_p2p.cli.messages import reworded_unknown_model

    hint = "unknown model smolm2 — did you mean smollm2? (`exo-p2p models` lists them)"
    assert reworded_unknown_model("unknown model smolm2; models in the cluster: smollm2, qwen") == hint
    assert reworded_unknown_model("model: unknown model smolm2", ["qwen", "smollm2"]) == hint
    assert reworded_unknown_model("unknown model zzz; models in the cluster: none") == (
        "unknown model zzz; models in the cluster: none (`exo-p2p models` lists them)")
    assert reworded_unknown_model("unknown model zzz") == "unknown model zzz (`exo-p2p models` lists them)"
    assert reworded_unknown_model("no instance abc") is None and reworded_unknown_model("unknown model a b") is None


@pytest.mark.integration
def test_chat_and_embed_of_a_misspelt_model_say_did_you_mean(served) -> None:
    from tests.support.fake_node import error_lines, invoke

    served.node.strict_models = True
    expected = ["error: unknown model smolm2-135m-instruct — did you mean smollm2-135m-instruct? "
                "(`exo-p2p models` lists them)"]
    for args in (["chat", "hi", "-m", "smolm2-135m-instruct"], ["embed", "smolm2-135m-instruct", "hi"]):
        result = invoke([*args, "--api", served.url])
        assert result.exit_code == 1 and error_lines(result) == expected, (args, result.stderr)


def test_nodes_addresses_start_in_one_column() -> None:
    from exo_p2p.cli.output.render import address_lines

    lines = address_lines([{"node_id": "12D3KooWA", "friendly_name": "beta", "addrs": ["/ip4/127.0.0.1/tcp/1/p2p/A"]},
                           {"node_id": "12D3KooWB", "friendly_name": "alpha-workstation", "addrs": ["/ip4/10.0.0.2/tcp/2/p2p/B"]}])
    assert [line.index("/ip4/") for line in lines] == [len("  alpha-workstation  ")] * 2, lines
    assert lines[0].split() == ["beta", "/ip4/127.0.0.1/tcp/1/p2p/A"] and address_lines([]) == []


def test_the_models_commands_other_tables_fit_80_columns_whole() -> None:
    """``models``' tables of what this node cannot serve and of the cluster's copies, with
    long names and reasons, at 80 columns: no line wider, every word whole."""
    from exo_p2p.cli.output import render
    from exo_p2p.cli.output.fit import fit

    unsupported = [{"model": "lmstudio:some-publisher/Very-Long-Model-Name-Instruct-GGUF@q4_k_m", "source": "lmstudio",
                    "reason": "its architecture DeepseekV3ForCausalLM has no implementation in mlx-lm 0.29 on this node"}]
    cluster = [{"model": "ollama:llama3.2:3b-instruct-q4_K_M", "manifests": [
        {"digest": "9eacc2e78167aa00ff", "complete": ["12D3KooWSelfSelfSelfSelf", "12D3KooWPeerPeerPeerPeer"],
         "partial": ["12D3KooWOtherOtherOther"]}]}]
    names = {"12D3KooWSelfSelfSelfSelf": "alpha-workstation", "12D3KooWPeerPeerPeerPeer": "beta-laptop"}
    for table in (render.unsupported_table(unsupported), render.cluster_models_table(cluster, names)):
        words = _words(table)
        out = _rendered(fit(table, 80))
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert not [w for w in words if w not in out], out


@pytest.mark.integration
def test_place_goes_on_with_a_placement_the_cluster_confirmed_late(served, monkeypatch) -> None:
    """A busy master answers 503 "did not confirm the change within 10 s; retry" though the
    instance is then placed: ``place`` finds it and waits for it (exit 0) rather than telling
    the user to retry; when none appears it says nothing was placed."""
    from exo_p2p.cli.placement import unconfirmed
    from tests.support.fake_node import error_lines, invoke

    served.node.place_unconfirmed = True
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert "did not confirm the placement within 10 s" in result.stderr
    assert "placed smollm2-135m-instruct as instance inst0001" in result.stdout and "is ready" in result.stdout
    served.node.instances.clear()
    served.node.place_error = (503, "the cluster did not confirm the change within 10 s; retry")  # and nothing placed
    monkeypatch.setattr(unconfirmed, "LATE_WAIT", 0.5)
    result = invoke(["place", "smollm2-135m-instruct", "--api", served.url])
    assert result.exit_code == 1
    assert error_lines(result)[-1] == ("error: the cluster did not confirm the change within 10 s; retry: no instance of "
                                       "smollm2-135m-instruct appeared within 0.5 s after it, so nothing was placed; run "
                                       "`exo-p2p place smollm2-135m-instruct` again")


@pytest.mark.integration
def test_run_goes_on_with_a_placement_the_cluster_confirmed_late(served) -> None:
    from tests.support.fake_node import invoke

    served.node.place_unconfirmed = True
    result = invoke(["run", "smollm2-135m-instruct", "hi", "--api", served.url])
    assert result.exit_code == 0, result.output
    assert "The capital of France is Paris." in result.stdout
