"""The model stores people use, read-only (docs/models.md#model-stores): an Ollama models dir
(``exo_p2p.models.stores.ollama``) and LM Studio's (``exo_p2p.models.stores.lmstudio``) as the
node's ``ModelStore`` lists, imports and identifies their models. Every layout is made here;
the GGUF is a tiny one written by MLX's GGUF writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_p2p.models.depot.depot import ModelDepot
from exo_p2p.models.errors import ModelNotFoundError, UnsupportedModelError
from exo_p2p.models.stores.lmstudio import gguf_variants, scan_lmstudio
from exo_p2p.models.names import canonical_model_name, check_relative_path
from exo_p2p.models.stores.ollama import (ADAPTER_MEDIA, MODEL_MEDIA, Layer, default_root, manifest_files, model_layer,
                                         ollama_name, read_layers, scan_ollama)
from exo_p2p.models.stores.store import ModelStore, import_dir_name
from tests.support.models.synthetic_models import make_synthetic_model
from tests.support.models.store_layouts import ollama_model, tiny_gguf, tree_snapshot

DIGEST = "sha256:" + "ab" * 32


def _no_embedded() -> Path:
    raise ModelNotFoundError("no embedded model in this test")


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("parts", "name"), [
    (("registry.ollama.ai", "library", "llama3.2", "3b"), "ollama:llama3.2:3b"),
    (("registry.ollama.ai", "library", "qwen3", "latest"), "ollama:qwen3:latest"),
    (("registry.ollama.ai", "someone", "model", "q4_K_M"), "ollama:someone/model:q4_K_M"),
    (("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"), "ollama:hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"),
    (("REGISTRY.ollama.ai", "Library", "Mistral", "7b"), "ollama:Mistral:7b"),
])
def test_ollama_names_are_what_ollama_shows_with_the_tag(parts, name) -> None:
    assert ollama_name(*parts) == name
    assert canonical_model_name(name) == name


@pytest.mark.parametrize("parts", [
    ("registry.ollama.ai", "lib.rary", "m", "t"),  # a namespace holds no dot
    ("registry.ollama.ai", "library", "..", "t"),
    ("registry.ollama.ai", "library", "a b", "t"),
    ("registry.ollama.ai", "library", ".hidden", "t"),
    ("registry.ollama.ai", "library", "m", "-rf"),
    ("registry.ollama.ai", "library", "m" * 129, "t"),
    ("registry.ollama.ai", "library", "m", "t\n"),
])
def test_ollama_names_refuse_what_ollama_would_not_write(parts) -> None:
    with pytest.raises(ValueError, match="is not an Ollama"):
        ollama_name(*parts)


def test_an_ollama_name_without_tag_means_latest() -> None:
    assert canonical_model_name("ollama:llama3.2") == "ollama:llama3.2:latest"
    assert canonical_model_name("ollama:someone/model") == "ollama:someone/model:latest"
    assert canonical_model_name("ollama:hf.co/org/repo") == "ollama:hf.co/org/repo:latest"
    for unchanged in ("ollama:", "ollama:a:b", "smollm2-135m-instruct", "org/name", "lmstudio:p/m@q4_0", "x:y"):
        assert canonical_model_name(unchanged) == unchanged


_part = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,20}", fullmatch=True)


@given(host=st.one_of(st.just("registry.ollama.ai"), _part.map(lambda p: p + ".io")), namespace=_part,
       model=st.lists(_part, min_size=1, max_size=3).map(".".join), tag=_part)
def test_every_ollama_name_is_a_safe_canonical_path(host, namespace, model, tag) -> None:
    name = ollama_name(host, namespace, model, tag)
    assert name.startswith("ollama:") and name.endswith(f"{model}:{tag}")
    assert canonical_model_name(name) == name  # written with its tag: never changed
    check_relative_path(name, "model name")  # may name a pulled copy's dir
    assert "/" not in import_dir_name(name)  # one dir of the data dir's models/


# --- Ollama manifests -----------------------------------------------------------------------


def _layer(media: str = MODEL_MEDIA, digest: str = DIGEST, size: int = 10) -> dict:
    return {"mediaType": media, "digest": digest, "size": size}


@pytest.mark.parametrize(("data", "reason"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[]", "no list of layers"),
    (json.dumps({"layers": {}}).encode(), "no list of layers"),
    (json.dumps({"layers": [5]}).encode(), "layer 0 has no media type"),
    (json.dumps({"layers": [{"digest": DIGEST, "size": 1}]}).encode(), "layer 0 has no media type"),
    (json.dumps({"layers": [_layer(digest="sha256:abc")]}).encode(), "no sha256 digest"),
    (json.dumps({"layers": [_layer(digest="md5:" + "0" * 64)]}).encode(), "no sha256 digest"),
    (json.dumps({"layers": [_layer(size=-1)]}).encode(), "no size"),
    (json.dumps({"layers": [{**_layer(), "size": True}]}).encode(), "no size"),
    (json.dumps({"layers": [{**_layer(), "size": "10"}]}).encode(), "no size"),
])
def test_a_bad_manifest_is_a_clear_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        read_layers(data)


@given(st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["layers", "mediaType", "digest", "size"]), inner, max_size=4),
    max_leaves=20).map(lambda v: json.dumps(v).encode()))
def test_any_manifest_bytes_give_layers_or_a_value_error(data: bytes) -> None:
    try:
        layers = read_layers(data)
    except ValueError:
        return
    assert all(isinstance(layer, Layer) for layer in layers)


def test_the_model_layer_is_the_one_gguf_and_no_adapter() -> None:
    model, template = Layer(MODEL_MEDIA, DIGEST, 10), Layer("application/vnd.ollama.image.template", DIGEST, 3)
    assert model_layer((template, model)) == model
    with pytest.raises(ValueError, match="no GGUF model layer.*image.template"):
        model_layer((template,))
    with pytest.raises(ValueError, match="2 model layers"):
        model_layer((model, model))
    with pytest.raises(ValueError, match="LoRA adapter"):
        model_layer((model, Layer(ADAPTER_MEDIA, DIGEST, 3)))


def test_default_ollama_dir_is_ollamas() -> None:
    assert default_root({"OLLAMA_MODELS": "/data/ollama"}, Path("/home/u")) == Path("/data/ollama")
    assert default_root({}, Path("/home/u")) == Path("/home/u/.ollama/models")


def test_scan_lists_servable_models_and_says_why_not_for_the_rest(tmp_path: Path, gguf: Path) -> None:
    root = tmp_path / "ollama"
    ollama_model(root, gguf, "tiny", "latest")
    ollama_model(root, gguf, "tiny", "f16")  # a second tag of the same blob
    ollama_model(root, gguf, "theirs", "v1", namespace="someone")
    ollama_model(root, None, "no-model", "latest")
    ollama_model(root, gguf, "adapted", "latest", extra_layers=((ADAPTER_MEDIA, b"lora"),))
    gone = ollama_model(root, tiny_gguf(tmp_path / "other.gguf", seed=1), "gone", "latest")
    blob = json.loads(gone.read_text())["layers"][0]["digest"].replace(":", "-")
    (root / "blobs" / blob).unlink()
    cut = ollama_model(root, tiny_gguf(tmp_path / "cut.gguf", seed=2), "cut", "latest")
    blob = root / "blobs" / json.loads(cut.read_text())["layers"][0]["digest"].replace(":", "-")
    blob.write_bytes(blob.read_bytes()[:1000])
    bad = root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{")
    (root / "manifests" / "registry.ollama.ai" / "library" / "bad name").mkdir()
    (root / "manifests" / "registry.ollama.ai" / "library" / "bad name" / "latest").write_text("{}")
    (root / "manifests" / "registry.ollama.ai" / "library" / ".DS_Store").write_text("")
    (root / "manifests" / "registry.ollama.ai" / "library" / "tiny" / ".hidden").write_text("")

    found, bad_ones = scan_ollama(root)
    assert {s.model_id: s.path.name for s in found} == {
        "ollama:tiny:latest": found[0].path.name, "ollama:tiny:f16": found[0].path.name,
        "ollama:someone/theirs:v1": found[0].path.name}
    assert all(s.kind == "gguf" and s.origin == "ollama" and s.path.parent == root / "blobs" for s in found)
    reasons = {p.model_id: p.reason for p in bad_ones}
    assert set(reasons) == {"ollama:no-model:latest", "ollama:adapted:latest", "ollama:gone:latest",
                            "ollama:cut:latest", "ollama:broken:latest", "ollama:registry.ollama.ai/library/bad name/latest"}
    assert "no GGUF model layer" in reasons["ollama:no-model:latest"]
    assert "LoRA adapter" in reasons["ollama:adapted:latest"]
    assert "is missing" in reasons["ollama:gone:latest"]
    assert "holds 1000 bytes" in reasons["ollama:cut:latest"]
    assert "not JSON" in reasons["ollama:broken:latest"]
    assert "is not an Ollama model" in reasons["ollama:registry.ollama.ai/library/bad name/latest"]
    assert scan_ollama(tmp_path / "nowhere") == ([], [])


def test_scan_bounds_manifests_and_finds_old_blob_names(tmp_path: Path, gguf: Path) -> None:
    root = tmp_path / "ollama"
    manifest = ollama_model(root, gguf, "old", "latest")
    digest = json.loads(manifest.read_text())["layers"][0]["digest"]
    (root / "blobs" / digest.replace(":", "-")).rename(root / "blobs" / digest)  # before Ollama renamed blobs
    big = root / "manifests" / "registry.ollama.ai" / "library" / "big" / "latest"
    big.parent.mkdir(parents=True)
    big.write_text(" " * (1 << 20) + "{}")
    found, bad = scan_ollama(root)
    assert [(s.model_id, s.path.name) for s in found] == [("ollama:old:latest", digest)]
    assert [(p.model_id, "more than 1048576 bytes" in p.reason) for p in bad] == [("ollama:big:latest", True)]
    for i in range(5):
        ollama_model(root, gguf, f"many{i}", "latest")
    assert len(list(manifest_files(root, limit=3))) == 3


# --- LM Studio ------------------------------------------------------------------------------


def test_gguf_variants_are_the_quantization_else_the_stem() -> None:
    assert gguf_variants(["Llama-3.2-1B-Instruct-Q4_K_M", "Llama-3.2-1B-Instruct-Q8_0", "model.IQ4_XS", "x-bf16"]) == {
        "Llama-3.2-1B-Instruct-Q4_K_M": "q4_k_m", "Llama-3.2-1B-Instruct-Q8_0": "q8_0", "model.IQ4_XS": "iq4_xs",
        "x-bf16": "bf16"}
    assert gguf_variants(["a-Q4_0", "b-q4_0", "plain"]) == {"a-Q4_0": "a-q4_0", "b-q4_0": "b-q4_0", "plain": "plain"}


def test_lmstudio_dirs_are_listed_by_publisher_and_model(tmp_path: Path, gguf: Path) -> None:
    root = tmp_path / "lmstudio"
    make_synthetic_model(root / "mlx-community" / "tiny-mlx", n_layers=2, hidden_size=32, intermediate_size=64)
    one = root / "lmstudio-community" / "tiny-GGUF"
    one.mkdir(parents=True)
    (one / "tiny-Q8_0.gguf").write_bytes(gguf.read_bytes())
    (one / "mmproj-tiny-f16.gguf").write_bytes(b"GGUF")  # a projector: not a model
    several = root / "someone" / "tiny-quants"
    several.mkdir(parents=True)
    for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"):
        (several / name).write_bytes(gguf.read_bytes())
    split = root / "someone" / "big-GGUF"
    split.mkdir()
    for i in (1, 2):
        (split / f"big-Q4_K_M-0000{i}-of-00002.gguf").write_bytes(b"GGUF")
    half = root / "someone" / "half-mlx"
    half.mkdir()
    (half / "config.json").write_text("{}")
    (root / "someone" / "notes").mkdir()  # nothing of a model: not listed
    (root / "someone" / "bad name").mkdir()
    (root / "someone" / "bad name" / "m.gguf").write_bytes(b"GGUF")
    (root / ".internal" / "x").mkdir(parents=True)

    found, bad = scan_lmstudio(root)
    assert {s.model_id: (s.kind, s.path.relative_to(root).as_posix()) for s in found} == {
        "lmstudio:mlx-community/tiny-mlx": ("mlx_dir", "mlx-community/tiny-mlx"),
        "lmstudio:lmstudio-community/tiny-GGUF": ("gguf", "lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf"),
        "lmstudio:someone/tiny-quants@q4_k_m": ("gguf", "someone/tiny-quants/tiny-Q4_K_M.gguf"),
        "lmstudio:someone/tiny-quants@q8_0": ("gguf", "someone/tiny-quants/tiny-Q8_0.gguf"),
    }
    assert all(s.origin == "lmstudio" for s in found)
    reasons = {p.model_id: p.reason for p in bad}
    assert set(reasons) == {"lmstudio:someone/big-GGUF", "lmstudio:someone/half-mlx", "lmstudio:someone/bad name"}
    assert "split GGUF (2 files)" in reasons["lmstudio:someone/big-GGUF"]
    assert "incomplete MLX model: no weights" in reasons["lmstudio:someone/half-mlx"]
    assert "cannot be a model name" in reasons["lmstudio:someone/bad name"]
    assert scan_lmstudio(tmp_path / "nowhere") == ([], [])


# --- the node's store -----------------------------------------------------------------------


def test_store_lists_imports_and_identifies_store_models_without_writing_there(tmp_path: Path, gguf: Path) -> None:
    ollama, lmstudio, plain = tmp_path / "ollama", tmp_path / "lmstudio", tmp_path / "plain"
    ollama_model(ollama, gguf, "tiny", "latest")
    ollama_model(ollama, gguf, "repo", "Q8_0", namespace="org", host="hf.co")
    ollama_model(ollama, tiny_gguf(tmp_path / "bert.gguf", architecture="bert"), "bert", "latest")
    ollama_model(ollama, tiny_gguf(tmp_path / "tok.gguf", tokenizer_model="no-such-tokenizer"), "tok", "latest")
    make_synthetic_model(lmstudio / "pub" / "tiny-mlx", n_layers=2, hidden_size=32, intermediate_size=64)
    (lmstudio / "pub" / "tiny-GGUF").mkdir(parents=True)
    (lmstudio / "pub" / "tiny-GGUF" / "tiny-Q8_0.gguf").write_bytes(gguf.read_bytes())
    plain.mkdir()
    (plain / "tiny.gguf").write_bytes(gguf.read_bytes())
    before = {root: tree_snapshot(root) for root in (ollama, lmstudio)}

    store = ModelStore(tmp_path / "data", [plain], find_embedded=_no_embedded, hf_cache=False,
                       ollama_dir=ollama, lmstudio_dir=lmstudio)
    cards = {c.model_id: c for c in store.list_cards()}
    assert sorted(cards) == ["lmstudio:pub/tiny-GGUF", "lmstudio:pub/tiny-mlx", "ollama:hf.co/org/repo:Q8_0",
                             "ollama:tiny:latest", "tiny"]  # an unknown tokenizer kind is refused at listing
    assert cards["ollama:tiny:latest"].n_layers == 2 and cards["ollama:tiny:latest"] == msgspec_replace(cards["tiny"], "ollama:tiny:latest")
    assert store.origins()["ollama:tiny:latest"] == "ollama" and store.origins()["tiny"] == "models_dir"
    assert [(p.model_id, ("bert" if p.model_id.startswith("ollama:bert") else "no-such-tokenizer") in p.reason)
            for p in store.unsupported()] == [("ollama:bert:latest", True), ("ollama:tok:latest", True)]

    imported = store.resolve("ollama:tiny:latest")
    assert imported == tmp_path / "data" / "models" / "ollama:tiny:latest"
    assert store.resolve("lmstudio:pub/tiny-GGUF") == tmp_path / "data" / "models" / "lmstudio:pub--tiny-GGUF"
    assert store.resolve("lmstudio:pub/tiny-mlx") == lmstudio / "pub" / "tiny-mlx"  # served in place
    assert store.resolve("ollama:hf.co/org/repo:Q8_0") == tmp_path / "data" / "models" / "ollama:hf.co--org--repo:Q8_0"
    with pytest.raises((UnsupportedModelError, ModelNotFoundError)):
        store.resolve("ollama:tok:latest")
    assert [p.model_id for p in store.unsupported()] == ["ollama:bert:latest", "ollama:tok:latest"]
    assert "ollama:tok:latest" not in {c.model_id for c in store.list_cards()}  # known not to import
    assert {root: tree_snapshot(root) for root in (ollama, lmstudio)} == before

    # the same GGUF is the same model wherever it was found: one manifest digest
    store.resolve("tiny")
    depot = ModelDepot(store, tmp_path / "data")
    depot.refresh()
    digests = {name: depot.local_digest(name)
               for name in ("tiny", "ollama:tiny:latest", "ollama:hf.co/org/repo:Q8_0", "lmstudio:pub/tiny-GGUF")}
    assert len(set(digests.values())) == 1 and None not in digests.values(), digests
    held = {h.name for h in depot.held()}
    assert {"tiny", "ollama:tiny:latest", "lmstudio:pub/tiny-GGUF", "lmstudio:pub/tiny-mlx"} <= held
    assert depot.remove("ollama:tiny:latest") == [] and depot.remove("lmstudio:pub/tiny-mlx") == []
    assert {root: tree_snapshot(root) for root in (ollama, lmstudio)} == before


def test_stores_turned_off_or_absent_list_nothing(tmp_path: Path, gguf: Path) -> None:
    ollama_model(tmp_path / "ollama", gguf)
    off = ModelStore(tmp_path / "data", find_embedded=_no_embedded, hf_cache=False)
    assert off.sources() == {} and off.unsupported() == []
    absent = ModelStore(tmp_path / "data", find_embedded=_no_embedded, hf_cache=False,
                        ollama_dir=tmp_path / "no-ollama", lmstudio_dir=tmp_path / "no-lmstudio")
    assert absent.sources() == {} and absent.unsupported() == []


def msgspec_replace(card, model_id):  # type: ignore[no-untyped-def]
    import msgspec

    return msgspec.structs.replace(card, model_id=model_id)


def test_store_roots_follow_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from exo_p2p.cli.cluster.node_config import build_node_config
    from exo_p2p.config import NodeConfig
    from exo_p2p.models.stores.store import store_roots

    monkeypatch.setenv("HOME", str(tmp_path))  # Path.home()
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "o"))
    defaults = NodeConfig(data_dir=tmp_path)
    assert store_roots(defaults) == {"ollama_dir": tmp_path / "o", "lmstudio_dir": tmp_path / ".lmstudio" / "models"}
    (tmp_path / ".cache" / "lm-studio" / "models").mkdir(parents=True)  # only the older LM Studio's dir
    assert store_roots(defaults)["lmstudio_dir"] == tmp_path / ".cache" / "lm-studio" / "models"
    monkeypatch.delenv("OLLAMA_MODELS")
    assert store_roots(defaults)["ollama_dir"] == tmp_path / ".ollama" / "models"
    given = build_node_config(data_dir=tmp_path / "data", ollama_models=Path("~/mine"), lmstudio=False)
    assert store_roots(given) == {"ollama_dir": tmp_path / "mine", "lmstudio_dir": None}
    off = build_node_config(data_dir=tmp_path / "data", ollama=False, lmstudio_models=Path("/x/lm"))
    assert store_roots(off) == {"ollama_dir": None, "lmstudio_dir": Path("/x/lm")}
