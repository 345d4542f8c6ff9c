"""Continuous batching on real node processes: 12 concurrent chat requests with
different prompt lengths, max_tokens, stop strings and seeds on a 1-node and on a 2-node
pipeline instance of the tiny synthetic model (``--max-batch 16``), one more
streamed and cancelled midway by closing its connection. Each answer equals the request's
answer alone; the cancelled task leaves State on every node within 5 s (more if the run decodes slowly:
``cancel_bound``); nothing hangs."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, states, wait_until
from tests.support.cancel_bounds import cancel_bound

pytestmark = pytest.mark.integration
MODEL = "tiny"
WORDS = "one two three four five six seven eight nine ten eleven twelve "


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    make_synthetic_model(d / MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=9)
    return d


def bodies() -> list[dict]:
    return [
        {"model": MODEL, "messages": [{"role": "user", "content": WORDS * (1 + i % 5) + str(i)}],
         "max_tokens": 6 + 4 * i, "temperature": 0.9 if i % 3 == 0 else 0, "seed": 7 + i,
         **({"stop": ["e"]} if i % 4 == 1 else {})}
        for i in range(12)
    ]


def answer(node: NodeProcess, body: dict) -> tuple[str, str]:
    r = httpx.post(node.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def stream_then_close(node: NodeProcess, n_tokens: int) -> tuple[str, float, float]:
    """Streams a long answer, closes the connection after ``n_tokens`` tokens; returns the task
    id, the time of the close, and the seconds per token the stream showed before it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 1000,
            "temperature": 0, "stream": True}
    task_id, seen, first = None, 0, 0.0
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, connect=10)) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: "):])
            task_id = event["id"].removeprefix("chatcmpl-")
            if event["choices"][0]["delta"].get("content"):
                seen += 1
                if seen == 1:
                    first = time.monotonic()
                if seen >= n_tokens:
                    break
    assert task_id is not None and n_tokens > 1
    closed = time.monotonic()
    return task_id, closed, (closed - first) / (n_tokens - 1)


def concurrent_with_a_cancel(nodes: list[NodeProcess], alone: list[tuple[str, str]]) -> float:
    """12 requests at once plus one streamed and cancelled; returns seconds from the close
    until the cancelled task left State on every node."""
    node = nodes[-1]  # the API on the last node: chunks come from rank 0 elsewhere when 2 nodes
    results: dict[int, tuple[str, str]] = {}
    errors: list[BaseException] = []

    def one(i: int, body: dict) -> None:
        try:
            results[i] = answer(node, body)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bodies())]
    for t in threads:
        t.start()
    task_id, closed, per_token = stream_then_close(node, 5)

    def gone() -> bool:
        return all(task_id not in s["tasks"] for s in states(nodes))

    wait_until(gone, cancel_bound(per_token), what=f"cancelled task {task_id} out of State on every node")
    stopped = time.monotonic() - closed
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert not errors, errors
    for i, expected in enumerate(alone):
        assert results[i] == expected, (i, results[i], expected)
    wait_until(lambda: all(s["tasks"] == {} for s in states(nodes)), 10, what="no task left")
    return stopped


def _place(node: NodeProcess, **body) -> str:
    instance = node.place_and_wait(MODEL, timeout=90, **body)
    return instance["instance_id"]


def test_twelve_concurrent_requests_equal_their_solo_answers_on_one_and_two_nodes(tmp_path, models_dir):
    models = ["--models-dir", str(models_dir), "--max-batch", "16"]  # batching is opt-in
    a = NodeProcess(tmp_path / "a", extra_args=models)
    nodes = [a]
    with nodes_cleanup(nodes):
        a.start()
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path / "b", cluster=a.cluster, extra_args=[*models, *boot])
        nodes.append(b)
        b.start()
        wait_until(lambda: converged(nodes, 2), 30, what="2-node cluster")
        single = _place(a, min_nodes=1)
        alone = [answer(a, body) for body in bodies()]  # one at a time
        assert any(reason == "stop" for _, reason in alone) and any(reason == "length" for _, reason in alone)
        stopped_1 = concurrent_with_a_cancel(nodes, alone)
        assert httpx.delete(a.url + f"/instances/{single}", timeout=30).status_code == 200
        pipeline = _place(a, min_nodes=2)
        assert len(a.get("/state").json()["instances"][pipeline]["shards"]) == 2
        stopped_2 = concurrent_with_a_cancel(nodes, alone)
        print(f"\ncancel left State after {stopped_1:.2f} s (1 node), {stopped_2:.2f} s (2-node pipeline)")


def test_kv_cache_bytes_refuses_what_never_fits_and_serves_the_rest(tmp_path, models_dir):
    """A node started with ``--kv-cache-bytes`` for ~600 tokens of KV: a request whose prompt
    and max_tokens can never fit gets the 503 ``out_of_memory`` at once (``x-should-retry:
    false``), while requests that fit are answered, also concurrently (they wait for room)."""
    from worker.engine.batch_memory import model_kv_bytes_per_token
    from worker.engine.loading.loader import load_all

    per_token = model_kv_bytes_per_token(load_all(models_dir / MODEL).model)
    a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models_dir), "--kv-cache-bytes", str(600 * per_token)])
    with nodes_cleanup([a]):
        a.start()
        _place(a, min_nodes=1)
        t0 = time.monotonic()
        r = httpx.post(a.url + "/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "out_of_memory" and r.headers.get("x-should-retry") == "false"
        assert time.monotonic() - t0 < 10  # at once, before any prefill (one that waited for room would hang to 60 s)
        fits = [{"model": MODEL, "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 40, "temperature": 0}
                for i in range(4)]
        alone = [answer(a, body) for body in fits]
        results: dict[int, tuple[str, str]] = {}
        threads = [threading.Thread(target=lambda i=i, b=b: results.__setitem__(i, answer(a, b))) for i, b in enumerate(fits)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [results.get(i) for i in range(4)] == alone
