"""The embedded model travels (docs/models.md): copied into node A's models dir under another name,
so only A holds it, it is placed across A and B; B fetches its shard from A and the instance
answers the Paris prompt."""

from __future__ import annotations

import json
import shutil

import pytest

from exo_p2p.models.stores.embedded import find_embedded_gguf
from exo_p2p.models.gguf.importer import import_gguf
from tests.support.cluster import NodeProcess, converged, nodes_cleanup, self_id, wait_until

pytestmark = pytest.mark.e2e
MODEL = "smollm2-only-on-a"


def test_model_only_on_a_placed_across_a_and_b_answers(tmp_path) -> None:
    imported = import_gguf(find_embedded_gguf(), tmp_path / "import")
    models = tmp_path / "a-models"
    shutil.copytree(imported, models / MODEL)
    with nodes_cleanup([]) as nodes:
        a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models)]).start()
        nodes.append(a)
        b = NodeProcess(tmp_path / "b", cluster=a.cluster,
                        extra_args=[x for addr in a.addrs() for x in ("--bootstrap", addr)]).start()
        nodes.append(b)
        wait_until(lambda: converged([a, b], 2), 40, what="2-node cluster")
        a_id, b_id = self_id(a), self_id(b)

        def a_publishes() -> bool:
            state = b.get("/state").json()
            held = state["nodes"].get(a_id, {}).get("held_models") or []
            return any(h[0] == MODEL and h[2] for h in held) and state["nodes"].get(b_id, {}).get("models_disk_free") is not None

        wait_until(a_publishes, 90, what="A's manifest of the copy in State")  # hashing ~270 MB
        assert MODEL not in (b.get("/state").json()["nodes"][b_id].get("models") or [])
        r = b.post("/instances", json={"model": MODEL, "min_nodes": 2, "nodes": [a_id, b_id]})
        assert r.status_code == 201, r.text
        iid = r.json()["instance_id"]

        def ready():
            view = b.get(f"/instances/{iid}").json()
            assert view["status"] != "failed", view
            return view if view["status"] == "ready" else None

        view = wait_until(ready, 240, what="2-node instance ready")
        assert {s["node_id"] for s in view["shards"]} == {a_id, b_id}
        reply = b.chat("What is the capital of France?", MODEL, max_tokens=8, temperature=0)
        assert reply.status_code == 200, reply.text
        assert "Paris" in reply.json()["choices"][0]["message"]["content"]
        # B fetched its shard only, from A
        events = [json.loads(line) for line in b.log_path.read_text(errors="replace").splitlines()
                  if '"shard fetched"' in line]
        assert events and events[-1]["instance_id"] == iid, b.log_tail()
        total = sum(p.stat().st_size for p in (models / MODEL).rglob("*") if p.is_file())
        assert 0 < events[-1]["bytes"] < 0.8 * total, (events[-1]["bytes"], total)
        assert set(events[-1]["by_peer"]) == {a_id}
