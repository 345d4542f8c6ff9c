"""Metrics and request records without processes: ``exo_p2p.metrics`` (the registry, the
scrape-time collector, the request log) and ``exo_p2p.api.generation.request_trace``, and ``GET
/metrics``/``GET /requests`` with their access rules on the fake backend of ``tests.test_api``.
The same against real nodes: ``tests/test_metrics_nodes.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from exo_p2p.api.access import AccessPolicy, key_id
from exo_p2p.api.generation.request_trace import RequestTrace, outcome_word
from exo_p2p.metrics.collect import MetricSources, NodeCounts, RunnerFigures, count_event
from exo_p2p.metrics.observer import Observer
from exo_p2p.metrics.registry import NodeMetrics
from exo_p2p.metrics.request_log import RequestLog
from exo_p2p.types import (
    CommandResult,
    FinishChunk,
    MasterElected,
    RunnerFailed,
    RunnerIdle,
    RunnerStatusUpdated,
    State,
    TokenChunk,
)
from exo_p2p.types.observe import EngineStats, RequestRecord
from tests.support.fake_master import MODEL, chat_body
from tests.support.metrics_scrape import KEY, _run, samples, value


def record(**kw: Any) -> RequestRecord:
    base = dict(request_id="r1", family="openai", model="m", status=200, outcome="complete", started=1.0,
                duration=0.5, instance="i1", finish_reason="stop", prompt_tokens=7, cached_tokens=3,
                completion_tokens=5, ttft=0.2, decode_tps=20.0)
    return RequestRecord(**{**base, **kw})


def test_observe_counts_and_bounds_labels() -> None:
    metrics = NodeMetrics(known_model=lambda m: m == "m")
    metrics.observe(record())
    metrics.observe(record(model="made-up-by-a-client", family="evil", status=404, finish_reason=None))
    text = metrics.exposition().decode()
    assert value(text, "exo_requests_total", kind="generate", family="openai", model="m", status="200") == 1
    assert value(text, "exo_requests_total", kind="generate", family="other", model="other", status="404") == 1
    assert value(text, "exo_prompt_tokens_total", model="m", instance="i1") == 7
    assert value(text, "exo_cached_prompt_tokens_total", model="m", instance="i1") == 3
    assert value(text, "exo_completion_tokens_total", model="m", instance="i1") == 5
    assert value(text, "exo_time_to_first_token_seconds_count", model="m") == 1
    assert value(text, "exo_time_per_output_token_seconds_sum", model="m") == pytest.approx(0.05)
    assert "made-up" not in text and "evil" not in text


def test_collector_reads_sources_and_master_view() -> None:
    stats = EngineStats(queued=2, batch_rows=3, batch_limit=16, kv_tokens=100, kv_capacity_tokens=1000,
                        kv_bytes_per_token=4, cache_tokens=50, cache_bound_tokens=200, cache_hits_total=5,
                        cache_misses_total=1, reused_tokens_total=70)
    counts = NodeCounts(transfer_bytes={"peer-a": 1234})
    master = [True]
    sources = MetricSources(state=lambda: State(term=3, last_event_idx=42), node_id="n",
                            is_master=lambda: master[0], runners=lambda: [RunnerFigures("i1", "m", 0, stats)],
                            counters={"dropped": 2}.copy, counts=counts)
    metrics = NodeMetrics(sources=sources)
    for event in (MasterElected("n", 3), RunnerStatusUpdated("r", "i1", "n", RunnerIdle()),
                  RunnerStatusUpdated("r", "i1", "n", RunnerFailed("x")), RunnerStatusUpdated("r", "i1", "o", RunnerIdle())):
        count_event(counts, event, "n")  # type: ignore[arg-type]
    text = metrics.exposition().decode()
    runner = {"instance": "i1", "model": "m", "rank": "0"}
    assert value(text, "exo_term") == 3 and value(text, "exo_log_index") == 42
    assert value(text, "exo_term_changes_total") == 1
    assert value(text, "exo_runners_started_total") == 1 and value(text, "exo_runner_failures_total") == 1
    assert value(text, "exo_runner_queue_length", **runner) == 2
    assert value(text, "exo_runner_batch_rows", **runner) == 3
    assert value(text, "exo_runner_kv_bytes", **runner) == 400
    assert value(text, "exo_runner_kv_budget_bytes", **runner) == 4000
    assert value(text, "exo_prompt_cache_hits_total", **runner) == 5
    assert value(text, "exo_prompt_cache_reused_tokens_total", **runner) == 70
    assert value(text, "exo_model_transfer_bytes_total", source="peer-a") == 1234
    assert value(text, "exo_node_counter", counter="dropped") == 2
    assert value(text, "exo_cluster_nodes") == 0 and "exo_cluster_instances" in text
    master[0] = False
    assert "exo_cluster_nodes" not in metrics.exposition().decode()


def test_trace_record_and_status() -> None:
    clock = iter([10.0, 10.125, 10.5, 11.5, 12.0]).__next__
    trace = RequestTrace("t1", "openai", "m", key_id="k", clock=clock, wall=lambda: 1000.0)
    trace.routed(CommandResult("c", instance_id="i1", route="prefix:40"))
    trace.chunk(TokenChunk(task_id="t1", text="a", completion_tokens=1))
    trace.chunk(FinishChunk(task_id="t1", finish_reason="stop", prompt_tokens=9, completion_tokens=3, cached_tokens=4,
                            ttft=0.25, queued=0.0625))
    rec = trace.record("complete, stop")
    assert (rec.status, rec.outcome, rec.ttft, rec.decode_tps, rec.duration) == (200, "complete", 0.5, 2.0, 2.0)
    assert (rec.routed, rec.runner_ttft, rec.runner_queued) == (0.125, 0.25, 0.0625)  # the TTFT's parts
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens, rec.route, rec.key_id) == (9, 4, 3, "prefix:40", "k")
    assert rec.prompt is None and rec.output is None
    assert RequestTrace("t", "openai", "m").status("refused 503") == 503
    assert RequestTrace("t", "openai", "m").status("error 400 before output") == 400
    assert RequestTrace("t", "openai", "m").status("client disconnected") == 499
    assert RequestTrace("t", "openai", "m").status("unanswered") == 500
    assert outcome_word("client disconnected") == "disconnected" and outcome_word("streamed, stop") == "streamed"


def test_request_log_rotates_and_serves_recent(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    rlog = RequestLog(path, max_bytes=600, recent=3)
    for i in range(6):
        rlog.write(record(request_id=f"r{i}"))
    rotated = path.with_name("requests.jsonl.1")
    assert rotated.exists() and path.stat().st_size <= 600 and rotated.stat().st_size <= 600
    lines = [msgspec.json.decode(line, type=RequestRecord) for line in path.read_bytes().splitlines()]
    assert lines[-1].request_id == "r5"
    recs, last = rlog.since(0)
    assert [r.request_id for r in recs] == ["r3", "r4", "r5"] and last == 6
    assert rlog.since(6) == ([], 6)
    assert [r.request_id for r in rlog.since(4, limit=1)[0]] == ["r4"]


def test_request_log_gives_up_an_unwritable_file(tmp_path: Path) -> None:
    rlog = RequestLog(tmp_path / "missing-dir" / "requests.jsonl")
    rlog.write(record())
    assert rlog.path is None and rlog.since(0)[1] == 1


def test_metrics_and_records_through_the_api() -> None:
    observer = Observer(NodeMetrics(known_model=lambda m: m == MODEL), RequestLog(None))

    async def body(http: httpx.AsyncClient) -> None:
        auth = {"authorization": f"Bearer {KEY}"}
        r = await http.post("/v1/chat/completions", json=chat_body(), headers=auth)
        assert r.status_code == 200
        usage = r.json()["usage"]
        r = await http.post("/v1/chat/completions", json=chat_body(model="nope"), headers=auth)
        assert r.status_code == 404
        text = (await http.get("/metrics", headers=auth)).text
        assert value(text, "exo_requests_total", kind="generate", family="openai", model=MODEL, status="200") == 1
        assert value(text, "exo_requests_total", kind="generate", family="openai", model="other", status="404") == 1
        got = sum(v for (n, _), v in samples(text).items() if n == "exo_completion_tokens_total")
        assert got == usage["completion_tokens"]
        recs = (await http.get("/requests", headers=auth)).json()
        assert [r["status"] for r in recs["records"]] == [200, 404] and recs["last"] == 2
        assert recs["records"][0]["key_id"] == key_id(KEY) and KEY not in str(recs)
        assert (await http.get("/requests?after=2", headers=auth)).json() == {"records": [], "last": 2}
        assert (await http.get("/requests?after=x", headers=auth)).status_code == 400
        assert (await http.get("/requests?limit=0", headers=auth)).status_code == 400

    _run(body, access=AccessPolicy.of([KEY]), observer=observer)


@pytest.mark.parametrize("metrics_on,records_on", [(False, False), (True, False), (False, True)])
def test_metrics_or_records_off(metrics_on: bool, records_on: bool) -> None:
    """``--no-metrics`` / ``--no-request-records``: that part is None, its endpoint a 404
    naming the flag, and requests are served as before."""
    observer = Observer(NodeMetrics(known_model=lambda m: m == MODEL) if metrics_on else None,
                        RequestLog(None) if records_on else None)
    assert observer.active == (metrics_on or records_on)

    async def body(http: httpx.AsyncClient) -> None:
        assert (await http.post("/v1/chat/completions", json=chat_body())).status_code == 200
        metrics, records = await http.get("/metrics"), await http.get("/requests")
        if metrics_on:
            assert value(metrics.text, "exo_requests_total", kind="generate", family="openai", model=MODEL, status="200") == 1
        else:
            assert metrics.status_code == 404 and "--no-metrics" in metrics.json()["error"]["message"]
        if records_on:
            assert [r["status"] for r in records.json()["records"]] == [200]
        else:
            assert records.status_code == 404 and "--no-request-records" in records.json()["error"]["message"]

    _run(body, observer=observer)


@pytest.mark.parametrize("open_flag,client,status", [
    (False, ("127.0.0.1", 5000), 401),
    (True, ("127.0.0.1", 5000), 200),
    (True, ("::1", 5000), 200),
    (True, ("192.168.1.9", 5000), 401),
])
def test_metrics_key_rule(open_flag: bool, client: tuple[str, int], status: int) -> None:
    async def body(http: httpx.AsyncClient) -> None:
        assert (await http.get("/metrics")).status_code == status
        assert (await http.get("/requests")).status_code == 401  # records need the key, always
        assert (await http.get("/metrics", headers={"authorization": f"Bearer {KEY}"})).status_code == 200

    _run(body, access=AccessPolicy.of([KEY], metrics_loopback_open=open_flag), client=client)


def test_top_frame_and_rates() -> None:
    from rich.console import Console

    from exo_p2p.cli.queries.top import Rates, frame, parse_metrics, tokens_by_instance

    text = ('exo_runner_generated_tokens_total{instance="inst-1",model="m",rank="0"} 100\n'
            'exo_completion_tokens_total{instance="inst-2",model="m"} 40\nexo_requests_in_flight 2\n')
    samples = parse_metrics(text)
    assert tokens_by_instance(samples) == {"inst-1": 100.0, "inst-2": 40.0}
    rates = Rates({"inst-1": 50.0}, 10.0)
    assert rates.update({"inst-1": 100.0, "inst-2": 40.0}, 12.0) == {"inst-1": 25.0, "inst-2": 0.0}
    state = {"master": "node-aaaa1", "term": 2, "last_event_idx": 9, "node_id": "node-aaaa1",
             "nodes": {"node-aaaa1": {"friendly_name": "box", "memory_available": 2**30, "memory_total": 2**31}},
             "runners": {"r1": {"node_id": "node-aaaa1", "status": {"kind": "running"}}},
             "instances": {"inst-1": {"model_id": "m", "settings": {"max_batch": 4},
                                      "shards": [{"node_id": "node-aaaa1", "runner_id": "r1"}]}},
             "tasks": {"t1": {"task": {"instance_id": "inst-1"}, "status": "running"},
                       "t2": {"task": {"instance_id": "inst-1"}, "status": "pending"}}}
    console = Console(width=160, record=True)
    console.print(frame(state, samples, {"inst-1": 25.0}))
    out = console.export_text()
    assert "master box" in out and "2 requests in flight" in out
    assert "inst-1" in out and "ready" in out and "1/4" in out and "25.0" in out


def test_every_metric_is_documented_and_the_dashboard_names_only_real_ones() -> None:
    import json
    import re

    root = Path(__file__).resolve().parents[1]
    stats = EngineStats()
    sources = MetricSources(state=State, node_id="n", is_master=lambda: True,
                            runners=lambda: [RunnerFigures("i", "m", 0, stats)], counters={"x": 1}.copy,
                            counts=NodeCounts(transfer_bytes={"p": 1}))
    metrics = NodeMetrics(sources=sources)
    metrics.observe(record(route="prefix:3"))
    names = {family.name for family in metrics.registry.collect()}
    assert len(names) > 30
    page = (root / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"`(exo_[a-z_]+)`", page))
    exported = {n + "_total" if any(f.name == n and f.type == "counter" for f in metrics.registry.collect()) else n
                for n in names}
    assert exported <= documented, exported - documented
    dashboard = json.loads((root / "docs" / "grafana-exo-p2p.json").read_text())
    used = {n for p in dashboard["panels"] for t in p["targets"] for n in re.findall(r"exo_[a-z_]+", t["expr"])}
    samples_ = {s.name for f in metrics.registry.collect() for s in f.samples}
    assert used and used <= samples_, used - samples_
