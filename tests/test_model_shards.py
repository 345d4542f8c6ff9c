"""A model held by one node is placed across nodes that lack it: each fetches just its shard
from the peers holding it (docs/models.md, ``exo_p2p.models.depot.shard_fetch``), with real node
processes and a tiny synthetic model (~4.9 MB, 105 chunks of 64 KiB). Holders are slowed
with the ``model_serve_delay`` fault hook where a test must act mid-transfer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from exo_p2p.models.transfer.chunk_sets import chunk_bytes_of, missing_chunks, shard_chunks
from exo_p2p.models.manifest import build_manifest
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.manifest import ModelManifest
from tests.support.cluster import NodeProcess, converged, self_id, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny-shards"
N_LAYERS = 8
PROMPTS = ["hello there", "the quick brown fox"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    models = tmp_path_factory.mktemp("shard-models")
    make_synthetic_model(models / MODEL, n_layers=N_LAYERS, hidden_size=128, intermediate_size=256, seed=3)
    return models


def _start(nodes: list, path: Path, *, first: NodeProcess | None = None, models: Path | None = None,
           hooks: dict[str, str] | None = None) -> NodeProcess:
    extra = ["--models-dir", str(models)] if models else []
    for key, value in (hooks or {}).items():
        extra += ["--fault-hook", f"{key}={value}"]
    if first is not None:
        extra += [x for addr in first.addrs() for x in ("--bootstrap", addr)]
    node = NodeProcess(path, cluster=first.cluster if first else None, extra_args=extra).start()
    nodes.append(node)
    return node


def _held(node: NodeProcess, holder: str) -> list:
    profile = node.get("/state").json().get("nodes", {}).get(holder) or {}
    return profile.get("held_models") or []


def _cluster_with_holder(nodes, tmp_path, model_dir, n: int, *, holders: int = 1,
                         hooks: dict[int, dict[str, str]] | None = None) -> tuple[list[NodeProcess], ModelManifest]:
    """``n`` nodes; the first ``holders`` hold the model. Returns them once every node sees
    every holder's manifest and free disk."""
    manifest = build_manifest(model_dir / MODEL, MODEL)
    out: list[NodeProcess] = []
    for i in range(n):
        out.append(_start(nodes, tmp_path / f"n{i}", first=out[0] if out else None,
                          models=model_dir if i < holders else None, hooks=(hooks or {}).get(i)))
    wait_until(lambda: converged(out, n), 40, what=f"{n}-node cluster")
    ids = [self_id(x) for x in out]

    def ready() -> bool:
        state = out[-1].get("/state").json()
        return all([MODEL, manifest.digest, True] in (state["nodes"].get(h, {}).get("held_models") or [])
                   for h in ids[:holders]) and all(state["nodes"].get(i, {}).get("models_disk_free") is not None for i in ids)

    wait_until(ready, 40, what="holders' manifests and free disk in State")
    return out, manifest


def _place(node: NodeProcess, nodes: list[str], min_nodes: int) -> str:
    r = node.post("/instances", json={"model": MODEL, "min_nodes": min_nodes, "nodes": nodes})
    assert r.status_code == 201, r.text
    return r.json()["instance_id"]


def _wait_ready(node: NodeProcess, iid: str, timeout: float = 90, seen: list | None = None) -> dict:
    def check():
        view = node.get(f"/instances/{iid}").json()
        assert view["status"] != "failed", view
        if seen is not None:
            seen.extend(s for s in view["shards"] if s["status"] == "downloading")
        return view if view["status"] == "ready" else None

    return wait_until(check, timeout, interval=0.1, what="instance ready")


def _delete(node: NodeProcess, iid: str) -> None:
    assert httpx.delete(f"{node.url}/instances/{iid}", timeout=30).status_code == 200


def _outputs(node: NodeProcess) -> list[str]:
    out = []
    for prompt in PROMPTS:
        r = node.chat(prompt, MODEL, max_tokens=MAX_TOKENS, temperature=0)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def _journal(node: NodeProcess, digest: str) -> dict[str, set[int]]:
    path = node.data_dir / "models" / ".fetched" / digest / ".verified"
    held: dict[str, set[int]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        index, _, name = line.partition(" ")
        if index.isdigit() and name:
            held.setdefault(name, set()).add(int(index))
    return held


def _share(manifest: ModelManifest, shard: dict) -> dict[str, tuple[int, ...]]:
    return shard_chunks(manifest, start_layer=shard["start_layer"], end_layer=shard["end_layer"],
                        n_layers=N_LAYERS, tied=True)


def _log_events(node: NodeProcess, event: str) -> list[dict]:
    out = []
    for line in node.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


def test_pipelines_fetch_only_their_shards_from_the_holder_and_each_other(tmp_path, nodes, model_dir) -> None:
    """Only A holds the model. A 2-node pipeline on A and B: B fetches only its shard and the
    greedy text equals A's alone; then a 3-node pipeline: C, which has nothing, fetches from A
    (complete) and from B (the partial copy B kept when the first instance was deleted)."""
    (a, b, c), manifest = _cluster_with_holder(nodes, tmp_path, model_dir, 3, hooks={0: {"model_serve_delay": "0.03"}})
    a_id, b_id, c_id = (self_id(x) for x in (a, b, c))
    single = _place(a, [a_id], 1)
    _wait_ready(a, single)
    expected = _outputs(a)
    _delete(a, single)

    pair = _place(a, [a_id, b_id], 2)
    seen: list[dict] = []
    view = _wait_ready(a, pair, seen=seen)
    assert _outputs(b) == expected  # greedy text equals single-node, through B's API
    b_shard = next(s for s in view["shards"] if s["node_id"] == b_id)
    share = chunk_bytes_of(manifest, _share(manifest, b_shard))
    # B was Downloading (bytes done / total in the instance view) before it loaded
    assert seen and all(s["node_id"] == b_id for s in seen)
    assert max(s["bytes_total"] for s in seen) == share
    # B fetched its share only (±10%), not the whole model
    fetched = chunk_bytes_of(manifest, _journal(b, manifest.digest))
    assert abs(fetched - share) <= 0.1 * share, (fetched, share)
    assert fetched < 0.7 * manifest.total_bytes
    _delete(a, pair)  # B keeps its chunks and publishes them
    wait_until(lambda: [MODEL, manifest.digest, False] in _held(c, b_id), 20, what="B's partial copy in C's State")

    iid = _place(a, [a_id, b_id, c_id], 3)
    view = _wait_ready(a, iid)
    assert _outputs(c) == expected
    for node, node_id in ((b, b_id), (c, c_id)):
        shard = next(s for s in view["shards"] if s["node_id"] == node_id)
        assert not missing_chunks(_share(manifest, shard), _journal(node, manifest.digest))
    fetched_c = [e for e in _log_events(c, "shard fetched") if e.get("instance_id") == iid]
    assert fetched_c, c.log_tail()
    by_peer = fetched_c[-1]["by_peer"]
    assert by_peer.get(a_id, 0) > 0 and by_peer.get(b_id, 0) > 0, by_peer


def test_corrupt_chunks_and_a_killed_source_move_the_fetch_to_another_holder(tmp_path, nodes, model_dir) -> None:
    # A and B hold the model; A serves 2 corrupted chunks, slowly; C lacks it
    (a, b, c), manifest = _cluster_with_holder(
        nodes, tmp_path, model_dir, 3, holders=2,
        hooks={0: {"model_serve_delay": "0.15", "model_corrupt_chunks": "2"}, 1: {"model_serve_delay": "0.15"}})
    a_id, b_id, c_id = (self_id(x) for x in (a, b, c))
    iid = _place(b, [b_id, c_id], 2)

    def some_from_a() -> bool:
        return any(e.get("peer") == a_id for e in _log_events(c, "chunk failed verification")) and \
            chunk_bytes_of(manifest, _journal(c, manifest.digest)) > 0
    wait_until(some_from_a, 40, interval=0.1, what="A's corrupted chunks detected on C")
    a.kill()  # mid-transfer: C goes on with B alone
    view = _wait_ready(b, iid, timeout=120)
    shard = next(s for s in view["shards"] if s["node_id"] == c_id)
    assert not missing_chunks(_share(manifest, shard), _journal(c, manifest.digest))
    bad = _log_events(c, "chunk failed verification")
    assert {e["peer"] for e in bad} == {a_id} and len(bad) == 2  # the sender is named
    assert len(_outputs(c)) == len(PROMPTS)


def test_restarted_node_resumes_its_shard_and_fails_clearly_when_no_holder_is_left(tmp_path, nodes, model_dir) -> None:
    (a, b), manifest = _cluster_with_holder(nodes, tmp_path, model_dir, 2, hooks={0: {"model_serve_delay": "0.1"}})
    a_id, b_id = self_id(a), self_id(b)
    _place(a, [a_id, b_id], 2)
    wait_until(lambda: chunk_bytes_of(manifest, _journal(b, manifest.digest)) > 0, 40, interval=0.1,
               what="B verified some chunks")
    b.kill()
    before = _journal(b, manifest.digest)  # what B made durable before it died
    assert before
    b.start()
    wait_until(lambda: converged([a, b], 2), 40, what="B back")
    # the killed instance (and any re-placement of it the master made) goes
    quiet_since = time.monotonic()
    deadline = quiet_since + 40
    while time.monotonic() - quiet_since < 3 and time.monotonic() < deadline:
        stale = a.get("/instances").json()
        for inst in stale:
            httpx.delete(f"{a.url}/instances/{inst['instance_id']}", timeout=30)
        if stale:
            quiet_since = time.monotonic()
        time.sleep(0.3)
    held = _journal(b, manifest.digest)
    assert all(held.get(p, set()) >= i for p, i in before.items())  # nothing verified was lost
    again = _place(a, [a_id, b_id], 2)
    view = _wait_ready(a, again, timeout=120)
    shard = next(s for s in view["shards"] if s["node_id"] == b_id)
    wanted = _share(manifest, shard)
    fetched = [e for e in _log_events(b, "shard fetched") if e.get("instance_id") == again]
    assert fetched, b.log_tail()
    # nothing verified before the restart was fetched again
    assert fetched[-1]["bytes"] == chunk_bytes_of(manifest, missing_chunks(wanted, held))
    assert fetched[-1]["bytes"] < chunk_bytes_of(manifest, wanted)
    _delete(a, again)

    # only A holds the model; it dies while B fetches the rest of it for a single-rank
    # instance: the instance fails with the reason within the bound (strikes + rounds)
    doomed = _place(a, [b_id], 1)
    start_bytes = chunk_bytes_of(manifest, _journal(b, manifest.digest))
    wait_until(lambda: chunk_bytes_of(manifest, _journal(b, manifest.digest)) > start_bytes, 40, interval=0.1,
               what="B verified more chunks")
    a.kill()
    started = time.monotonic()

    def failed() -> str | None:
        for inst in b.get("/instances").json():
            if inst["instance_id"] == doomed and inst["status"] == "failed":
                return inst["reason"]
        return None

    reason = wait_until(failed, 60, what="instance failed")
    assert "cannot fetch the shard" in reason and "could not be fetched" in reason, reason
    assert time.monotonic() - started < 60
