"""A model source's JSON is untrusted (docs/security.md#model-sources): a ``config.json`` or a
safetensors header nested too deeply is an ``UnsupportedModelError`` naming the file (a 400
through the API, never a 404 or a ``RecursionError``), read from a hub or a local directory."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from exo_p2p.models.card.derive import card_from_model_dir
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub_limits import MAX_CONFIG_BYTES
from exo_p2p.models.hub.manifest import hub_error_status, resolve_hub_model
from exo_p2p.models.model_json import MAX_MODEL_JSON_DEPTH, model_json
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.models.hub_server import HubServer
from tests.support.models.local_repo import LocalRepo

DEEP = 100_000


def _deep_config(model_dir: Path, depth: int) -> None:
    """Put a key nesting ``depth`` lists deep into ``model_dir``'s config.json."""
    config = json.loads((model_dir / "config.json").read_text())
    text = json.dumps(config)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    (model_dir / "config.json").write_text(text)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_synthetic_model(tmp_path_factory.mktemp("untrusted") / "tiny", n_layers=2, hidden_size=64,
                                intermediate_size=128, seed=7)


@pytest.mark.unit
@pytest.mark.parametrize("depth", [DEEP, MAX_MODEL_JSON_DEPTH + 1])
def test_a_deep_config_is_unsupported_naming_config_json(base: Path, tmp_path: Path, depth: int) -> None:
    model = shutil.copytree(base, tmp_path / "m")
    _deep_config(model, depth)
    with pytest.raises(UnsupportedModelError, match="config.json nests") as hub:
        resolve_hub_model(LocalRepo(model), "org/tiny")
    assert hub_error_status(hub.value) == 400
    with pytest.raises(UnsupportedModelError, match="config.json nests"):
        card_from_model_dir(model, "tiny")


@pytest.mark.unit
def test_a_local_config_larger_than_the_bound_is_refused_unread(base: Path, tmp_path: Path) -> None:
    """A model directory's ``config.json`` is read with at most ``MAX_CONFIG_BYTES`` + 1 bytes
    (``model_json_file``), as a hub's is: a 4 MiB-plus file is refused naming it."""
    model = shutil.copytree(base, tmp_path / "m")
    config = (model / "config.json").read_text()
    (model / "config.json").write_text(" " * MAX_CONFIG_BYTES + config)
    with pytest.raises(UnsupportedModelError, match="config.json is larger than"):
        card_from_model_dir(model, "tiny")
    (model / "config.json").write_bytes(b"\xff" + config.encode())
    with pytest.raises(UnsupportedModelError, match="config.json is not UTF-8"):
        card_from_model_dir(model, "tiny")


@pytest.mark.unit
def test_a_config_at_the_bound_is_read(base: Path, tmp_path: Path) -> None:
    model = shutil.copytree(base, tmp_path / "m")
    _deep_config(model, MAX_MODEL_JSON_DEPTH - 1)  # under the config's own object
    assert resolve_hub_model(LocalRepo(model), "org/tiny")[1].n_layers == 2


@pytest.mark.unit
def test_a_deep_safetensors_header_is_unsupported(base: Path, tmp_path: Path) -> None:
    model = shutil.copytree(base, tmp_path / "m")
    header = b'{"__metadata__": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(UnsupportedModelError, match="safetensors header nests"):
        resolve_hub_model(LocalRepo(model), "org/tiny")
    with pytest.raises(UnsupportedModelError, match="not JSON"):
        model_json(b"{", "x")


@pytest.mark.integration
def test_a_hub_repo_with_a_deep_config_is_a_400_naming_it(base: Path, tmp_path: Path, nodes) -> None:
    """A node asked for a hub repo whose config.json nests 100,000 deep answers 400 naming
    config.json (it answered 404), and keeps serving."""
    from tests.support.cluster import NodeProcess

    model = shutil.copytree(base, tmp_path / "deep")
    _deep_config(model, DEEP)
    with HubServer() as hub:
        hub.add_dir("org/deep", model)
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf")}
        node = NodeProcess(tmp_path / "n", env=env).start()
        nodes.append(node)
        for path, kw in [("/instances/previews", {"params": {"model": "org/deep"}}),
                         ("/instances", {"json": {"model": "org/deep", "min_nodes": 1}})]:
            r = node.get(path, **kw) if "params" in kw else node.post(path, timeout=60, **kw)
            assert r.status_code == 400, r.text
            assert "config.json nests" in r.json()["error"]["message"], r.text
        assert node.get("/health").status_code == 200
