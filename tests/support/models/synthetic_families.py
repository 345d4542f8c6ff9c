"""Tiny random models of the mlx-lm families users run most, for the family matrix tests
(docs/models.md#families).

``make_family_model(out_dir, family)`` writes what ``make_synthetic_model`` writes for llama —
``config.json``, ``model.safetensors``, the byte-level BPE tokenizer with its ChatML template
— for one of ``FAMILIES``: the config is the family's own keys at a tiny size (hidden 64 by
default, 4 layers, 4 heads of 16, 2 kv heads), and the weights are random
(``synthetic._random_weights``) under the parameter names of mlx-lm's own class for that
family (``mlx_lm.utils._get_classes``), i.e. the names an MLX-format repo of that family
holds after mlx-lm's ``sanitize`` (experts stacked as ``switch_mlp``, MLA's ``embed_q``).

Each config keeps what makes its family different from llama: untied heads (mistral, qwen2,
phi3, gpt_oss, deepseek_v3, glm4_moe), attention biases (qwen2, gpt_oss), q/k norms (qwen3,
gemma3_text, glm4_moe), fused projections (phi3), sliding-window layers with a window of 8
tokens so a test's prompt is longer than it (gemma3_text, gpt_oss), the embedding scaled by
sqrt(hidden) (gemma3_text), mixtures of experts (qwen3_moe, gpt_oss, deepseek_v3,
glm4_moe: 4 experts, 2 per token, a dense first layer for deepseek_v3 and glm4_moe), MLA
attention (deepseek_v3), partial rotary embeddings (glm4_moe). The same arguments always give
byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from tests.support.models.synthetic_models import EOS_TOKEN_IDS, _build_tokenizer, _random_weights, write_tokenizer_files

SLIDING_WINDOW = 8
"""Tokens of a sliding-window layer's window in the tiny models (prompts exceed it)."""

_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}
_DEEPSEEK_MOE = {**_MOE, "n_routed_experts": 4, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
                 "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "scoring_func": "sigmoid",
                 "topk_method": "noaux_tc"}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True},
    "mistral": {"architectures": ["MistralForCausalLM"], "tie_word_embeddings": False, "sliding_window": None},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": False},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True},
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "tie_word_embeddings": False, **_MOE,
                  "num_experts": 4, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "gemma3_text": {"architectures": ["Gemma3ForCausalLM"], "query_pre_attn_scalar": 16, "tie_word_embeddings": True,
                    "sliding_window": SLIDING_WINDOW, "sliding_window_pattern": 2,
                    "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "tie_word_embeddings": False,
             "original_max_position_embeddings": 2048},
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "tie_word_embeddings": False, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": SLIDING_WINDOW,
                "layer_types": ["sliding_attention", "full_attention"] * 2},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], **_DEEPSEEK_MOE, "kv_lora_rank": 32,
                    "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                    "moe_layer_freq": 1, "num_key_value_heads": 4, "tie_word_embeddings": False},
    "glm4_moe": {"architectures": ["Glm4MoeForCausalLM"], **_DEEPSEEK_MOE, "use_qk_norm": True,
                 "partial_rotary_factor": 0.5, "attention_bias": False, "tie_word_embeddings": False,
                 "rope_scaling": None},
}
"""Family (config.json's ``model_type``) → the config keys that differ from the common ones."""


def family_config(family: str, *, vocab_size: int, n_layers: int = 4, hidden_size: int = 64,
                  intermediate_size: int = 128, context_length: int = 2048) -> dict[str, Any]:
    """The tiny ``config.json`` of ``family``: 4 heads of ``hidden_size // 4``, 2 kv heads
    (deepseek_v3: 4), float32. Raises ``KeyError`` naming the families for an unknown one;
    ``ValueError`` for a gpt_oss whose ``n_layers`` is odd (its layers alternate sliding and
    full attention in pairs)."""
    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    config: dict[str, Any] = {
        "model_type": family, "hidden_size": hidden_size, "num_hidden_layers": n_layers,
        "intermediate_size": intermediate_size, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": hidden_size // 4, "rms_norm_eps": 1e-5, "vocab_size": vocab_size,
        "max_position_embeddings": context_length, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": list(EOS_TOKEN_IDS),
        **FAMILIES[family],
    }
    if family == "gpt_oss":
        if n_layers % 2:
            raise ValueError(f"gpt_oss needs an even layer count, not {n_layers}")
        config["layer_types"] = ["sliding_attention", "full_attention"] * (n_layers // 2)
    return config


def _gemma_weights(weights: dict[str, mx.array], hidden_size: int) -> dict[str, mx.array]:
    """Gemma scales the embedding by sqrt(hidden) and its norms by (1 + weight): the
    embedding ÷ sqrt(hidden) (else it outweighs every layer and greedy output echoes the last
    input token), norms 0 (the identity) but the final one sqrt(hidden) − 1, so the tied
    head's logits are as large as the other families'."""
    scale = hidden_size**0.5
    out = {}
    for k, v in weights.items():
        if k.endswith("norm.weight"):
            v = mx.full(v.shape, scale - 1.0 if k == "model.norm.weight" else 0.0)
        elif "embed_tokens" in k:
            v = v / scale
        out[k] = v
    return out


def make_family_model(out_dir: Path, family: str, *, n_layers: int = 4, hidden_size: int = 64,
                      intermediate_size: int = 128, seed: int = 0) -> Path:
    """Write a tiny random ``family`` model in the MLX format into ``out_dir`` and return it
    (``family_config``'s config and errors; weights ``synthetic._random_weights`` of mlx-lm's
    class for the family, float32). ``hidden_size`` must be a multiple of 4."""
    from mlx_lm.utils import _get_classes

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer()
    config = family_config(family, vocab_size=tok.get_vocab_size(with_added_tokens=True), n_layers=n_layers,
                           hidden_size=hidden_size, intermediate_size=intermediate_size)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = _random_weights(model, seed, hidden_size)
    if family.startswith("gemma"):
        weights = _gemma_weights(weights, hidden_size)
    if config["tie_word_embeddings"]:  # gemma3_text's class has a head its sanitize drops when absent
        weights.pop("lm_head.weight", None)
    elif "lm_head.weight" not in weights:
        raise ValueError(f"{family}: an untied config but mlx-lm's class has no lm_head")
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer_files(out_dir, tok, config["max_position_embeddings"], "config")
    return out_dir
