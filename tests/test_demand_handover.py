"""Memory handed over on a real node (docs/models.md "Placement on demand and idle unload"):
a node whose memory limit holds one of two ~38 MB synthetic models. Asking for A, then for B
unloads A (idle) and places B, both answers given; while B serves a long stream, a request
for A is a clear 503 saying why (``placement_busy``, with ``Retry-After``), and B's stream is
not interrupted; once B is idle, A's next request is placed (the busy answer was not remembered).
"""

from __future__ import annotations

import threading

import pytest

from tests.support.cluster import NodeProcess, state_of
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = pytest.mark.integration
openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for seed, name in enumerate(("big-a", "big-b")):
        make_synthetic_model(models / name, n_layers=4, hidden_size=512, intermediate_size=1024, seed=seed, context_length=4096)
    n = NodeProcess(tmp_path_factory.mktemp("node"), extra_args=["--models-dir", str(models), "--memory-limit", "64MiB"])
    try:
        n.start()
        yield n
    finally:
        n.stop()


def models_placed(node: NodeProcess) -> list[str]:
    return sorted(i["model_id"] for i in (state_of(node) or {}).get("instances", {}).values())


def test_a_then_b_unloads_idle_a_and_a_busy_instance_is_never_handed_over(node) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "hi"}]
    first = client.chat.completions.create(model="big-a", messages=ask, max_tokens=6, temperature=0)
    assert first.choices[0].message.content and models_placed(node) == ["big-a"]
    second = client.chat.completions.create(model="big-b", messages=ask, max_tokens=6, temperature=0)
    assert second.choices[0].message.content and models_placed(node) == ["big-b"]
    # B serves a long stream: A's request is refused with the reason, B's stream goes on
    streamed: dict = {"text": "", "finish": None, "error": None}
    started = threading.Event()

    def stream() -> None:
        try:
            # greedy: this random model reaches no EOS in 1,500 tokens on this prompt (mlx-lm in
            # process), where sampled at temperature 1 it could end before A's request is made
            for chunk in client.chat.completions.create(model="big-b", messages=ask, max_tokens=1500, temperature=0.0, stream=True):
                started.set()
                if chunk.choices and chunk.choices[0].delta.content:
                    streamed["text"] += chunk.choices[0].delta.content
                if chunk.choices and chunk.choices[0].finish_reason:
                    streamed["finish"] = chunk.choices[0].finish_reason
        except Exception as exc:  # noqa: BLE001 - checked below
            streamed["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert started.wait(120)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="big-a", messages=ask, max_tokens=6)
    assert refused.value.status_code == 503 and refused.value.response.headers.get("retry-after") == "5"
    error = refused.value.response.json()["error"]
    assert error["code"] == "placement_busy", error  # only for now: not remembered by the negative cache
    assert "cannot be placed on demand" in error["message"] and "serving a request are idle" in error["message"], error
    thread.join(300)
    assert streamed["error"] is None and streamed["finish"] is not None and streamed["text"], streamed
    assert models_placed(node) == ["big-b"]
    # B idle again: A's next request (within the negative cache's 30 s) hands B over and is answered
    again = client.chat.completions.create(model="big-a", messages=ask, max_tokens=6, temperature=0)
    assert again.choices[0].message.content and models_placed(node) == ["big-a"]
