"""Models a user already has: MLX-format models in the Hugging Face cache are listed under
their repo id, read-only (docs/models.md, ``exo_p2p.models.stores.store.hf_cache_models``)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.errors import ModelNotFoundError
from exo_p2p.models.stores.store import ModelStore, hf_cache_models
from tests.support.models.synthetic_models import make_synthetic_model


def _no_embedded() -> Path:
    raise ModelNotFoundError("no embedded model in this test")


def _cache_repo(hub: Path, repo_id: str, model: Path, revision: str = "a" * 40) -> Path:
    """``model``'s files laid out as huggingface_hub caches a download: blobs named by hash,
    snapshot entries symlinked to them, ``refs/main``."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for f in sorted(model.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    return snapshot


def test_mlx_models_in_the_hf_cache_are_listed_under_their_repo_id(tmp_path, monkeypatch) -> None:
    make_synthetic_model(tmp_path / "src", n_layers=2, hidden_size=32, intermediate_size=64)
    hf_home = tmp_path / "hf"
    snapshot = _cache_repo(hf_home / "hub", "mlx-community/Tiny-Model-4bit", tmp_path / "src")
    (hf_home / "hub" / "models--someone--not-mlx" / "snapshots" / ("b" * 40)).mkdir(parents=True)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    assert [s.model_id for s in hf_cache_models()] == ["mlx-community/Tiny-Model-4bit"]

    store = ModelStore(tmp_path / "data", find_embedded=_no_embedded)
    assert store.resolve("mlx-community/Tiny-Model-4bit") == snapshot
    cards = {c.model_id: c for c in store.list_cards()}
    assert cards["mlx-community/Tiny-Model-4bit"].n_layers == 2
    # served with a manifest like any local model; never deleted by rm
    depot = ModelDepot(store, tmp_path / "data")
    depot.refresh()
    assert any(h.name == "mlx-community/Tiny-Model-4bit" and h.complete for h in depot.held())
    assert depot.remove("mlx-community/Tiny-Model-4bit") == []
    assert (snapshot / "config.json").exists()

    monkeypatch.setenv("HF_HOME", str(tmp_path / "nowhere"))
    assert hf_cache_models() == []
    assert "mlx-community/Tiny-Model-4bit" not in ModelStore(tmp_path / "data", find_embedded=_no_embedded).sources()
