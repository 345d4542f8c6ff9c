"""Pure rules mapping a llama-family GGUF onto the MLX/Hugging Face layout mlx-lm loads:
``config.json`` from the GGUF metadata, tensor names, and the ``"quantization"`` entry.

GGUF's llama converter stores the q/k projections permuted into the interleaved rotary
layout of the original Meta checkpoints, so the config asks for ``rope_traditional: true``
(mlx-lm then rotates adjacent pairs) instead of un-permuting the weights.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Mapping

import numpy as np

from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.gguf_reader import GgufTensorInfo

SUPPORTED_ARCHITECTURES = ("llama",)
"""``general.architecture`` values the importer handles (Mistral GGUFs also say llama)."""

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SUFFIXES = ("weight", "scales", "biases", "bias")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.([a-z]+)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.([a-z]+)$")


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face / mlx-lm name of a GGUF tensor as ``mx.load`` returns it.

    ``blk.3.attn_q.scales`` -> ``model.layers.3.self_attn.q_proj.scales``,
    ``token_embd.weight`` -> ``model.embed_tokens.weight``, ``output.weight`` -> ``lm_head.weight``.

    Raises:
        UnsupportedModelError: a tensor outside the llama layout (e.g. ``rope_freqs.weight``
            of Llama 3.1 rope scaling, or MoE experts).
    """
    if m := _BLOCK_RE.match(gguf_name):
        layer, part, suffix = m.groups()
        if part in _BLOCK_NAMES and suffix in _SUFFIXES:
            return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{suffix}"
    elif m := _GLOBAL_RE.match(gguf_name):
        part, suffix = m.groups()
        if part in _GLOBAL_NAMES and suffix in _SUFFIXES:
            return f"{_GLOBAL_NAMES[part]}.{suffix}"
    raise UnsupportedModelError(
        f"GGUF tensor {gguf_name!r} has no place in the llama layout this importer supports"
    )


def config_from_gguf(metadata: Mapping[str, Any], tensors: tuple[GgufTensorInfo, ...]) -> dict:
    """The mlx-lm ``config.json`` (without ``"quantization"``) of a llama-family GGUF.

    Sizes come from ``<arch>.*`` metadata; ``max_position_embeddings`` is
    ``<arch>.context_length`` (tokens); ``tie_word_embeddings`` is true when there is no
    ``output.weight``; ``vocab_size`` falls back to the token list length.

    Raises:
        UnsupportedModelError: another architecture, missing sizes, or rope scaling other
            than none/linear.
    """
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported (supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    names = {t.name for t in tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedModelError(
            "GGUF has rope_freqs.weight (Llama 3.1-style rope scaling), which is not supported"
        )

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in metadata:
            raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
        return metadata[f"{arch}.{key}"]

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(metadata.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(metadata.get(f"{arch}.attention.key_length",
                                metadata.get(f"{arch}.rope.dimension_count", hidden // heads)))
    vocab = metadata.get(f"{arch}.vocab_size", len(metadata.get("tokenizer.ggml.tokens", ())))
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": _f32(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_traditional": True,
        "rope_scaling": _rope_scaling(metadata, arch),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_gate.bias" in names,
    }
    for key, token_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        if (value := metadata.get(f"tokenizer.ggml.{token_key}")) is not None:
            config[key] = int(value)
    return config


def quantization_from_shapes(
    packed: Mapping[str, tuple[int, ...]], in_features: Mapping[str, int]
) -> dict[str, Any] | None:
    """The mlx-lm ``"quantization"`` entry for a set of weights.

    ``packed`` maps every tensor name to its stored shape; ``in_features[module]`` is the
    unpacked input size of each module that has ``.scales``. Per module, ``group_size =
    in_features / scales.shape[-1]`` and ``bits = weight.shape[-1] * 32 / in_features``
    (uint32 packing). The most common (group_size, bits) is the default; modules that differ
    get a per-module entry, and 2-D weights without scales get ``false`` (stay unquantized).
    Returns None when nothing is quantized.
    """
    params: dict[str, tuple[int, int]] = {}
    for module, n_in in in_features.items():
        groups = packed[f"{module}.scales"][-1]
        words = packed[f"{module}.weight"][-1]
        if n_in % groups or (words * 32) % n_in:
            raise UnsupportedModelError(f"cannot derive quantization of {module} from shapes")
        params[module] = (n_in // groups, words * 32 // n_in)
    if not params:
        return None
    (group_size, bits), _ = Counter(params.values()).most_common(1)[0]
    quantization: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for module, (g, b) in sorted(params.items()):
        if (g, b) != (group_size, bits):
            quantization[module] = {"group_size": g, "bits": b}
    for name, shape in sorted(packed.items()):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and len(shape) == 2 and module not in params:
            quantization[module] = False
    return quantization


def _rope_scaling(metadata: Mapping[str, Any], arch: str) -> dict | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _f32(metadata[f"{arch}.rope.scaling.factor"])}
    raise UnsupportedModelError(f"GGUF rope scaling {kind!r} is not supported (none, linear)")


def _f32(value: float) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974e-06 -> 1e-05)."""
    return float(str(np.float32(value)))
