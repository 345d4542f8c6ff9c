"""End to end on one real node process with the real embedded model (SmolLM2-135M).

Slow (the model decodes a few tokens/s on CI's CPUs): one node serves every test of this
module; answers are kept short.
"""

from __future__ import annotations

import json
import time

import httpx
import psutil
import pytest

from tests.support.cluster import NodeProcess, wait_until

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def node(embedded_node):  # type: ignore[no-untyped-def]
    """The node with the embedded model placed (``tests/conftest.py``)."""
    return embedded_node


def test_non_streaming_greedy_answer_contains_paris(node):
    r = node.chat(QUESTION, MODEL, temperature=0, max_tokens=20)
    assert r.status_code == 200, r.text
    body = r.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["completion_tokens"] <= 20
    assert body["usage"]["prompt_tokens"] > 5


def test_streaming_answer_and_sse_format(node):
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 20,
            "stream": True, "stream_options": {"include_usage": True}}
    lines = []
    with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line and not line.startswith(":"):  # ":" lines are SSE comments (keep-alives)
                lines.append(line)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "Paris" in text
    finished = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert len(finished) == 1
    for c in chunks:
        for choice in c["choices"]:
            for key in ("tool_calls", "function_call", "name"):
                assert key not in choice["delta"] or choice["delta"][key] is not None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_official_openai_client(node):
    from openai import OpenAI

    client = OpenAI(base_url=node.url + "/v1", api_key="unused", timeout=300)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=20)
    assert "Paris" in out.choices[0].message.content
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=20, stream=True)
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert "Paris" in text


@pytest.mark.parametrize(
    "body,status",
    [
        ("{not json", 400),
        ({"model": MODEL, "messages": []}, 400),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404),
    ],
)
def test_bad_input_gets_4xx_and_node_keeps_serving(node, body, status):
    if isinstance(body, str):
        r = httpx.post(node.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30)
    else:
        r = node.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and "type" in err
    assert node.get("/state").status_code == 200


def test_prompt_longer_than_context_is_400_before_prefill(node):
    long_prompt = "hello " * 9000  # > 8192 tokens
    t0 = time.monotonic()
    r = node.chat(long_prompt, MODEL, max_tokens=5)
    assert r.status_code == 400, r.text
    assert "8192" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 10  # refused before prefill (prefill would take minutes)
    assert node.chat("Say hi", MODEL, max_tokens=3, temperature=0).status_code == 200


def test_unplaced_model_is_409(tmp_path):
    n = NodeProcess(tmp_path / "n", extra_args=["--no-place-on-demand"])  # else the request places it
    try:
        n.start()
        r = n.chat("hi", MODEL, max_tokens=3)
        assert r.status_code == 409
        assert "place" in r.json()["error"]["message"]
    finally:
        n.stop()


def test_sigkill_of_node_makes_its_runner_exit_and_sigterm_stops_cleanly(tmp_path):
    n = NodeProcess(tmp_path / "n")
    try:
        n.start()
        n.place_and_wait(MODEL, timeout=300)
        runners = n.children()
        assert runners, "a runner process is running"
        n.kill()  # the node only, not its process group
        gone, alive = psutil.wait_procs(runners, timeout=10)
        assert not alive, f"runners still alive 10 s after their node died: {[p.pid for p in alive]}"
    finally:
        n.stop()
    # restart with the same data dir: same identity; runners from before are never revived,
    # the master re-places the failed instance (new id, `replaces` the old one) and serves again
    n2 = NodeProcess(tmp_path / "n", cluster=n.cluster)
    try:
        n2.start()
        def replaced():
            insts = n2.get("/instances").json()
            return [i for i in insts if i["status"] == "ready"] and insts
        wait_until(replaced, 60, what="re-placed instance ready")
        state = n2.get("/state").json()
        (inst,) = state["instances"].values()
        assert inst["replaces"] and inst["attempt"] == 1
        assert n2.chat("Say hi", MODEL, max_tokens=3, temperature=0).status_code == 200
        code = n2.stop()
        assert code == 0
        assert "Traceback" not in n2.log_path.read_text()
    finally:
        n2.stop()
