"""Models travel between real node processes (docs/models.md): a model only on node A is pulled by
node B over the cluster (bulk path opened by a libp2p ticket, every chunk verified), listed
with its holders, and removed again. The tiny synthetic model keeps it quick."""

from __future__ import annotations

import shutil
import subprocess
import sys

import httpx
import pytest

from exo_p2p.models.manifest import build_manifest
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, converged, self_id, wait_until

pytestmark = pytest.mark.integration
MODEL = "tiny-travel"


def _held(node: NodeProcess, holder: str) -> list:
    state = node.get("/state").json()
    profile = state.get("nodes", {}).get(holder) or {}
    return profile.get("held_models") or []


def test_pull_copies_a_model_from_its_only_holder(tmp_path, nodes) -> None:
    models = tmp_path / "models"
    make_synthetic_model(models / MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=4)
    manifest = build_manifest(models / MODEL, MODEL)
    a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models)]).start()
    nodes.append(a)
    b = NodeProcess(tmp_path / "b", cluster=a.cluster,
                    extra_args=[x for addr in a.addrs() for x in ("--bootstrap", addr)]).start()
    nodes.append(b)
    wait_until(lambda: converged([a, b], 2), 30, what="2-node cluster")
    a_id = self_id(a)
    wait_until(lambda: [MODEL, manifest.digest, True] in _held(b, a_id), 30, what="A's manifest in B's State")

    listed = b.get("/models/cluster").json()
    entry = next(m for m in listed if m["model"] == MODEL)
    assert entry["manifests"] == [{"digest": manifest.digest, "complete": [a_id], "partial": []}]

    reply = b.post("/models/pull", json={"model": MODEL})
    assert reply.status_code == 201, reply.text
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 409  # already running

    def pull_status() -> dict | None:
        pulls = {p["model"]: p for p in b.get("/models/pulls").json()}
        status = pulls.get(MODEL)
        return status if status and status["state"] != "running" else None

    status = wait_until(pull_status, 60, what="pull finished")
    assert status["state"] == "done", status
    assert status["bytes_total"] == status["bytes_done"] == manifest.total_bytes
    assert status["bytes_by_peer"] == {a_id: manifest.total_bytes}
    pulled = tmp_path / "b" / "models" / "pulled" / MODEL
    for f in manifest.files:
        assert (pulled / f.path).read_bytes() == (models / MODEL / f.path).read_bytes()
    wait_until(lambda: any(m["model"] == MODEL for m in b.get("/models").json()), 20, what="B lists the model")
    b_id = self_id(b)
    wait_until(lambda: [MODEL, manifest.digest, True] in _held(a, b_id), 30, what="B holds it in State")
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 409  # already here
    assert b.post("/models/pull", json={"model": "nope"}).status_code == 400

    removed = httpx.delete(f"{b.url}/models/{MODEL}", timeout=10)
    assert removed.status_code == 200, removed.text
    assert not pulled.exists()
    wait_until(lambda: not any(m["model"] == MODEL for m in b.get("/models").json()), 20, what="B forgot the model")

    # the same through the CLI: pull (progress bar, then a summary line), models, rm
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "exo_p2p", *args, "--api", b.url],
                              capture_output=True, text=True, timeout=120)

    pulled_cli = cli("pull", MODEL, "--from", a_id[:16])
    assert pulled_cli.returncode == 0, pulled_cli.stderr
    assert f"pulled {MODEL}" in pulled_cli.stdout and pulled.is_dir()
    listing = cli("models")
    assert listing.returncode == 0 and "models in the cluster" in listing.stdout and MODEL in listing.stdout
    unknown = cli("pull", "no-such-model")
    assert unknown.returncode == 1 and "not held completely" in unknown.stderr
    assert cli("rm", MODEL).returncode == 0 and not pulled.exists()


def _two_nodes(tmp_path, nodes, a_extra: list[str]):
    """A (holding the model, slowed by ``a_extra`` fault hooks) and B joined to it; returns
    (a, b, manifest, models dir) once B sees A's manifest."""
    models = tmp_path / "models"
    make_synthetic_model(models / MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=4)
    manifest = build_manifest(models / MODEL, MODEL)
    a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models), *a_extra]).start()
    nodes.append(a)
    b = NodeProcess(tmp_path / "b", cluster=a.cluster,
                    extra_args=[x for addr in a.addrs() for x in ("--bootstrap", addr)]).start()
    nodes.append(b)
    wait_until(lambda: converged([a, b], 2), 30, what="2-node cluster")
    wait_until(lambda: [MODEL, manifest.digest, True] in _held(b, self_id(a)), 30, what="A's manifest in B's State")
    return a, b, manifest, models


def _journal(b: NodeProcess, digest: str) -> list[tuple[str, int]]:
    path = b.data_dir / "models" / ".fetched" / digest / ".verified"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(name, int(index)) for index, _, name in (ln.partition(" ") for ln in lines) if index.isdigit() and name]


def _finished(b: NodeProcess):
    def check() -> dict | None:
        status = {p["model"]: p for p in b.get("/models/pulls").json()}.get(MODEL)
        return status if status and status["state"] != "running" else None
    return check


def test_restarted_node_resumes_a_pull_without_refetching_verified_chunks(tmp_path, nodes) -> None:
    a, b, manifest, models = _two_nodes(tmp_path, nodes, ["--fault-hook", "model_serve_delay=0.1"])
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 201
    wait_until(lambda: len(_journal(b, manifest.digest)) >= 5, 30, what="some chunks verified")
    b.kill()  # SIGKILL mid-transfer
    verified = set(_journal(b, manifest.digest))
    n_chunks = sum(len(f.chunks) for f in manifest.files)
    assert 5 <= len(verified) < n_chunks
    verified_bytes = sum(manifest.file(p).chunks[i].end - manifest.file(p).chunks[i].start for p, i in verified)
    b.start()
    # the restarted node publishes its partial copy, then a new pull fetches only the rest
    wait_until(lambda: [MODEL, manifest.digest, False] in _held(a, self_id(b)), 30, what="B's partial copy in State")
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 201
    status = wait_until(_finished(b), 60, what="resumed pull finished")
    assert status["state"] == "done", status
    assert status["bytes_by_peer"] == {self_id(a): manifest.total_bytes - verified_bytes}
    for f in manifest.files:
        assert (b.data_dir / "models" / "pulled" / MODEL / f.path).read_bytes() == (models / MODEL / f.path).read_bytes()


def test_pull_fails_with_the_reason_when_its_only_source_dies(tmp_path, nodes) -> None:
    a, b, manifest, _ = _two_nodes(tmp_path, nodes, ["--fault-hook", "model_serve_delay=0.1"])
    a_id = self_id(a)
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 201
    wait_until(lambda: len(_journal(b, manifest.digest)) >= 3, 30, what="some chunks verified")
    a.kill()
    status = wait_until(_finished(b), 40, what="pull given up")
    assert status["state"] == "failed"
    assert "could not be fetched" in status["error"] and a_id in status["error"], status["error"]
    assert not (b.data_dir / "models" / "pulled" / MODEL).exists()


def test_corrupted_chunks_are_refetched_from_another_holder(tmp_path, nodes) -> None:
    # A and C hold the same files (one models dir); A corrupts the first 3 chunks it serves
    a, b, manifest, models = _two_nodes(tmp_path, nodes, ["--fault-hook", "model_corrupt_chunks=3"])
    c = NodeProcess(tmp_path / "c", cluster=a.cluster,
                    extra_args=["--models-dir", str(models), *[x for addr in a.addrs() for x in ("--bootstrap", addr)]]).start()
    nodes.append(c)
    wait_until(lambda: converged([a, b, c], 3), 30, what="3-node cluster")
    wait_until(lambda: [MODEL, manifest.digest, True] in _held(b, self_id(c)), 30, what="C's manifest in B's State")
    assert b.post("/models/pull", json={"model": MODEL}).status_code == 201
    status = wait_until(_finished(b), 60, what="pull finished")
    assert status["state"] == "done", status
    assert status["bad_chunks_by_peer"] == {self_id(a): 3}
    assert sum(status["bytes_by_peer"].values()) == manifest.total_bytes
    for f in manifest.files:
        assert (b.data_dir / "models" / "pulled" / MODEL / f.path).read_bytes() == (models / MODEL / f.path).read_bytes()
    assert "chunk failed verification" in b.log_path.read_text()


def test_every_name_of_one_set_of_files_stays_listed_after_pulls(tmp_path, nodes) -> None:
    """A holds the same files as MODEL and ALIAS: both names are listed with the one manifest,
    B pulls each by its name, and afterwards ``GET /models/cluster`` lists both names, each
    complete on A and B."""
    alias = f"{MODEL}-alias"
    models = tmp_path / "models"
    make_synthetic_model(models / MODEL, n_layers=4, hidden_size=64, intermediate_size=128, seed=4)
    shutil.copytree(models / MODEL, models / alias)
    digest = build_manifest(models / MODEL, MODEL).digest
    a = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models)]).start()
    nodes.append(a)
    b = NodeProcess(tmp_path / "b", cluster=a.cluster,
                    extra_args=[x for addr in a.addrs() for x in ("--bootstrap", addr)]).start()
    nodes.append(b)
    wait_until(lambda: converged([a, b], 2), 30, what="2-node cluster")
    a_id, b_id = self_id(a), self_id(b)
    wait_until(lambda: [alias, digest, True] in _held(b, a_id), 30, what="A's second name in B's State")

    def rows(node: NodeProcess) -> dict:
        return {m["model"]: m["manifests"] for m in node.get("/models/cluster").json()}

    assert {name: rows(b)[name] for name in (MODEL, alias)} == {
        name: [{"digest": digest, "complete": [a_id], "partial": []}] for name in (MODEL, alias)}
    for name in (alias, MODEL):
        reply = b.post("/models/pull", json={"model": name})
        assert reply.status_code == 201, reply.text

        def done(name: str = name) -> dict | None:
            status = {p["model"]: p for p in b.get("/models/pulls").json()}.get(name)
            return status if status and status["state"] != "running" else None

        assert wait_until(done, 60, what=f"pull of {name}")["state"] == "done"
    both = sorted([a_id, b_id])
    wait_until(lambda: all([n, digest, True] in _held(a, b_id) for n in (MODEL, alias)), 30, what="both names of B in State")
    for node in (a, b):
        listed = rows(node)
        assert {name: listed[name] for name in (MODEL, alias)} == {
            name: [{"digest": digest, "complete": both, "partial": []}] for name in (MODEL, alias)}, listed
