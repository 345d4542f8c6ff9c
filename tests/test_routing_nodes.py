"""Prefix-aware routing on real node processes: two nodes, one instance of the tiny synthetic
model on each, a prompt cache on both. Two conversations, each turn sent as soon as the
previous answer arrived: every turn after the first goes to the instance that served the
conversation's first turn, for the reason ``prefix`` (the runner's digests reached the
master before the client's next turn did) and reuses cached tokens there."""

from __future__ import annotations

import httpx
import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny-routing"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_synthetic_model(models / MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=3)
    extra = ["--models-dir", str(models), "--prompt-cache-bytes", str(8 * 2**20)]
    a = NodeProcess(tmp_path_factory.mktemp("a"), extra_args=extra)
    started = [a]
    with nodes_cleanup(started):
        a.start()
        boot = [x for addr in a.addrs() for x in ("--bootstrap", addr)]
        b = NodeProcess(tmp_path_factory.mktemp("b"), cluster=a.cluster, extra_args=[*extra, *boot])
        started.append(b)
        b.start()
        wait_until(lambda: converged([a, b], 2), 30, what="two nodes converged")
        wait_until(lambda: len(a.get("/models").json()) >= 1 and MODEL in str(a.get("/v1/models").json()), 30,
                   what="the model listed")
        for n in (a, b):
            a.place_and_wait(MODEL, timeout=120, nodes=[n.get("/health").json()["node_id"]])
        yield a, b


def test_later_turns_go_to_the_prefix_holder(pair) -> None:
    a, b = pair
    ids: dict[str, list[str]] = {}
    for topic, node in (("the sea", a), ("the mountains", b)):
        messages = [{"role": "user", "content": f"tell me everything about {topic} " * 8}]
        for turn in range(4):
            r = httpx.post(f"{node.url}/v1/chat/completions", timeout=120, json={
                "model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            ids.setdefault(topic, []).append((node, r.json()["id"].removeprefix("chatcmpl-")))
            text = r.json()["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then {turn}?"}]
    for topic, sent in ids.items():
        records = {rec["request_id"]: rec for node in (a, b) for rec in node.get("/requests").json()["records"]}
        first = records[sent[0][1]]
        for _, rid in sent[1:]:
            rec = records[rid]
            assert rec["instance"] == first["instance"], (topic, rec, first)
            assert rec["route"].startswith("prefix:"), (topic, rec)
            assert rec["cached_tokens"] > 0, rec
