"""The embedded model over 1, 2 and 3 pipeline ranks on real node processes:
greedy output is identical token for token (same prefill chunk size)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import Cluster, wait_until

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m-instruct"
LONG = (
    "Here is a list of facts about the solar system. The Sun is a star. Mercury is the closest planet to the Sun. "
    "Venus is the hottest planet. Earth is the only planet known to have life. Mars is called the red planet. "
    "Jupiter is the largest planet. Saturn has beautiful rings. Uranus rotates on its side. Neptune has strong winds. "
    "Pluto is a dwarf planet. The asteroid belt lies between Mars and Jupiter. Comets come from the Kuiper belt and the "
    "Oort cloud. The Moon orbits Earth about once a month. Light from the Sun reaches Earth in about eight minutes. "
    "Venus spins slowly and backwards. Mars has the tallest volcano, Olympus Mons. Jupiter has a great red spot, a storm "
    "larger than Earth. Saturn is less dense than water. Neptune was found by mathematics before it was seen. "
    "Now, in one sentence, which planet is the largest?"
)
PROMPTS = ["What is the capital of France?", "Name a color.", "What is 2 + 2?", "Say hello.", LONG]


def _outputs(node):
    out = []
    for p in PROMPTS:
        r = node.chat(p, MODEL, max_tokens=8, temperature=0)
        assert r.status_code == 200, r.text
        body = r.json()
        out.append((body["choices"][0]["message"]["content"], body["usage"]["completion_tokens"], body["usage"]["prompt_tokens"]))
    return out


def _place(node, n):
    r = node.post("/instances", json={"model": MODEL, "min_nodes": n})
    assert r.status_code == 201, r.text
    iid = r.json()["instance_id"]
    wait_until(lambda: node.get(f"/instances/{iid}").json()["status"] == "ready", 240, what=f"{n}-rank instance ready")
    assert len(node.get(f"/instances/{iid}").json()["shards"]) == n
    return iid


def test_pipeline_over_two_and_three_nodes_equals_single_node(tmp_path):
    cluster = Cluster(tmp_path, 3, extra_args=["--prefill-chunk-size", "16"])
    try:
        cluster.start()
        api = cluster.nodes[0]
        iid = _place(api, 1)
        single = _outputs(api)
        assert "Paris" in single[0][0]
        assert 180 <= single[-1][2] <= 260  # the ~200-token prompt, prefilled in 12+ chunks of 16
        for n in (2, 3):
            assert httpx.delete(api.url + f"/instances/{iid}", timeout=30).status_code == 200
            iid = _place(api, n)
            assert _outputs(cluster.nodes[n - 1]) == single, f"{n}-rank output differs"
    finally:
        cluster.stop()
