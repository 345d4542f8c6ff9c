"""A model repository cannot fill a node's disk, and a full data dir never keeps a node from
starting (``exo_p2p.models.copies.disk_room``, docs/security.md): real node processes whose data dir
is a 48 MB tmpfs the test mounts (root only), the local stand-in hub (``tests/support/models/hub_server.py``)
serving a repo whose small files do not fit.

- a placement whose small files do not fit gets 507 naming the free bytes, and the CLI says so
  (non-zero exit); it keeps running, nothing of the repo stays on its disk;
- a partial copy left by an older version that filled the disk is removed at start, and the
  node starts;
- a data dir filled by something else while the node runs stops it with a line naming the
  free bytes (it never applies an event it cannot keep), and it starts again once there is room.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from exo_p2p.models.hub_limits import MAX_CONFIG_BYTES
from tests.support.models.synthetic_models import make_synthetic_model
from exo_p2p.types.manifest import Chunk, ManifestFile, ModelManifest
from tests.support.cluster import REPO, NodeProcess, wait_until
from tests.support.models.hub_server import HubServer, _git_blob_id

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounts a 48 MB tmpfs as the data dir: needs root")]
FS_BYTES = 48 * 1024 * 1024
BIG = "org/big"


@pytest.fixture()
def small_fs(tmp_path):
    """A 48 MB tmpfs at ``tmp_path/fs``, unmounted at the end."""
    where = tmp_path / "fs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(params=[("tokenizer.json", 20_000_000), ("config.json", 200_000_000)], ids=["tokenizer-20MB", "config-200MB"])
def hub(request, tmp_path_factory):
    """The stand-in hub serving ``org/big``: a tiny model with one small file made large: a
    20 MB ``tokenizer.json`` (a size a real tokenizer may have, more than a 48 MB disk keeps
    beside its reserve) or the 200 MB ``config.json`` an attacker served (valid JSON)."""
    name, size = request.param
    model = tmp_path_factory.mktemp("big") / "big"
    make_synthetic_model(model, n_layers=2, hidden_size=64, intermediate_size=128, seed=5)
    with HubServer() as server:
        repo = server.add_dir(BIG, model)
        body = json.loads((model / name).read_text()) if (model / name).exists() else {"version": "1.0"}
        data = json.dumps({**body, "padding": "x" * size}).encode()
        repo.files[name] = data
        repo.blob_ids[name] = _git_blob_id(data)
        repo.sha256s[name] = hashlib.sha256(data).hexdigest()
        yield server


def _node(data_dir: Path, hub: HubServer, log: Path) -> NodeProcess:
    node = NodeProcess(data_dir, env={"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0"})
    node.log_path = log  # outside the small disk: the test reads it whatever happens there
    return node


def _rss(node: NodeProcess) -> int:
    return psutil.Process(node.proc.pid).memory_info().rss


def test_a_repo_that_does_not_fit_gets_507_naming_free_space_and_the_node_keeps_running(small_fs, hub, tmp_path):
    """The 20 MB tokenizer is within its bound (``hub_limits.MAX_TOKENIZER_BYTES``) but not
    within the disk: a preview, which writes nothing, answers; a placement, which keeps the
    small files, gets 507. The 200 MB config is past its bound (``MAX_CONFIG_BYTES``): both
    get 400 naming the limit before anything is read or written."""
    too_big = len(hub.repos[BIG].files["config.json"]) > MAX_CONFIG_BYTES
    node = _node(small_fs / "node", hub, tmp_path / "node.log").start()
    try:
        rss = _rss(node)
        started = time.monotonic()
        r = node.get("/instances/previews", params={"model": BIG}, timeout=60)
        took = time.monotonic() - started
        assert r.status_code == (400 if too_big else 200), r.text
        placed = node.post("/instances", json={"model": BIG}, timeout=60)
        if too_big:
            assert placed.status_code == 400 and "limit" in placed.json()["error"]["message"], placed.text
        else:
            assert placed.status_code == 507, placed.text
            error = placed.json()["error"]
            assert error["code"] == "insufficient_storage" and "free in" in error["message"] and "bytes" in error["message"]
            cli = subprocess.run([sys.executable, "-m", "exo_p2p", "place", BIG, "--api", node.url],
                                 capture_output=True, text=True, timeout=120, cwd=REPO)
            assert cli.returncode != 0 and "not enough free disk" in cli.stderr + cli.stdout, cli.stderr
        assert node.proc.poll() is None and node.get("/health", timeout=5).status_code == 200
        fetched = small_fs / "node" / "models" / ".fetched"
        assert not fetched.exists() or not any(p.is_file() and p.stat().st_size > 1_000_000 for p in fetched.rglob("*"))
        free = shutil.disk_usage(small_fs).free
        print(f"preview {r.status_code} in {took:.2f} s, place {placed.status_code}; RSS {rss >> 20} -> "
              f"{_rss(node) >> 20} MiB; {free >> 20} MiB free on the 48 MB disk")
        assert free > FS_BYTES // 2
    finally:
        node.stop()


def _leftover_copy(data_dir: Path, size: int) -> Path:
    """A partial copy of a model no placement uses, as an older version left it after filling
    the disk: its manifest and a ``.part`` file of ``size`` bytes."""
    manifest = ModelManifest("org/gone", 1 << 20, (ManifestFile("config.json", size, (Chunk(0, size, "0" * 64),)),))
    root = data_dir / "models" / ".fetched" / manifest.digest
    root.mkdir(parents=True)
    (root / ".manifest.json").write_bytes(msgspec.json.encode(manifest))
    with open(root / "config.json.part", "wb") as f:
        try:
            while f.tell() < size:
                f.write(b"\0" * (1 << 20))
        except OSError:
            pass  # the disk is full: as it was left
    return root


@pytest.mark.parametrize("hub", [("tokenizer.json", 1)], ids=["small"], indirect=True)
def test_a_node_whose_disk_a_partial_copy_filled_starts_and_a_full_event_log_stops_it_loudly(small_fs, hub, tmp_path):
    data_dir = small_fs / "node"
    log = tmp_path / "node.log"
    node = _node(data_dir, hub, log).start()
    node.stop()
    copy = _leftover_copy(data_dir, FS_BYTES)
    assert shutil.disk_usage(small_fs).free < 1 << 20
    node = _node(data_dir, hub, log).start(timeout=60)
    other = None
    try:
        assert not copy.exists() and shutil.disk_usage(small_fs).free > FS_BYTES // 2
        assert "removed a partial model copy no placement uses" in log.read_text()
        ballast = small_fs / "ballast"
        with open(ballast, "wb") as f:  # something else fills the disk while the node runs
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        other = NodeProcess(tmp_path / "other", cluster=node.cluster,  # its joining makes events to write
                            extra_args=[x for a in node.addrs() for x in ("--bootstrap", a)])
        other.start()
        wait_until(lambda: node.proc.poll() is not None, 60, what="the node to stop on its full event log")
        tail = log.read_text()[-20000:]
        assert "cannot write the event log" in tail and "bytes free in" in tail and "start it again" in tail
        ballast.unlink()
        node = _node(data_dir, hub, log).start(timeout=60)
        assert node.get("/health", timeout=5).status_code == 200
    finally:
        node.stop()
        if other is not None:
            other.stop()
