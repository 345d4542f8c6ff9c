"""The master dies while requests stream from instances on other nodes.

Three nodes; the instances live on the two followers and the requests enter through a
follower's API, so neither the API node nor a node of any instance dies. Tokens travel from
rank 0's node to the API node over a direct stream (not via the master) and task events are
re-sent to whichever node is master, so the requests must complete exactly as without the
kill, a new master must be agreed within the docs/architecture.md#defaults bound, and the instances must
keep their ids and serve again.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.conftest import NEW_MASTER, T_GONE as PEER_GONE, tiny_models_dir
from tests.support.cluster import Cluster, NodeProcess, agreement, self_id, state_of, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny"
PROMPT = "tell me a long story about the sea"
SLACK = 5.0  # load on a shared 2-core machine
CONTEXT = 8192  # tokens: room for streams that outlive the election
STREAM_SECONDS = 8.0  # how long one stream should last at the measured rate


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    return tiny_models_dir(tmp_path_factory, n_layers=6, hidden_size=128, intermediate_size=256, seed=5, context_length=CONTEXT)


def _body(max_tokens: int, stream: bool) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def _greedy(node: NodeProcess, max_tokens: int) -> tuple[str, str]:
    """``(content, finish_reason)`` of a non-streaming greedy completion through ``node``."""
    r = node.post("/v1/chat/completions", json=_body(max_tokens, False), timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def _stream(node: NodeProcess, max_tokens: int) -> tuple[threading.Thread, dict]:
    """A greedy streaming completion through ``node`` in a thread. The result dict gets
    ``status``, ``content`` (joined deltas), ``finish_reason``, ``errors`` (error events and
    transport errors), ``done`` ([DONE] seen), ``tokens`` (content events) and ``ended_at``."""
    result: dict = {"status": None, "content": "", "finish_reason": None, "errors": [], "done": False, "tokens": 0, "ended_at": None}

    def go() -> None:
        try:
            with httpx.stream("POST", node.url + "/v1/chat/completions", json=_body(max_tokens, True), timeout=httpx.Timeout(120, connect=10)) as r:
                result["status"] = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        result["done"] = True
                        continue
                    event = json.loads(data)
                    if "error" in event:
                        result["errors"].append(event["error"])
                        continue
                    for choice in event.get("choices", []):
                        text = choice.get("delta", {}).get("content")
                        if text:
                            result["content"] += text
                            result["tokens"] += 1
                        if choice.get("finish_reason"):
                            result["finish_reason"] = choice["finish_reason"]
        except httpx.HTTPError as exc:
            result["errors"].append(f"transport error: {exc!r}")
        result["ended_at"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, result


def _place(api: NodeProcess, nodes: list[str], min_nodes: int) -> str:
    r = api.post("/instances", json={"model": MODEL, "nodes": nodes, "min_nodes": min_nodes})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]
    wait_until(lambda: api.get(f"/instances/{iid}").json()["status"] == "ready", 120, what=f"instance on {nodes} ready")
    shards = api.get(f"/instances/{iid}").json()["shards"]
    assert sorted(s["node_id"] for s in shards) == sorted(nodes)
    return iid


def test_master_killed_while_followers_stream_requests_complete_and_cluster_keeps_instances(tmp_path, models_dir):
    cluster = Cluster(tmp_path, 3, extra_args=["--models-dir", str(models_dir), "--prefill-chunk-size", "16", "--routing", "load"])
    try:
        cluster.start()
        wait_until(lambda: agreement(cluster.nodes, 3), 30, what="3-node agreement")
        ids = {self_id(n): n for n in cluster.nodes}
        old_master_id = state_of(cluster.nodes[0])["master"]
        master = ids[old_master_id]
        f1, f2 = (n for i, n in sorted(ids.items()) if i != old_master_id)
        f1_id, f2_id = self_id(f1), self_id(f2)

        # a 2-rank pipeline on both followers (rank 0 on one, rank 1 on the other), and a
        # 1-node instance on a follower: every rank lives off the master
        pipeline = _place(f1, [f1_id, f2_id], 2)
        single = _place(f1, [f2_id], 1)

        # greedy reference output, measured before the kill, sized so that a stream lasts
        # well past the kill and the election at this machine's decode rate (and load)
        t0 = time.monotonic()
        probe = _greedy(f1, 200)
        rate = 200 / max(time.monotonic() - t0, 1e-3)
        max_tokens = int(min(CONTEXT - 100, max(400, rate * STREAM_SECONDS)))
        expected = _greedy(f1, max_tokens)
        assert expected[0].startswith(probe[0])

        # three streams through the followers' APIs; the master gives each to the ready
        # instance with the fewest unfinished tasks: one on each instance, one queued
        streams = [_stream(f1, max_tokens), _stream(f2, max_tokens), _stream(f1, max_tokens)]
        wait_until(lambda: sum(r["tokens"] >= 3 for _, r in streams) >= 2, 60, what="two streams producing tokens")
        busy = [rec["task"]["instance_id"] for rec in state_of(f1)["tasks"].values()]
        assert len(busy) == 3 and set(busy) == {pipeline, single}, busy

        assert master.children() == []  # the master hosts no runner
        t_kill = time.monotonic()
        master.kill()  # SIGKILL of the master node process
        assert all(r["ended_at"] is None for _, r in streams), "a stream ended before the kill: raise max_tokens"
        # and one submitted while there is no master: its command waits for the next one
        streams.append(_stream(f2, max_tokens))

        # a new master among the survivors, agreed by both, within the bound of docs/architecture.md#defaults
        survivors = [f1, f2]

        def new_master():
            a = agreement(survivors)
            return a if a is not None and a[0] != old_master_id and a[0] in (f1_id, f2_id) else None

        wait_until(new_master, PEER_GONE + NEW_MASTER + SLACK, interval=0.1, what="new master agreed by the survivors")
        elected_after = time.monotonic() - t_kill
        assert elected_after <= PEER_GONE + NEW_MASTER + SLACK

        # the streams end normally, with exactly the greedy output of the run before the kill
        for thread, _ in streams:
            thread.join(180)
        for i, (thread, result) in enumerate(streams):
            assert not thread.is_alive(), f"stream {i} still open"
            assert result["status"] == 200, result
            assert result["errors"] == [], (i, result["errors"], f1.log_tail(20))
            assert result["done"], result
            assert (result["content"], result["finish_reason"]) == expected, i
        assert any(r["ended_at"] - t_kill > elected_after for _, r in streams), "no stream outlived the election"
        ends = ", ".join(f"{r['ended_at'] - t_kill:.1f}" for _, r in streams)
        print(f"max_tokens {max_tokens}; new master after {elected_after:.1f} s; streams ended at +{ends} s")

        # the survivors agree on one State, which keeps both instances (same ids) ready
        final = wait_until(lambda: agreement(survivors, 2), 30, what="survivors agree with 2 nodes")
        assert final[0] != old_master_id
        state = state_of(f1)
        assert set(state["instances"]) == {pipeline, single}
        for iid in (pipeline, single):
            assert f1.get(f"/instances/{iid}").json()["status"] == "ready"
        wait_until(lambda: state_of(f1)["tasks"] == {} and state_of(f2)["tasks"] == {}, 15, what="no task left in State")

        # and they serve new requests, through either follower, with the same output
        assert _greedy(f2, max_tokens) == expected
        assert expected[0].startswith(_greedy(f1, 32)[0])
    finally:
        cluster.stop()
