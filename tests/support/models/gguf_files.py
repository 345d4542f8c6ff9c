"""Tiny GGUF files written with the ``gguf`` package's writer, as llama.cpp's converter would
write them from a Hugging Face checkpoint, with the float weights they stand for.

:func:`write_family_gguf` takes a random mlx-lm model of a family (mlx-lm's own class gives
the parameter names), renames its tensors to GGUF names, applies the converter's changes
(llama's q/k permutation, Gemma's norms stored as 1 + w), stores each tensor in the GGML
type ``types(name)`` picks (``gguf.quants.quantize`` where the package can quantize it;
random blocks for the K-quants it cannot), and returns the reference weights: what each
stored tensor means, in the Hugging Face layout (``gguf.quants.dequantize``, undone
changes). Loaded into mlx-lm's class, they give the logits an import must reproduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

import gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_BLOCK = {  # Hugging Face block part -> GGUF part, per family (llama.cpp's tensor names)
    "llama": {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"},
}
_BLOCK["qwen2"] = _BLOCK["llama"]
_BLOCK["qwen3"] = {**_BLOCK["llama"], "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_BLOCK["gemma3"] = {**_BLOCK["qwen3"], "post_attention_layernorm": "post_attention_norm",
                    "pre_feedforward_layernorm": "ffn_norm",
                    "post_feedforward_layernorm": "post_ffw_norm"}
_BLOCK["phi3"] = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                  "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
                  "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (the alphabet of byte-level BPE)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary: specials, the 256 bytes, a few merges' results."""
    merged = ["Ġt", "he", "Ġthe", "Ġa", "in"]
    tokens = SPECIALS + bytes_to_unicode() + merged
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
    return tokens, types, merges


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: q/k rows of each head into the interleaved rotary order."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


FLOAT16_FIELDS = {  # byte offsets of the float16 fields (d, dmin, m) in a block
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}


def random_blocks(ggml_type: int, n_blocks: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """``n_blocks`` random blocks of ``ggml_type`` whose float16 fields are finite values of
    magnitude up to ``scale`` (random bytes there could be NaN or infinity)."""
    qtype = gguf.GGMLQuantizationType(ggml_type)
    _, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    for offset in FLOAT16_FIELDS[qtype.name]:
        values = rng.uniform(-scale, scale, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_k_blocks(qtype: gguf.GGMLQuantizationType, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant (``gguf.quants`` cannot quantize them), their float16
    fields small so the weights are about ±0.05 like a trained model's."""
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    n = shape[0] * shape[1] // block
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    bits = {"Q2_K": 2, "Q3_K": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}[qtype.name]
    for offset in FLOAT16_FIELDS[qtype.name]:
        d = rng.uniform(-1, 1, n) * 0.05 / (2**bits * 64)
        raw[:, offset:offset + 2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(shape[0], -1)


@dataclass
class FamilyGguf:
    """A written GGUF, the config of the reference model and its weights (float32 numpy)."""

    path: Path
    config: dict[str, Any]
    weights: dict[str, np.ndarray]


def reference_model(config: dict[str, Any], weights: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    """mlx-lm's model of ``config`` holding ``weights`` (float32)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    arrays = {k: mx.array(v) for k, v in weights.items()}
    if hasattr(model, "sanitize"):
        arrays = model.sanitize(arrays)
    model.load_weights(list(arrays.items()), strict=True)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def write_family_gguf(path: Path, family: str, config: dict[str, Any], metadata: dict[str, Any],
                      types: Callable[[str], str], seed: int = 0,
                      extra_tensors: dict[str, np.ndarray] | None = None) -> FamilyGguf:
    """Write ``path``: a random model of mlx-lm's ``config`` as a GGUF of architecture
    ``family`` (``metadata``: its ``<arch>.*`` and tokenizer keys), each tensor in the type
    ``types(gguf_name)`` names (``"F32"``, ``"Q4_K"``...). ``extra_tensors`` (float32) are
    written as they are (``rope_freqs``)."""
    from mlx_lm.utils import _get_classes

    rng = np.random.default_rng(seed)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    params = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    if config.get("tie_word_embeddings"):  # a tied model's GGUF has no output.weight
        params.pop("lm_head.weight", None)
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    writer = gguf.GGUFWriter(str(path), family)
    for key, value in metadata.items():
        _add(writer, key, value)
    weights: dict[str, np.ndarray] = {}
    for name, value in sorted(params.items()):
        if name.endswith("norm.weight") or name.endswith(".bias"):
            value = rng.normal(0, 0.1, value.shape).astype(np.float32) + (1 if family != "gemma3" and name.endswith("norm.weight") else 0)
        gname = _gguf_name(family, name)
        stored = value
        if family == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            stored = _permute(value, heads if "q_proj" in name else kv)
        if family == "gemma3" and name.endswith("norm.weight"):
            stored = value + 1
        qtype = gguf.GGMLQuantizationType[types(gname) if stored.ndim == 2 else "F32"]
        if qtype.name.endswith("_K"):
            raw = random_k_blocks(qtype, stored.shape, rng)
        else:
            raw = gguf.quants.quantize(stored.astype(np.float32), qtype)
        meant = gguf.quants.dequantize(raw, qtype).reshape(stored.shape).astype(np.float32)
        if family == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            meant = _unpermute(meant, heads if "q_proj" in name else kv)
        if family == "gemma3" and name.endswith("norm.weight"):
            meant = meant - 1
        weights[name] = meant
        writer.add_tensor(gname, raw, raw_dtype=qtype)
    for gname, value in (extra_tensors or {}).items():
        writer.add_tensor(gname, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return FamilyGguf(path, config, weights)


def _gguf_name(family: str, name: str) -> str:
    parts = name.split(".")
    if parts[:2] == ["model", "layers"]:
        part, suffix = ".".join(parts[3:-1]), parts[-1]
        return f"blk.{parts[2]}.{_BLOCK[family][part]}.{suffix}"
    prefix, suffix = name.rsplit(".", 1)
    return f"{_GLOBAL[prefix]}.{suffix}"


def _add(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], str):
        writer.add_array(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], float):
        writer.add_array(key, [float(v) for v in value])
    elif isinstance(value, list):
        writer.add_array(key, [int(v) for v in value])
    else:
        raise TypeError(f"{key}: {value!r}")


def llama3_rope_freqs(scaling: dict, base: float, dims: int) -> np.ndarray:
    """rope_freqs as llama.cpp's converter computes it from a llama3 rope_scaling."""
    low_wl = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high_wl = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / dims))
        if wavelen < high_wl:
            out.append(1.0)
        elif wavelen > low_wl:
            out.append(scaling["factor"])
        else:
            smooth = ((scaling["original_max_position_embeddings"] / wavelen - scaling["low_freq_factor"])
                      / (scaling["high_freq_factor"] - scaling["low_freq_factor"]))
            out.append(1 / ((1 - smooth) / scaling["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def family_metadata(family: str, config: dict[str, Any], tokenizer: str = "gpt2") -> dict[str, Any]:
    """The GGUF metadata llama.cpp's converter writes for ``config`` (a byte-level BPE
    vocabulary with ChatML turns unless ``tokenizer`` is ``"llama"``)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    m: dict[str, Any] = {
        "general.name": config.get("_name", f"tiny-{family}"),
        f"{family}.context_length": config.get("max_position_embeddings", 512),
        f"{family}.embedding_length": config["hidden_size"],
        f"{family}.block_count": config["num_hidden_layers"],
        f"{family}.feed_forward_length": config["intermediate_size"],
        f"{family}.attention.head_count": heads,
        f"{family}.attention.head_count_kv": config.get("num_key_value_heads", heads),
        f"{family}.attention.key_length": head_dim,
        f"{family}.attention.value_length": head_dim,
        f"{family}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{family}.rope.freq_base": float(config.get("rope_theta", 10000.0)),
        f"{family}.rope.dimension_count": int(head_dim * config.get("partial_rotary_factor", 1.0)),
        "tokenizer.chat_template": CHATML,
    }
    if family == "gemma3":
        m["gemma3.attention.sliding_window"] = config["sliding_window"]
    if tokenizer == "gpt2":
        tokens, types, merges = byte_level_vocab()
        m.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
                  "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                  "tokenizer.ggml.merges": merges, "tokenizer.ggml.eos_token_id": 2,
                  "tokenizer.ggml.bos_token_id": 0})
    assert math.isfinite(config["rms_norm_eps"])
    return m
