"""What a new user meets in their first hour with the CLI (docs/cli.md): the headings and words
of ``logs requests``, refused generation requests in the records, ``top``'s node column and
rate, the wording of ``place`` / ``stop`` / ``chat`` errors, tables at 80 columns."""

from __future__ import annotations

import httpx

from exo_p2p.api.access import AccessPolicy
from exo_p2p.cli.observe_cmds import COLUMNS, header_line, record_line, route_text
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.metrics.request_log import RequestLog
from tests.test_api import MODEL, chat_body
from tests.test_metrics import KEY, _run, value


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
        assert value(text, "exo_requests_total", family="openai", model=MODEL, status="400") == 1

    _run(body, access=AccessPolicy.of([KEY]), observer=observer)
