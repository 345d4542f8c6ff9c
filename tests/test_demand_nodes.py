"""Placement on demand and idle unload on real nodes (two on loopback, tiny synthetic models),
through the official clients (docs/models.md "Placement on demand and idle unload"):

- ``ollama.chat`` on a model nothing placed: it is placed and answers;
- 8 concurrent first requests through both nodes' APIs: one placement, 8 answers;
- ``keep_alive: 0``: the instance is gone within a few seconds of the answer; ``/metrics``
  counts the placements on demand (by outcome) and that unload (reason ``request``) on every node;
- ``keep_alive: "2s"``: gone about 2 s after the answer, and not while a long stream runs;
  ``/api/ps`` shows that deadline;
- a model that cannot be placed: 503 with the placement's explanation, the second request
  answered from the negative cache without another placement;
- Ollama's preload (no messages) places the model, the unload idiom (``keep_alive: 0``) unloads it;
- ``--alias 'claude-*=tiny-f'`` on one node: the ``anthropic`` client asking either node for
  ``claude-sonnet-4-5`` gets an answer (placed on demand); ``/v1/models`` and ``/api/tags`` list it.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime

import httpx
import pytest

from tests.support.cluster import Cluster, NodeProcess, converged, state_of, wait_until
from tests.support.metrics_scrape import value
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = pytest.mark.integration
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

MODELS = ("tiny-a", "tiny-b", "tiny-c", "tiny-d", "tiny-e", "tiny-f")
HUGE = "tiny-huge"
SLACK = 5.0  # load on a shared 2-core machine (docs/testing.md "Bounds")
POLL = 0.25  # master.role's pass: the idle check runs every 0.25 s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for i, name in enumerate(MODELS):
        make_synthetic_model(models / name, n_layers=2, hidden_size=64, intermediate_size=128, seed=20 + i, context_length=4096)
    # ~216 MB of weights: the 64 MiB each node offers leave no room for it on either or both,
    # so its placement fails with the placement's reason
    make_synthetic_model(models / HUGE, n_layers=6, hidden_size=1024, intermediate_size=2048, seed=3)
    c = Cluster(tmp_path_factory.mktemp("cluster"), 2, extra_args=["--models-dir", str(models), "--memory-limit", "64MiB"])
    try:
        first = NodeProcess(c.base / "node0", cluster=c.name, extra_args=c.extra_args).start()
        c.nodes.append(first)
        # the second node alone declares the alias; the first one's API resolves it too
        c.add("node1", bootstrap=first.addrs(), extra=["--alias", "claude-*=tiny-f"])
        wait_until(lambda: converged(c.nodes, 2), 30, what="cluster convergence")
        yield c
    finally:
        c.stop()


def instances_of(node: NodeProcess, model: str) -> list[dict]:
    state = state_of(node) or {}
    return [i for i in state.get("instances", {}).values() if i["model_id"] == model]


def usage_of(node: NodeProcess, instance_id: str) -> dict | None:
    return (state_of(node) or {}).get("usage", {}).get(instance_id)


def test_ollama_chat_on_an_unplaced_model_places_it_and_answers(cluster) -> None:
    a, b = cluster.nodes
    assert instances_of(a, "tiny-a") == []
    client = ollama.Client(host=b.url, timeout=300)
    reply = client.chat(model="tiny-a", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 8, "temperature": 0})
    assert reply.message.content and reply.done
    (instance,) = instances_of(a, "tiny-a")
    usage = usage_of(a, instance["instance_id"])
    assert usage["on_demand"] and usage["keep_alive"] == 300.0 and usage["served"], usage


def test_eight_concurrent_first_requests_make_one_placement(cluster) -> None:
    answers: list[str] = []
    errors: list[BaseException] = []

    def ask(node: NodeProcess) -> None:
        try:
            client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
            reply = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            answers.append(reply.choices[0].message.content)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(cluster.nodes[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(360)
    assert not errors, errors
    assert len(answers) == 8 and all(answers), answers
    assert len(instances_of(cluster.nodes[0], "tiny-b")) == 1


def test_keep_alive_zero_unloads_once_the_answer_is_given(cluster) -> None:
    a, b = cluster.nodes
    client = ollama.Client(host=a.url, timeout=300)
    reply = client.chat(model="tiny-c", messages=[{"role": "user", "content": "hi"}], keep_alive=0, options={"num_predict": 4})
    answered = time.monotonic()
    assert reply.message.content
    wait_until(lambda: not instances_of(b, "tiny-c"), SLACK, interval=0.1, what="tiny-c unloaded")
    assert time.monotonic() - answered < SLACK
    counters = [(state_of(n) or {}).get("counters", {}) for n in cluster.nodes]
    assert sum(c.get("unload_idle", 0) for c in counters) >= 1, counters  # the master's count, by reason
    assert sum(c.get("placements_on_demand", 0) for c in counters) >= 3, counters  # tiny-a, tiny-b, tiny-c
    # GET /metrics: each API counts the placements it sent by outcome; every node counts the
    # master's unloads by reason from the log, so both show the keep_alive 0 unload
    placed = sum(value(n.get("/metrics").text, "exo_placements_on_demand_total", outcome="placed") for n in cluster.nodes)
    assert placed >= 3, placed
    assert value(a.get("/metrics").text, "exo_placements_on_demand_total", outcome="placed") >= 1  # tiny-c, sent by a
    for node in cluster.nodes:
        wait_until(lambda n=node: value(n.get("/metrics").text, "exo_instance_unloads_total", reason="request") >= 1, SLACK,
                   interval=0.1, what="the keep_alive 0 unload counted")


def test_a_two_second_keep_alive_unloads_after_about_two_idle_seconds_never_during_a_stream(cluster) -> None:
    a, b = cluster.nodes
    client = ollama.Client(host=b.url, timeout=300)
    client.chat(model="tiny-d", messages=[{"role": "user", "content": "hi"}], keep_alive="2s", options={"num_predict": 4})
    answered, answered_wall = time.monotonic(), time.time()
    (model,) = [m for m in httpx.get(f"{a.url}/api/ps", timeout=10).json()["models"] if m["name"].startswith("tiny-d")]
    expires = datetime.fromisoformat(model["expires_at"].replace("Z", "+00:00")).timestamp()
    assert abs(expires - (answered_wall + 2.0)) < SLACK, (expires, answered_wall)
    wait_until(lambda: not instances_of(a, "tiny-d"), 2.0 + SLACK, interval=0.1, what="tiny-d unloaded")
    assert time.monotonic() - answered >= 2.0 - POLL * 2  # not before its keep-alive
    # a stream longer than the keep-alive: the instance stays while it runs. Greedy: sampled at
    # temperature 1 this random model (307 tokens, 2 of them EOS) could end it within a second;
    # greedy it reaches no EOS in 3,500 tokens on this prompt (checked with mlx-lm in process)
    started = time.monotonic()
    checks = 0
    for _ in client.chat(model="tiny-d", messages=[{"role": "user", "content": "a long story"}], keep_alive="2s", stream=True,
                         options={"num_predict": 3500, "temperature": 0.0}):
        if time.monotonic() - started > 2.0 + SLACK / 2 and checks < 5:  # well past the keep-alive
            checks += 1
            assert instances_of(a, "tiny-d"), "unloaded while a stream ran"
    ended = time.monotonic()
    assert checks > 0, f"the stream lasted {ended - started:.1f} s only: not longer than the keep-alive"
    # the client reads behind the server (its checks above slow it), so only the upper bound
    # is measured from its end; the lower one was measured above from a whole answer
    wait_until(lambda: not instances_of(a, "tiny-d"), 2.0 + SLACK, interval=0.1, what="tiny-d unloaded after the stream")


def test_an_unplaceable_model_is_a_503_with_the_reason_and_is_not_retried_at_once(cluster) -> None:
    a, _ = cluster.nodes
    first = a.chat("hi", HUGE, max_tokens=4)
    assert first.status_code == 503, first.text
    error = first.json()["error"]
    assert error["code"] == "placement_failed" and "cannot be placed on demand" in error["message"], error
    before = (state_of(a) or {})["last_event_idx"]
    again = a.chat("hi", HUGE, max_tokens=4)
    assert again.status_code == 503 and again.json()["error"]["message"] == error["message"]
    assert instances_of(a, HUGE) == []
    assert (state_of(a) or {})["last_event_idx"] - before < 3  # no placement tried (heartbeat-free log)


def test_ollama_preload_places_and_the_unload_idiom_unloads(cluster) -> None:
    a, b = cluster.nodes
    loaded = httpx.post(f"{a.url}/api/generate", json={"model": "tiny-e"}, timeout=300)
    assert loaded.status_code == 200 and loaded.json()["done_reason"] == "load", loaded.text
    (instance,) = instances_of(b, "tiny-e")
    assert usage_of(b, instance["instance_id"])["on_demand"]
    bad = httpx.post(f"{a.url}/api/generate", json={"model": "tiny-e", "keep_alive": "soon"}, timeout=30)
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"], bad.text
    unloaded = httpx.post(f"{b.url}/api/generate", json={"model": "tiny-e", "keep_alive": 0}, timeout=30)
    assert unloaded.status_code == 200 and unloaded.json()["done_reason"] == "unload", unloaded.text
    wait_until(lambda: not instances_of(a, "tiny-e"), SLACK, interval=0.1, what="tiny-e unloaded")


def test_an_alias_glob_on_one_node_serves_claude_names_through_every_node(cluster) -> None:
    for node in cluster.nodes:
        client = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=300)
        reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=6, messages=[{"role": "user", "content": "hi"}])
        assert reply.content[0].text, reply
        assert "claude-*" in {m["id"] for m in node.get("/v1/models").json()["data"]}
        assert "claude-*" in {m["name"] for m in node.get("/api/tags").json()["models"]}
    assert len(instances_of(cluster.nodes[0], "tiny-f")) == 1
