"""Sharded inference across real node processes, with a tiny synthetic model."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.support.cluster import Cluster, states, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny"
PROMPTS = ["hello there", "the quick brown fox", "one two three four five six seven eight nine ten " * 6]


def _chat(node, content, max_tokens=12):
    r = node.chat(content, MODEL, max_tokens=max_tokens, temperature=0)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _place(node, **body):
    r = node.post("/instances", json={"model": MODEL, **body})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]
    wait_until(lambda: node.get(f"/instances/{iid}").json()["status"] == "ready", 90, what="instance ready")
    return iid


def test_two_node_pipeline_equals_single_node_and_serves_concurrent_requests(tmp_path, models_dir):
    cluster = Cluster(tmp_path, 2, extra_args=["--models-dir", str(models_dir), "--prefill-chunk-size", "16"])
    try:
        cluster.start()
        a, b = cluster.nodes
        single = _place(a, min_nodes=1)
        expected = [_chat(a, p) for p in PROMPTS]
        assert httpx.delete(a.url + f"/instances/{single}", timeout=30).status_code == 200
        iid = _place(a, min_nodes=2)
        view = a.get(f"/instances/{iid}").json()
        assert len(view["shards"]) == 2 and {s["node_id"] for s in view["shards"]} == {n["node_id"] for n in a.get("/nodes").json()}
        got = [_chat(b, p) for p in PROMPTS]  # through the other node's API
        assert got == expected

        # 6 requests at once, one cancelled midway by closing its stream
        def run(i):
            return _chat(a if i % 2 else b, PROMPTS[i % len(PROMPTS)], max_tokens=12)

        def cancelled():
            body = {"model": MODEL, "messages": [{"role": "user", "content": "cancel me"}], "max_tokens": 400, "stream": True}
            with httpx.stream("POST", a.url + "/v1/chat/completions", json=body, timeout=60) as r:
                for n, _ in enumerate(r.iter_lines()):
                    if n >= 3:
                        break
            return time.monotonic()

        with cf.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(run, i) for i in range(5)]
            t_cancel = pool.submit(cancelled).result(timeout=120)
            outputs = [f.result(timeout=180) for f in futures]
        assert outputs == [expected[i % len(PROMPTS)] for i in range(5)]
        # nothing left running or queued: every task ended and was removed, on both nodes
        wait_until(lambda: all(s["tasks"] == {} for s in states(cluster.nodes)), max(5.0, 5 - (time.monotonic() - t_cancel)) + 5, what="no task left")
        assert _chat(b, PROMPTS[0]) == expected[0]

        # tokens stay off gossip: the event messages a request causes do not grow with its length
        def event_messages():
            total = 0
            for s in states(cluster.nodes):
                total += sum(v for k, v in s["counters"].items() if k.startswith("published:") and "heartbeat" not in k)
            return total

        def cost(max_tokens):
            wait_until(lambda: all(s["tasks"] == {} for s in states(cluster.nodes)), 10, what="idle")
            time.sleep(1.5)  # let trailing profile/ack traffic settle
            before = event_messages()
            r = b.chat("count the gossip", MODEL, max_tokens=max_tokens, temperature=0)
            assert r.status_code == 200, r.text
            tokens.append(r.json()["usage"]["completion_tokens"])
            wait_until(lambda: all(s["tasks"] == {} for s in states(cluster.nodes)), 10, what="idle")
            return event_messages() - before

        tokens: list[int] = []
        short, long = cost(4), cost(60)
        assert tokens[1] >= tokens[0] + 20, tokens  # the second request really is longer
        assert long <= short + 4, (short, long, tokens)  # ~constant (a few status events), not one per token
    finally:
        cluster.stop()
