"""Each GGUF architecture the importer reads, round-tripped: a tiny GGUF written with the
``gguf`` package's writer (tests/support/models/gguf_files.py), imported, loaded with ``mlx_lm.load`` and
expanded to float32 as a CPU node does, gives the logits of mlx-lm's own class holding the
weights the GGUF stands for.

Tolerances, relative to the largest reference logit: 1e-5 where every tensor is kept exact
(MLX affine quantization, or a float type copied); 2e-3 where Q2_K/Q3_K/Q6_K tensors are
dequantized to float16 (their weights move by at most 2**-11 relative). Measured: see
the assertion messages (``-s`` prints them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np
import pytest

from exo_p2p.models.card.derive import card_from_gguf, card_from_model_dir
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.importer import import_gguf
from tests.support.models.gguf_files import family_metadata, llama3_rope_freqs, reference_model, write_family_gguf


TOKENS = [[0, 1, 40, 77, 263, 150, 2, 9, 200, 33, 120, 7]]
EXACT, DEQUANTIZED = 1e-5, 2e-3
HIDDEN, FFN, VOCAB = 256, 512, 264


def _base(model_type: str, **extra) -> dict:
    return {"model_type": model_type, "hidden_size": HIDDEN, "num_hidden_layers": 2,
            "intermediate_size": FFN, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "vocab_size": VOCAB, "max_position_embeddings": 512,
            "rope_theta": 10000.0, "tie_word_embeddings": False, **extra}


def q4_k_m(name: str) -> str:
    """llama.cpp's Q4_K_M mix: Q6_K for the output and half the attn_v/ffn_down, Q4_K else."""
    if name.startswith("output.") or name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight"):
        return "Q6_K"
    return "Q4_K"


def _by_part(mapping: dict[str, str], default: str) -> Callable[[str], str]:
    return lambda name: next((t for part, t in mapping.items() if part in name), default)


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}

CASES = {
    # family: (GGUF arch, reference config, types, tolerance)
    "llama-q4_k_m": ("llama", _base("llama", head_dim=64), q4_k_m, DEQUANTIZED),
    "llama-q8_0-llama3-rope": ("llama", _base("llama", head_dim=64, rope_scaling=LLAMA3_SCALING,
                                              max_position_embeddings=131072), lambda n: "Q8_0", EXACT),
    "mistral-q4_0": ("llama", _base("llama", head_dim=64, _name="Mistral-Tiny-v0.3"), lambda n: "Q4_0", EXACT),
    "qwen2-q5_0-q5_1": ("qwen2", _base("qwen2", tie_word_embeddings=True),
                        _by_part({"attn": "Q5_0", "token_embd": "Q8_0"}, "Q5_1"), EXACT),
    "qwen3-q5_k-bf16": ("qwen3", _base("qwen3", head_dim=64, tie_word_embeddings=True),
                        _by_part({"ffn": "Q5_K", "token_embd": "BF16"}, "Q4_1"), EXACT),
    "qwen3-q6_k": ("qwen3", _base("qwen3", head_dim=64), lambda n: "Q6_K", DEQUANTIZED),
    "gemma3-q4_k-q3_k": ("gemma3", _base("gemma3_text", head_dim=64, num_hidden_layers=6, sliding_window=4,
                                          sliding_window_pattern=6, query_pre_attn_scalar=64,
                                          rope_local_base_freq=10000.0, rope_theta=1_000_000.0),
                         _by_part({"attn_v": "Q3_K", "ffn_down": "Q2_K"}, "Q4_K"), DEQUANTIZED),
    "gemma3-f16": ("gemma3", _base("gemma3_text", head_dim=64, num_hidden_layers=6, sliding_window=4,
                                    query_pre_attn_scalar=64, rope_theta=1_000_000.0, tie_word_embeddings=True), lambda n: "F16", EXACT),
    "phi3-longrope-q5_1": ("phi3", _base("phi3", num_key_value_heads=4, max_position_embeddings=131072,
                                         original_max_position_embeddings=4096, rope_scaling={
                                             "type": "longrope", "long_factor": [1.0 + i / 8 for i in range(32)],
                                             "short_factor": [1.0] * 32}), lambda n: "Q5_1", EXACT),
    "phi3-q8_0-partial-rope": ("phi3", _base("phi3", num_key_value_heads=4, partial_rotary_factor=0.5),
                               lambda n: "Q8_0", EXACT),
}


def _logits(model) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array(model(mx.array(TOKENS)).astype(mx.float32))


def _import_and_compare(tmp_path: Path, case: str) -> tuple[float, Path]:
    from mlx_lm import load

    from worker.engine.loading.dequantize import expand_to_float32

    family, config, types, _ = CASES[case]
    metadata = family_metadata(family, config)
    extra = {}
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        extra["rope_freqs.weight"] = llama3_rope_freqs(scaling, config["rope_theta"], 64)
    if scaling.get("type") == "longrope":  # llama.cpp's Phi-3 128k tensors and key
        extra["rope_factors_long.weight"] = np.array(scaling["long_factor"], np.float32)
        extra["rope_factors_short.weight"] = np.array(scaling["short_factor"], np.float32)
        metadata["phi3.rope.scaling.original_context_length"] = config["original_max_position_embeddings"]
    written = write_family_gguf(tmp_path / f"{case}.gguf", family, {k: v for k, v in config.items() if k != "_name"},
                                metadata, types, seed=len(case), extra_tensors=extra)
    out = import_gguf(written.path, tmp_path / case)
    assert card_from_gguf(written.path, case) == card_from_model_dir(out, case)
    model, _ = load(str(out))
    expand_to_float32(model)
    got = _logits(model)
    expected = _logits(reference_model(written.config, written.weights))
    return float(np.abs(got - expected).max() / np.abs(expected).max()), out


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_family_gives_the_reference_logits(tmp_path: Path, case: str) -> None:
    error, out = _import_and_compare(tmp_path, case)
    tolerance = CASES[case][3]
    print(f"\n{case}: max |logit error| / max |logit| = {error:.2e} (tolerance {tolerance:g})")
    assert error < tolerance, f"{case}: relative logit error {error:.2e} >= {tolerance:g}"


def test_config_of_each_family(tmp_path: Path) -> None:
    """The config keys that differ by family (what the logits test relies on)."""
    _, out = _import_and_compare(tmp_path, "gemma3-f16")
    gemma = json.loads((out / "config.json").read_text())
    assert (gemma["model_type"], gemma["sliding_window"], gemma["sliding_window_pattern"]) == ("gemma3_text", 4, 6)
    assert gemma["query_pre_attn_scalar"] == 64 and gemma["tie_word_embeddings"] is True
    _, out = _import_and_compare(tmp_path, "llama-q8_0-llama3-rope")
    llama = json.loads((out / "config.json").read_text())
    assert llama["rope_traditional"] is True
    scaling = llama["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == pytest.approx(8.0)
    _, out = _import_and_compare(tmp_path, "mistral-q4_0")
    assert json.loads((out / "config.json").read_text())["model_type"] == "mistral"


def test_q4_k_m_quantization_entry(tmp_path: Path) -> None:
    """Q4_K layers stay 4-bit group 32; the Q6_K ones are plain (float16) layers."""
    _, out = _import_and_compare(tmp_path, "llama-q4_k_m")
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["group_size"], q["bits"]) == (32, 4)
    assert q["lm_head"] is False and q["model.layers.0.self_attn.v_proj"] is False
    assert "model.layers.1.self_attn.v_proj" not in q


def test_unsupported_architecture_and_tokenizer_are_named(tmp_path: Path) -> None:
    config = _base("qwen3", head_dim=64)
    metadata = family_metadata("qwen3", config)
    path = write_family_gguf(tmp_path / "a.gguf", "qwen3", config, metadata, lambda n: "F16").path
    raw = path.read_bytes()
    bad_arch = tmp_path / "b.gguf"
    bad_arch.write_bytes(raw.replace(b"qwen3", b"qwen9"))
    with pytest.raises(UnsupportedModelError, match="architecture 'qwen9'"):
        card_from_gguf(bad_arch, "b")
    with pytest.raises(UnsupportedModelError, match="architecture 'qwen9'"):
        import_gguf(bad_arch, tmp_path / "b")
    assert not (tmp_path / "b").exists()
    metadata["tokenizer.ggml.model"] = "rwkv"
    path = write_family_gguf(tmp_path / "c.gguf", "qwen3", config, metadata, lambda n: "F16").path
    with pytest.raises(UnsupportedModelError, match="tokenizer model 'rwkv'"):
        import_gguf(path, tmp_path / "c")


def test_store_lists_an_unsupported_gguf_as_unusable_with_the_reason(tmp_path: Path) -> None:
    from exo_p2p.models.errors import ModelNotFoundError
    from exo_p2p.models.stores.store import ModelStore

    def no_embedded() -> Path:
        raise ModelNotFoundError("no embedded model in this test")

    config = _base("qwen3", head_dim=64)
    models = tmp_path / "models"
    models.mkdir()
    write_family_gguf(models / "good.gguf", "qwen3", config, family_metadata("qwen3", config), lambda n: "Q8_0")
    metadata = family_metadata("qwen3", config)
    metadata["tokenizer.ggml.pre"] = "falcon"
    write_family_gguf(models / "odd.gguf", "qwen3", config, metadata, lambda n: "Q8_0")
    store = ModelStore(tmp_path / "data", [models], find_embedded=no_embedded, hf_cache=False)
    assert [c.model_id for c in store.list_cards()] == ["good"]
    assert {p.model_id: p.reason for p in store.unsupported()} == {
        "odd": "GGUF pre-tokenizer 'falcon' is not supported (supported: smollm, gpt-2, default, llama-bpe, qwen2)"}


def test_unsupported_tensor_type_is_named_at_listing(tmp_path: Path) -> None:
    """An IQ4_NL tensor (a lookup-table type, no affine form): the card, computed at listing
    from the header alone, already names it."""
    import gguf

    config = _base("qwen3", head_dim=64)
    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    from tests.support.models.gguf_files import _add

    for key, value in family_metadata("qwen3", config).items():
        _add(writer, key, value)
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ4_NL]
    writer.add_tensor("token_embd.weight", np.zeros((VOCAB, HIDDEN // block * nbytes), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="'token_embd.weight' has tensor type IQ4_NL"):
        card_from_gguf(path, "iq")
