"""A hub pull's copy in the Hugging Face cache (docs/models.md#models-from-a-hub): the layout
``huggingface_hub`` itself writes, so its own readers (``scan_cache_dir``,
``snapshot_download(local_files_only=True)``, what mlx-lm calls) and this node's store find
the model there; a blob already cached is kept; a revision that would leave ``refs/`` is
refused. No network: the copy is made by hand as a pull leaves it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from exo_p2p.models.hub.cache import cache_dir, git_blob_id, land, storage_dir
from exo_p2p.models.stores.store import hf_cache_models, is_mlx_model_dir
from tests.support.models.synthetic_models import make_synthetic_model

pytestmark = pytest.mark.unit
REPO = "org/tiny"
COMMIT = "c" * 40


@pytest.fixture()
def copy(tmp_path) -> tuple[Path, dict[str, bytes]]:
    """A complete copy as a pull leaves it (plus its journal), and its files' bytes."""
    root = make_synthetic_model(tmp_path / "copy", n_layers=2, hidden_size=32, intermediate_size=64, seed=1)
    (root / ".verified").write_text("0 config.json\n")
    return root, {p.name: p.read_bytes() for p in root.iterdir() if not p.name.startswith(".")}


def _blob_ids(files: dict[str, bytes]) -> dict[str, str]:
    """The ids the hub gives: SHA-256 of a weight file, "" for the rest (computed by land)."""
    return {p: hashlib.sha256(b).hexdigest() if p.endswith(".safetensors") else "" for p, b in files.items()}


def test_a_landed_copy_is_what_huggingface_hub_reads(copy, tmp_path, monkeypatch):
    from huggingface_hub import scan_cache_dir, snapshot_download

    root, files = copy
    cache = tmp_path / "hf" / "hub"
    snapshot = land(root, _blob_ids(files), REPO, COMMIT, None, cache)
    storage = storage_dir(cache, REPO)
    assert storage.name == "models--org--tiny" and snapshot == storage / "snapshots" / COMMIT
    assert (storage / "refs" / "main").read_text() == COMMIT
    for path, data in files.items():
        pointer = snapshot / path
        assert pointer.is_symlink() and not os.path.isabs(os.readlink(pointer))
        assert pointer.read_bytes() == data
        blob = Path(os.path.realpath(pointer))
        assert blob.parent == storage / "blobs"
        want = hashlib.sha256(data).hexdigest() if path.endswith(".safetensors") else \
            hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        assert blob.name == want
    assert sorted(p.name for p in root.iterdir()) == [".verified"]  # only what is no model file
    (repo,) = scan_cache_dir(cache).repos
    assert (repo.repo_id, repo.repo_type, [r.commit_hash for r in repo.revisions]) == (REPO, "model", [COMMIT])
    assert repo.size_on_disk == sum(len(b) for b in files.values())
    assert Path(snapshot_download(REPO, cache_dir=str(cache), local_files_only=True)) == snapshot
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_dir() == cache
    assert is_mlx_model_dir(snapshot)
    assert [(m.model_id, m.path) for m in hf_cache_models()] == [(REPO, snapshot)]


def test_a_cached_blob_is_kept_and_a_branch_gets_its_ref(copy, tmp_path):
    root, files = copy
    cache = tmp_path / "cache"
    blobs = _blob_ids(files)
    weights = next(p for p in files if p.endswith(".safetensors"))
    cached = storage_dir(cache, REPO) / "blobs" / blobs[weights]
    cached.parent.mkdir(parents=True)
    cached.write_bytes(files[weights])
    inode = cached.stat().st_ino
    snapshot = land(root, blobs, REPO, COMMIT, "v1.0", cache)
    assert cached.stat().st_ino == inode and not (root / weights).exists()
    assert (snapshot / weights).read_bytes() == files[weights]
    assert (storage_dir(cache, REPO) / "refs" / "v1.0").read_text() == COMMIT
    assert not (storage_dir(cache, REPO) / "refs" / "main").exists()
    again = make_synthetic_model(tmp_path / "again", n_layers=2, hidden_size=32, intermediate_size=64, seed=1)
    assert land(again, blobs, REPO, COMMIT, COMMIT, cache) == snapshot  # a commit names no ref
    assert sorted(p.name for p in (storage_dir(cache, REPO) / "refs").iterdir()) == ["v1.0"]


def test_a_revision_leaving_refs_is_refused(copy, tmp_path):
    root, files = copy
    with pytest.raises(ValueError, match="revision"):
        land(root, _blob_ids(files), REPO, COMMIT, "../../x", tmp_path / "cache")
    assert git_blob_id(root / "config.json") == hashlib.sha1(
        b"blob %d\0" % len(files["config.json"]) + files["config.json"]).hexdigest()
