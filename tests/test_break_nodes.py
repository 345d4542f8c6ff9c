"""A careless or hostile user against one real node process: model names that would name a
directory above the pulled models, and bad input to the API and the CLI. One node, started
once for the module, holding the tiny synthetic model."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.cluster import NodeProcess, nodes_cleanup

pytestmark = pytest.mark.integration
MODEL = "tiny-break"
ORPHAN, KEPT = "e" * 64, "c" * 64


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("break")
    make_synthetic_model(base / "models" / MODEL, n_layers=2, hidden_size=64, intermediate_size=128, seed=6)
    fetched = base / "n" / "models" / ".fetched"  # what an interrupted rm of an older version left
    (fetched / ORPHAN).mkdir(parents=True)
    (fetched / ORPHAN / "model.safetensors.part").write_bytes(b"x" * 1000)
    (fetched / KEPT).mkdir()
    (fetched / KEPT / ".manifest.json").write_bytes(b"{}")
    with nodes_cleanup([]) as listed:
        listed.append(NodeProcess(base / "n", extra_args=["--models-dir", str(base / "models")]).start())
        yield listed[0]


def _cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exo_p2p", *args, "--api", node.url],
                          capture_output=True, text=True, timeout=60)


def test_rm_of_a_name_above_the_pulled_models_is_refused(node: NodeProcess) -> None:
    """``DELETE /models/`` used to delete every pulled model, ``/models/%2E%2E`` the models
    dir and ``/models/..%2F..`` the node's data dir (its identity key included)."""
    models = node.data_dir / "models"
    kept = [models / "pulled" / "other" / "config.json", models / ".fetched" / "d" / ".verified"]
    for p in kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("keep")
    for name in ("", "%2E%2E", "..%2F..", "other%2F..", "%2E"):
        reply = httpx.delete(f"{node.url}/models/{name}", timeout=10)
        assert reply.status_code == 400, (name, reply.text)
        assert reply.json()["error"]["param"] == "model"
    assert all(p.exists() for p in kept) and (node.data_dir / "identity.key").exists()
    reply = node.post("/models/pull", json={"model": "../x"})
    assert reply.status_code == 400 and "model name" in reply.json()["error"]["message"], reply.text
    out = _cli(node, "rm", "a/../..")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out
    odd = _cli(node, "rm", "a?b#c")  # sent as one name, not a query string
    assert odd.returncode == 1 and "'a?b#c'" in odd.stderr, odd
    assert all(p.exists() for p in kept)


def test_a_fetched_dir_without_a_manifest_is_removed_at_start(node: NodeProcess) -> None:
    """Such dirs (an ``rm`` under a running fetch, older versions) were never deleted by any
    ``rm``; a dir with a manifest (a copy to resume) is kept."""
    fetched = node.data_dir / "models" / ".fetched"
    assert not (fetched / ORPHAN).exists() and (fetched / KEPT / ".manifest.json").exists()
    log = node.log_path.read_text(errors="replace")
    assert "fetched copy with no manifest" in log and ORPHAN in log, node.log_tail()
