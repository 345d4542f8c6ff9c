"""The GGUF architectures the importer reads, mapped onto mlx-lm's model classes (pure rules).

Per ``general.architecture``: the mlx-lm ``model_type``, the Hugging Face name of each
``blk.N.<part>`` tensor, and the ``config.json`` keys beyond the common sizes. The rules come
from llama.cpp's converter (``convert_hf_to_gguf.py``), which writes these GGUFs from the
Hugging Face checkpoints mlx-lm loads:

- ``llama`` (Llama 2/3.x, Mistral 7B and the others whose GGUFs say ``llama``): the
  converter permutes q/k rows into the interleaved rotary layout, so the config asks for
  ``rope_traditional: true`` (mlx-lm then rotates adjacent pairs; attention scores are the
  same). Llama 3.1's ``rope_freqs`` becomes a ``llama3`` ``rope_scaling``
  (:mod:`exo_p2p.models.gguf.rope`). ``model_type`` is ``mistral`` when the GGUF's name says so
  (mlx-lm runs it as llama).
- ``qwen2``: q/k/v biases, ``head_dim`` = hidden / heads (mlx-lm's rule).
- ``qwen3``: per-head ``q_norm``/``k_norm``, ``head_dim`` from ``key_length``.
- ``gemma3`` -> mlx-lm's ``gemma3_text``: four norms per block, every norm stored as 1 + w
  (the converter adds 1; mlx-lm adds it at run time, so 1 is subtracted at import);
  sliding-window layers every layer but each 6th (llama.cpp's fixed pattern, unless the GGUF
  states ``attention.sliding_window_pattern``), local rope base 10000, attention scaled by
  ``1/sqrt(key_length)`` (``1/sqrt(hidden/heads)`` for the 62-layer 27B, as llama.cpp).
- ``phi3``: fused ``attn_qkv`` (-> ``qkv_proj``) and ``ffn_up`` (-> ``gate_up_proj``, gate
  first), ``partial_rotary_factor`` = ``rope.dimension_count`` / head dim, LongRoPE's
  ``rope_factors_long``/``rope_factors_short`` -> ``rope_scaling`` type ``longrope``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf.rope import as_float, llama3_scaling, rope_scaling_from_metadata

ReadTensor = Callable[[str], np.ndarray]
"""Reads a small float tensor of the GGUF by name (rope factors), as float32."""

_ATTENTION = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_LLAMA_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                **_ATTENTION, **_MLP}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


@dataclass(frozen=True)
class ArchSpec:
    """How one GGUF architecture maps onto mlx-lm: ``model_type``, block tensor names
    (``blk.N.<part>`` -> ``model.layers.N.<name>``), global tensors the config consumes
    (not copied), whether norms are stored as 1 + w, and the arch-specific config keys."""

    model_type: str
    block_names: Mapping[str, str]
    extra_config: Callable[[Mapping[str, Any], dict, frozenset[str], ReadTensor], dict]
    consumed: frozenset[str] = field(default_factory=frozenset)
    norms_plus_one: bool = False


def _meta(metadata: Mapping[str, Any], arch: str, key: str, default: Any = None) -> Any:
    value = metadata.get(f"{arch}.{key}", default)
    if value is None:
        raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
    return value


def _llama(m: Mapping[str, Any], base: dict, names: frozenset[str], read: ReadTensor) -> dict:
    arch = "llama"
    name = f"{m.get('general.basename', '')} {m.get('general.name', '')}".lower()
    scaling = rope_scaling_from_metadata(m, arch)
    if "rope_freqs.weight" in names:
        scaling = llama3_scaling(read("rope_freqs.weight"), base["rope_theta"],
                                 int(m.get(f"{arch}.rope.dimension_count", base["head_dim"])))
    return {"model_type": "mistral" if "mistral" in name else "llama",
            "architectures": ["MistralForCausalLM" if "mistral" in name else "LlamaForCausalLM"],
            "head_dim": base["head_dim"], "rope_traditional": True, "rope_scaling": scaling,
            "attention_bias": "blk.0.attn_q.bias" in names,
            "mlp_bias": "blk.0.ffn_gate.bias" in names}


def _hidden_over_heads(base: dict, arch: str) -> None:
    if base["head_dim"] * base["num_attention_heads"] != base["hidden_size"]:
        raise UnsupportedModelError(
            f"GGUF {arch} with head size {base['head_dim']} × {base['num_attention_heads']} heads "
            f"!= hidden size {base['hidden_size']} is not supported (mlx-lm's {arch} needs it)")


def _qwen2(m: Mapping[str, Any], base: dict, names: frozenset[str], read: ReadTensor) -> dict:
    _hidden_over_heads(base, "qwen2")
    return {"architectures": ["Qwen2ForCausalLM"],
            "rope_scaling": rope_scaling_from_metadata(m, "qwen2")}


def _qwen3(m: Mapping[str, Any], base: dict, names: frozenset[str], read: ReadTensor) -> dict:
    return {"architectures": ["Qwen3ForCausalLM"], "head_dim": base["head_dim"],
            "rope_scaling": rope_scaling_from_metadata(m, "qwen3")}


def _gemma3(m: Mapping[str, Any], base: dict, names: frozenset[str], read: ReadTensor) -> dict:
    layers, heads = base["num_hidden_layers"], base["num_attention_heads"]
    scalar = base["hidden_size"] // heads if layers == 62 else base["head_dim"]
    return {"architectures": ["Gemma3ForCausalLM"], "head_dim": base["head_dim"],
            "query_pre_attn_scalar": scalar,
            "sliding_window": int(_meta(m, "gemma3", "attention.sliding_window", 4096)),
            "sliding_window_pattern": int(m.get("gemma3.attention.sliding_window_pattern", 6)),
            "rope_local_base_freq": 10000.0,
            "rope_scaling": rope_scaling_from_metadata(m, "gemma3")}


def _phi3(m: Mapping[str, Any], base: dict, names: frozenset[str], read: ReadTensor) -> dict:
    _hidden_over_heads(base, "phi3")
    rotary = int(m.get("phi3.rope.dimension_count", base["head_dim"]))
    config: dict[str, Any] = {"architectures": ["Phi3ForCausalLM"],
                              "partial_rotary_factor": rotary / base["head_dim"]}
    if "rope_factors_long.weight" in names:
        config["rope_scaling"] = {
            "type": "longrope",
            "long_factor": [as_float(v) for v in read("rope_factors_long.weight")],
            "short_factor": [as_float(v) for v in read("rope_factors_short.weight")]
            if "rope_factors_short.weight" in names else 1.0}
        config["original_max_position_embeddings"] = int(
            _meta(m, "phi3", "rope.scaling.original_context_length"))
    else:
        config["rope_scaling"] = rope_scaling_from_metadata(m, "phi3")
    return config


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", _LLAMA_BLOCK, _llama, frozenset({"rope_freqs.weight"})),
    "qwen2": ArchSpec("qwen2", _LLAMA_BLOCK, _qwen2),
    "qwen3": ArchSpec("qwen3", {**_LLAMA_BLOCK, **_QK_NORM}, _qwen3),
    "gemma3": ArchSpec("gemma3_text", {
        "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
        **_ATTENTION, **_QK_NORM, **_MLP}, _gemma3, norms_plus_one=True),
    "phi3": ArchSpec("phi3", {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj",
        "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"}, _phi3,
        frozenset({"rope_factors_long.weight", "rope_factors_short.weight"})),
}
"""``general.architecture`` -> its mapping (module docstring)."""


def arch_spec(metadata: Mapping[str, Any]) -> tuple[str, ArchSpec]:
    """``(general.architecture, its spec)``.

    Raises:
        UnsupportedModelError: an architecture not in :data:`ARCHITECTURES` (named).
    """
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    return str(arch), ARCHITECTURES[str(arch)]


def base_config(metadata: Mapping[str, Any], arch: str, names: frozenset[str]) -> dict[str, Any]:
    """The config keys every architecture shares, from ``<arch>.*`` metadata: sizes,
    ``max_position_embeddings`` (``context_length``, tokens), ``rms_norm_eps``,
    ``rope_theta``, ``tie_word_embeddings`` (no ``output.weight``), ``vocab_size`` (else the
    token list's length), bos/eos ids.

    Raises:
        UnsupportedModelError: a needed size is missing (named).
    """
    hidden = int(_meta(metadata, arch, "embedding_length"))
    heads = int(_meta(metadata, arch, "attention.head_count"))
    head_dim = int(metadata.get(f"{arch}.attention.key_length",
                                metadata.get(f"{arch}.rope.dimension_count", hidden // heads)))
    vocab = metadata.get(f"{arch}.vocab_size", len(metadata.get("tokenizer.ggml.tokens", ())))
    config: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": int(_meta(metadata, arch, "block_count")),
        "intermediate_size": int(_meta(metadata, arch, "feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(metadata.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "vocab_size": int(vocab),
        "max_position_embeddings": int(_meta(metadata, arch, "context_length")),
        "rms_norm_eps": as_float(_meta(metadata, arch, "attention.layer_norm_rms_epsilon")),
        "rope_theta": as_float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
    }
    for key in ("bos_token_id", "eos_token_id"):
        if (value := metadata.get(f"tokenizer.ggml.{key}")) is not None:
            config[key] = int(value)
    return config
