"""Models no node holds, read from a model hub (docs/models.md#models-from-a-hub), with real
node processes and the local stand-in hub (``tests/support/models/hub_server.py``) serving a tiny synthetic
model as ``org/tiny``: each rank downloads only its shard from the hub, a node placed later
takes every byte from its peers, faults of the hub are retried or detected, and a restart
resumes a download."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from exo_p2p.models.transfer.chunk_sets import shard_chunks
from exo_p2p.models.hub.client import HubClient
from exo_p2p.models.hub.manifest import UNKNOWN, resolve_hub_model
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.manifest import ModelManifest
from tests.support.cluster import NodeProcess, converged, self_id, wait_until
from tests.support.models.hub_server import HubServer

pytestmark = pytest.mark.integration
MODEL = "org/tiny"
N_LAYERS = 8
PROMPTS = ["hello there", "the quick brown fox"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hub-models") / "tiny"
    make_synthetic_model(out, n_layers=N_LAYERS, hidden_size=128, intermediate_size=256, seed=3)
    return out


@pytest.fixture()
def hub(model_dir):
    with HubServer() as server:
        server.add_dir(MODEL, model_dir)
        yield server


def _manifest(hub: HubServer) -> ModelManifest:
    """The hub model's manifest, read in this process (online, whatever ``HF_HUB_OFFLINE``
    ``.ci/run`` exports: huggingface_hub reads it once, at import)."""
    import os

    from huggingface_hub import constants

    old, old_offline = os.environ.get("HF_ENDPOINT"), constants.HF_HUB_OFFLINE
    os.environ["HF_ENDPOINT"], constants.HF_HUB_OFFLINE = hub.endpoint, False
    offline_env = os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        return resolve_hub_model(HubClient(MODEL, user_agent={"exo-p2p-node": "test"}), MODEL)[2]
    finally:
        constants.HF_HUB_OFFLINE = old_offline
        if offline_env is not None:
            os.environ["HF_HUB_OFFLINE"] = offline_env
        if old is None:
            os.environ.pop("HF_ENDPOINT")
        else:
            os.environ["HF_ENDPOINT"] = old


def _start(nodes: list, path: Path, hub: HubServer, *, first: NodeProcess | None = None, extra: list[str] | None = None,
           env: dict | None = None) -> NodeProcess:
    args = list(extra or [])
    if first is not None:
        args += [x for addr in first.addrs() for x in ("--bootstrap", addr)]
    hub_env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(path / "hf"), **(env or {})}
    node = NodeProcess(path, cluster=first.cluster if first else None, extra_args=args, env=hub_env).start()
    nodes.append(node)
    return node


def _cluster(nodes, tmp_path, hub, n: int) -> list[NodeProcess]:
    out: list[NodeProcess] = []
    for i in range(n):
        out.append(_start(nodes, tmp_path / f"n{i}", hub, first=out[0] if out else None))
    wait_until(lambda: converged(out, n), 40, what=f"{n}-node cluster")
    ids = [self_id(x) for x in out]
    wait_until(lambda: all(out[-1].get("/state").json()["nodes"].get(i, {}).get("models_disk_free") is not None
                           for i in ids), 40, what="free disk in State")
    return out


def _wait_ready(node: NodeProcess, iid: str, timeout: float = 120) -> dict:
    def check():
        view = node.get(f"/instances/{iid}").json()
        assert view["status"] != "failed", view
        return view if view["status"] == "ready" else None

    return wait_until(check, timeout, interval=0.2, what="instance ready")


def _place(node: NodeProcess, **body) -> str:
    r = node.post("/instances", json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 201, r.text
    return r.json()["instance_id"]


def _outputs(node: NodeProcess) -> list[str]:
    out = []
    for prompt in PROMPTS:
        r = node.chat(prompt, MODEL, max_tokens=8, temperature=0)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def _unhashed_bytes(manifest: ModelManifest, wanted: dict[str, tuple[int, ...]]) -> int:
    """Bytes of the chunks of ``wanted`` only a hub can give at first (weights, not headers)."""
    return sum(c.end - c.start for f in manifest.files for i, c in enumerate(f.chunks)
               if i in wanted.get(f.path, ()) and c.sha256 == UNKNOWN)


def _settled(read, quiet: float = 1.0, timeout: float = 15.0) -> int:  # type: ignore[no-untyped-def]
    """``read()`` once it has not changed for ``quiet`` seconds (at most ``timeout``): the hub
    counts bytes as it sends them, and after a client is killed it goes on writing into the
    dead connection's socket buffers until the kernel refuses (measured: one 64 KiB run)."""
    value, since, deadline = read(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return value


def _small_bytes(manifest: ModelManifest) -> int:
    return sum(c.end - c.start for f in manifest.files for c in f.chunks if c.sha256 != UNKNOWN)


def test_a_pipeline_downloads_each_shard_from_the_hub_once_and_a_later_node_from_peers(tmp_path, nodes, hub):
    """A 2-node pipeline of ``org/tiny``, held by no node: each node's hub bytes are its
    shard's weights within ±10% (plus the small files on the node that read the card); a third
    node placed alone later fetches the whole model from the two partial copies: 0 hub bytes,
    and its greedy answers equal the pipeline's."""
    manifest = _manifest(hub)
    a, b = _cluster(nodes, tmp_path, hub, 2)
    ids = {self_id(a): a, self_id(b): b}
    _check_previews(a, hub)
    iid = _place(a, min_nodes=2)
    view = _wait_ready(a, iid)
    pipeline = _outputs(a)
    shards = view["shards"]
    assert len(shards) == 2
    for shard in shards:
        wanted = shard_chunks(manifest, start_layer=shard["start_layer"], end_layer=shard["end_layer"],
                              n_layers=N_LAYERS, tied=True)
        expected = _unhashed_bytes(manifest, wanted)
        got = hub.hub_bytes(shard["node_id"])
        slack = 0.1 * expected + (_small_bytes(manifest) if ids[shard["node_id"]] is a else 0)
        assert abs(got - expected) <= slack, (shard, got, expected)
    total_hub = sum(hub.hub_bytes(i) for i in ids)
    assert total_hub <= 1.05 * manifest.total_bytes, (total_hub, manifest.total_bytes)
    assert httpx.delete(f"{a.url}/instances/{iid}", timeout=30).status_code == 200

    c = _start(nodes, tmp_path / "n2", hub, first=a)
    wait_until(lambda: converged([a, b, c], 3), 40, what="3-node cluster")
    c_id = self_id(c)
    wait_until(lambda: a.get("/state").json()["nodes"].get(c_id, {}).get("models_disk_free") is not None, 40,
               what="C's free disk")
    iid = _place(a, min_nodes=1, nodes=[c_id])
    _wait_ready(a, iid)
    assert hub.hub_bytes(c_id) == 0
    assert _outputs(a) == pipeline


def _check_previews(a: NodeProcess, hub: HubServer) -> None:
    """Previews of ``org/tiny``, which no node read yet, read its card from the hub and say
    per node what it fetches from where: a 2-node pipeline's first rank everything from the
    hub, the last rank its tied head from the first rank's node and the rest from the hub; a
    missing repo is a 404 naming it, and nothing of the weights was asked for."""
    r = a.get("/instances/previews", params={"model": MODEL})
    assert r.status_code == 200, r.text
    two = [p for p in r.json() if p["sharding"] == "pipeline" and p["world_size"] == 2 and not p["error"]]
    assert two, r.json()
    for p in two:
        assert [x + y for x, y in zip(p["fetch_from_peers"], p["fetch_from_hub"])] == p["fetch_bytes"]
        assert p["fetch_from_peers"][0] == 0 and p["fetch_from_hub"][0] > 0
        assert 0 < p["fetch_from_peers"][1] < p["fetch_bytes"][1]  # the tied embedding, from rank 0's node
        assert p["fetch_from"] == "peers, then the hub"
    weights = sum(len(b) for f, b in hub.repos[MODEL].files.items() if f.endswith(".safetensors"))
    assert sum(hub.bytes_by_client.values()) < weights // 10  # small files and headers only
    r = a.get("/instances/previews", params={"model": "org/missing"})
    assert r.status_code == 404 and "org/missing not found" in r.json()["error"]["message"], r.text


def test_offline_nodes_never_ask_the_hub(tmp_path, nodes, hub):
    """With ``--offline`` a model nobody holds is unknown (404), and the hub saw no request."""
    a = _start(nodes, tmp_path / "off", hub, extra=["--offline"])
    r = a.post("/instances", json={"model": MODEL, "min_nodes": 1}, timeout=60)
    assert r.status_code == 404, r.text
    assert hub.requests == []


def test_hub_faults_are_retried_resumed_or_detected(tmp_path, nodes, hub, model_dir):
    """A single node places ``org/tiny`` from a hub that cuts one answer mid-body, answers 503
    twice and serves one corrupted range: the cut is resumed, the 503s retried, the corrupted
    file caught by its SHA-256 and fetched again, and the answers are the model's. Then a
    hub asking for a token: the placement of another repo fails naming HF_TOKEN."""
    hub.faults.drop, hub.faults.drop_after = 1, 20_000
    hub.faults.unavailable = 2
    hub.faults.corrupt = 1
    a = _start(nodes, tmp_path / "a", hub)
    wait_until(lambda: a.get("/state").json()["nodes"].get(self_id(a), {}).get("models_disk_free") is not None, 40,
               what="free disk")
    iid = _place(a, min_nodes=1)
    _wait_ready(a, iid, timeout=180)
    assert hub.faults.drop == hub.faults.unavailable == hub.faults.corrupt == 0
    log = a.log_path.read_text(errors="replace")
    assert "failed its hub SHA-256" in log
    assert "hub request failed; retrying" in log
    assert all(isinstance(x, str) for x in _outputs(a))
    hub.add_dir("org/gated", model_dir)
    hub.faults.token = "secret"
    r = a.post("/instances", json={"model": "org/gated", "min_nodes": 1}, timeout=60)
    assert r.status_code == 404, r.text
    assert "HF_TOKEN" in r.json()["error"]["message"]


def test_a_restarted_node_resumes_its_download(tmp_path, nodes, hub):
    """A node killed while it downloads ``org/tiny`` from a slow hub takes, after its restart,
    only the chunks its journal does not hold (the runs in flight at the kill are lost)."""
    manifest = _manifest(hub)
    hub.faults.delay = 0.05
    a = _start(nodes, tmp_path / "a", hub)
    me = self_id(a)
    wait_until(lambda: a.get("/state").json()["nodes"].get(me, {}).get("models_disk_free") is not None, 40,
               what="free disk")
    _place(a, min_nodes=1)

    def partly() -> dict | None:
        view = a.get("/instances").json()
        shards = [s for i in view for s in i["shards"]]
        return next((s for s in shards if s.get("bytes_done") and s["bytes_done"] > manifest.total_bytes // 3), None)

    shard = wait_until(partly, 120, interval=0.1, what="a third downloaded")
    assert shard["bytes_from_hub"] > 0 and shard["bytes_from_peers"] == 0, shard  # the source split, as it went
    a.kill()
    journal = a.data_dir / "models" / ".fetched" / manifest.digest / ".verified"
    held = {tuple(line.split(" ", 1)[::-1]) for line in journal.read_text().splitlines() if " " in line}
    journaled = _unhashed_bytes(manifest, {p: tuple(int(i) for q, i in held if q == p) for p, _ in held})
    assert journaled > 0
    before = _settled(lambda: hub.hub_bytes(me))  # the stand-in may still be sending to the killed node
    hub.faults.delay = 0.0
    a.start()
    wait_until(lambda: any(i["status"] == "ready" for i in a.get("/instances").json()), 120, what="ready again")
    after = hub.hub_bytes(me) - before
    weights = _unhashed_bytes(manifest, {f.path: tuple(range(len(f.chunks))) for f in manifest.files})
    assert after <= weights - journaled, (before, after, journaled)  # no journaled chunk again
    lines = [json.loads(x) for x in a.log_path.read_text(errors="replace").splitlines() if x.startswith("{")]
    assert any(r.get("event") == "shard fetched" for r in lines)


def _pull(node: NodeProcess, model: str = MODEL) -> dict:
    r = node.post("/models/pull", json={"model": model})
    assert r.status_code in (200, 201, 202), r.text

    def done():
        pulls = {p["model"]: p for p in node.get("/models/pulls").json()}
        assert pulls.get(model, {}).get("state") != "failed", pulls
        return pulls[model] if pulls.get(model, {}).get("state") == "done" else None

    return wait_until(done, 120, what="pull done")


def test_a_pull_from_the_hub_sends_the_token_and_lands_in_the_hugging_face_cache(tmp_path, nodes, hub, model_dir):
    """``POST /models/pull`` of ``org/tiny`` from a hub that wants a token, on a node with
    ``HF_TOKEN``: the copy lands in the node's Hugging Face cache as ``huggingface_hub`` lays
    it out (``scan_cache_dir`` lists it, ``snapshot_download(local_files_only=True)`` finds
    it: what mlx-lm calls), with the repo's bytes and nothing left in the node's own dirs;
    the hub sent each byte about once, the pull's status says so (all from the hub), and the
    node lists and serves the model from there."""
    from huggingface_hub import scan_cache_dir, snapshot_download

    hub.faults.token = "secret"
    a = _start(nodes, tmp_path / "a", hub, env={"HF_TOKEN": "secret"})
    status = _pull(a)
    cache = a.data_dir / "hf" / "hub"
    (repo,) = scan_cache_dir(cache).repos
    assert repo.repo_id == MODEL and [r.commit_hash for r in repo.revisions] == [hub.repos[MODEL].commit]
    snapshot = Path(snapshot_download(MODEL, cache_dir=str(cache), local_files_only=True))
    assert status["path"] == str(snapshot)
    for path in model_dir.iterdir():
        assert (snapshot / path.name).read_bytes() == path.read_bytes(), path.name
    assert not (a.data_dir / "models" / "pulled" / MODEL).exists()
    assert [p.name for p in (a.data_dir / "models" / ".fetched").iterdir() if p.name != ".views"] == []
    size = sum(p.stat().st_size for p in model_dir.iterdir())
    assert hub.hub_bytes(self_id(a)) <= size * 1.05
    assert status["bytes_from_peers"] == 0 and 0 < status["bytes_from_hub"] <= status["bytes_total"]
    wait_until(lambda: any(m["model"] == MODEL for m in a.get("/models").json()), 40, what="listed")
    # what it publishes to peers (the manifest hashed as the bytes arrived) is the files' own
    from exo_p2p.models.manifest import build_manifest

    want = build_manifest(snapshot, MODEL).digest
    assert (a.data_dir / "models" / ".manifests" / "org--tiny.manifest.json").is_file()
    wait_until(lambda: [MODEL, want, True] in a.get("/state").json()["nodes"][self_id(a)]["held_models"], 40,
               what="the copy's manifest published")
    r = a.post("/models/pull", json={"model": MODEL})
    assert r.status_code == 409 and "already on this node" in r.text, r.text
    iid = _place(a, min_nodes=1)
    _wait_ready(a, iid)
    assert all(isinstance(x, str) for x in _outputs(a))
    assert hub.hub_bytes(self_id(a)) <= size * 1.05  # served from the cache, nothing fetched again


def test_a_node_with_a_models_dir_pulls_into_it(tmp_path, nodes, hub, model_dir):
    """A node started with ``--models-dir`` puts a pull from the hub there as ``ORG/NAME``,
    not in the Hugging Face cache, and lists it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    a = _start(nodes, tmp_path / "a", hub, extra=["--models-dir", str(mine)])
    status = _pull(a)
    assert status["path"] == str(mine / MODEL)
    for path in model_dir.iterdir():
        assert (mine / MODEL / path.name).read_bytes() == path.read_bytes(), path.name
    assert not (a.data_dir / "hf" / "hub").exists()
    wait_until(lambda: any(m["model"] == MODEL for m in a.get("/models").json()), 40, what="listed")
