"""Metrics and request records on two real node processes with an API key: a workload
through both nodes' APIs (OpenAI chat plain and streamed, Anthropic, a refused request, a
second conversation turn that reuses the prompt cache), then each node's ``GET /metrics``
matches what the clients were told exactly (requests, prompt and completion tokens), its
histograms are not empty, the runner's figures come from the node that hosts it, the
cluster view from the master alone; a scrape without the key is 401 except on the node
started with ``--metrics-loopback-open``; one record per request on each API node, in
``GET /requests`` and in ``requests.jsonl``, the key never in them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from exo_p2p.cli.output.readable import NODE_ID_CHARS, short_ids
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until
from tests.support.metrics_scrape import samples, value

pytestmark = pytest.mark.integration
MODEL = "tiny-metrics"
KEY = "sk-metrics-nodes-1"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_synthetic_model(models / MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=5)
    common = ["--prompt-cache-bytes", str(8 * 2**20)]
    a = NodeProcess(tmp_path_factory.mktemp("a"), api_key=KEY, extra_args=[*common, "--models-dir", str(models),
                                                                            "--metrics-loopback-open"])
    started = [a]
    with nodes_cleanup(started):
        a.start()
        b = NodeProcess(tmp_path_factory.mktemp("b"), cluster=a.cluster, api_key=KEY,
                        extra_args=[*common, *sum((["--bootstrap", x] for x in a.addrs()), [])])
        started.append(b)
        b.start()
        wait_until(lambda: converged([a, b], 2), 30, what="two nodes converged")
        r = httpx.post(f"{a.url}/instances", json={"model": MODEL, "nodes": [a.get("/health", headers=AUTH).json()["node_id"]]},
                       headers=AUTH, timeout=120)
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]
        wait_until(lambda: a.get(f"/instances/{iid}", headers=AUTH).json()["status"] == "ready", 120, what="ready")
        wait_until(lambda: b.get(f"/instances/{iid}", headers=AUTH).json()["status"] == "ready", 30, what="ready on b")
        yield a, b, iid


def chat(node: NodeProcess, messages: list[dict], **extra) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, **extra}
    r = httpx.post(f"{node.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def chat_stream(node: NodeProcess, content: str) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 9, "stream": True,
            "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", f"{node.url}/v1/chat/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    return usage


def anthropic(node: NodeProcess, content: str) -> dict:
    body = {"model": MODEL, "max_tokens": 7, "messages": [{"role": "user", "content": content}]}
    r = httpx.post(f"{node.url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=120)
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    # Anthropic counts prompt-cache reads apart: the prompt is their sum
    return {"prompt_tokens": u["input_tokens"] + u["cache_read_input_tokens"], "completion_tokens": u["output_tokens"]}


def total(text: str, name: str) -> float:
    return sum(v for (n, _), v in samples(text).items() if n == name)


def test_scrapes_match_the_workload(nodes) -> None:
    a, b, iid = nodes
    sent: dict[str, list[dict]] = {"a": [], "b": []}
    first = [{"role": "user", "content": "tell me about the sea and the ships on it"}]
    turn1 = chat(a, first)
    sent["a"].append(turn1)
    answer = httpx.post(f"{a.url}/v1/chat/completions", headers=AUTH, timeout=120,
                        json={"model": MODEL, "messages": first, "max_tokens": 12, "temperature": 0}).json()
    sent["a"].append(answer["usage"])
    turn2 = [*first, {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
             {"role": "user", "content": "and the fish?"}]
    sent["a"].append(chat(a, turn2))
    sent["a"].append(chat_stream(a, "a streamed question"))
    sent["b"].append(chat(b, [{"role": "user", "content": "from the other node"}]))
    sent["b"].append(chat_stream(b, "streamed from the other node"))
    sent["b"].append(anthropic(b, "an anthropic question"))
    refused = httpx.post(f"{b.url}/v1/chat/completions", headers=AUTH, timeout=30,
                         json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert refused.status_code == 404

    scraped = {name: n.get("/metrics", headers=AUTH).text for name, n in (("a", a), ("b", b))}
    for name, usages in sent.items():
        text = scraped[name]
        ok = value(text, "exo_requests_total", kind="generate", family="openai", model=MODEL, status="200")
        ok += value(text, "exo_requests_total", kind="generate", family="anthropic", model=MODEL, status="200")
        assert ok == len(usages), (name, text)
        assert total(text, "exo_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
        assert total(text, "exo_completion_tokens_total") == sum(u["completion_tokens"] for u in usages)
        assert value(text, "exo_time_to_first_token_seconds_count", model=MODEL) == len(usages)
        assert value(text, "exo_time_per_output_token_seconds_count", model=MODEL) >= 1
    assert value(scraped["b"], "exo_requests_total", kind="generate", family="openai", model="other", status="404") == 1
    assert total(scraped["a"], "exo_cached_prompt_tokens_total") > 0  # the second turn reused the first's KV

    runner = {"instance": iid, "model": MODEL, "rank": "0"}
    cached = sum(total(t, "exo_cached_prompt_tokens_total") for t in scraped.values())  # a's runner served both APIs
    wait_until(lambda: value(a.get("/metrics", headers=AUTH).text, "exo_prompt_cache_reused_tokens_total", **runner) == cached,
               15, what="the runner's figures of the last request in a heartbeat")
    text = a.get("/metrics", headers=AUTH).text
    assert value(text, "exo_runner_batch_limit", **runner) >= 1 and value(text, "exo_prompt_cache_hits_total", **runner) >= 1
    assert value(text, "exo_runner_batch_rows", **runner) == 0 and value(text, "exo_runner_queue_length", **runner) == 0
    assert "exo_runner_batch_limit{" not in b.get("/metrics", headers=AUTH).text  # b hosts no runner
    masters = [n for n in (a, b) if value(n.get("/metrics", headers=AUTH).text, "exo_is_master") == 1]
    assert len(masters) == 1
    for n in (a, b):
        has_view = "exo_cluster_nodes " in n.get("/metrics", headers=AUTH).text
        assert has_view == (n is masters[0])
        assert value(n.get("/metrics", headers=AUTH).text, "exo_log_index") > 0


def test_key_rule_and_records(nodes) -> None:
    a, b, iid = nodes
    assert httpx.get(f"{b.url}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{a.url}/metrics", timeout=10).status_code == 200  # --metrics-loopback-open
    assert httpx.get(f"{a.url}/requests", timeout=10).status_code == 401
    bad = httpx.post(f"{b.url}/v1/chat/completions", headers=AUTH, timeout=30,
                     json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})
    assert bad.status_code == 400  # refused before it became a job: recorded all the same
    recs = b.get("/requests", headers=AUTH).json()["records"]
    assert [r["status"] for r in recs][-5:] == [200, 200, 200, 404, 400]
    assert recs[-1]["model"] == MODEL and recs[-1]["outcome"] == "refused"
    done = [r for r in recs if r["status"] == 200]
    for r in done:
        assert r["instance"] == iid and r["nodes"] and r["ttft"] > 0 and r["completion_tokens"] > 0
        assert r["family"] in ("openai", "anthropic") and r["key_id"] and r["finish_reason"]
        assert r["prompt"] is None and r["output"] is None
    lines = (b.data_dir / "requests.jsonl").read_text().splitlines()
    assert len(lines) == len(recs) and KEY not in "".join(lines)
    assert KEY not in (b.data_dir / "node.log").read_text()
    out = subprocess.run([sys.executable, "-m", "exo_p2p", "logs", "requests", "--api", b.url, "--api-key", KEY, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["request_id"] for line in out.stdout.splitlines()] == [r["request_id"] for r in recs]
    out = subprocess.run([sys.executable, "-m", "exo_p2p", "logs", "requests", "--api", b.url, "--api-key", KEY, "-n", "1"],
                         capture_output=True, text=True, timeout=60)
    heading, line = out.stdout.splitlines()  # a heading row, then the newest record
    assert out.returncode == 0 and "ttft s" in heading and " 400 " in line and "-s" not in line, out
    out = subprocess.run([sys.executable, "-m", "exo_p2p", "top", "--once", "--api", a.url, "--api-key", KEY],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stderr
    assert MODEL in out.stdout and iid[:8] in out.stdout and "ready" in out.stdout, out.stdout
    row = next(line for line in out.stdout.splitlines() if iid[:8] in line)
    # a rate after the traffic above, never "-"; then the drafts column ("-": speculation is off by default)
    assert re.search(r"\d+\.\d( last)? *│ *(-|\d+%) *│$", row.rstrip()), row
    ids = [n.get("/health", headers=AUTH).json()["node_id"] for n in (a, b)]
    assert all(short_ids(ids, NODE_ID_CHARS)[i] in out.stdout for i in ids), out.stdout  # told apart
