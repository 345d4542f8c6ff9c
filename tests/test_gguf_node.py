"""A real node serves a tiny non-llama GGUF (qwen3, Q8_0 and Q6_K tensors, byte-level BPE
with a ChatML template) from its ``--models-dir``: listed with its card, imported at
placement, answers a chat request; a GGUF it cannot import is listed as unusable with the
reason, and the rest of the node works (docs/models.md#gguf)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.cluster import NodeProcess, nodes_cleanup
from tests.support.models.gguf_files import family_metadata, write_family_gguf

pytestmark = pytest.mark.integration

CONFIG = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6,
          "vocab_size": 264, "max_position_embeddings": 512, "rope_theta": 10000.0,
          "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("gguf-models")
    write_family_gguf(d / "Tiny-Qwen3-Q8_0.gguf", "qwen3", CONFIG, family_metadata("qwen3", CONFIG),
                      lambda name: "Q6_K" if "ffn_down" in name else "Q8_0", seed=3)
    bad = family_metadata("qwen3", CONFIG)
    bad["tokenizer.ggml.model"] = "rwkv"
    write_family_gguf(d / "odd-tokenizer.gguf", "qwen3", CONFIG, bad, lambda name: "F16", seed=4)
    return d


def test_a_node_serves_an_imported_qwen3_gguf(tmp_path, models_dir) -> None:  # type: ignore[no-untyped-def]
    node = NodeProcess(tmp_path / "a", extra_args=["--models-dir", str(models_dir)])
    with nodes_cleanup([node]):
        node.start()
        listed = {m["model"]: m for m in node.get("/models").json()}
        assert listed["tiny-qwen3-q8_0"]["n_layers"] == 2
        assert "odd-tokenizer" not in listed
        unsupported = {p["model"]: p for p in node.get("/models/unsupported").json()}
        assert "tokenizer model 'rwkv'" in unsupported["odd-tokenizer"]["reason"]
        node.place_and_wait("tiny-qwen3-q8_0", timeout=120)
        r = httpx.post(node.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-qwen3-q8_0", "messages": [{"role": "user", "content": "the"}],
            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["usage"]["prompt_tokens"] > 3  # the ChatML turn, tokenized
