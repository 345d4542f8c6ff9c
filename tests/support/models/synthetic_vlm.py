"""A tiny random Qwen2-VL in mlx-vlm's layout, for the vision tests (docs/models.md#vision-models).

``make_synthetic_vlm(out_dir)`` writes what ``mlx_vlm.load`` reads: ``config.json`` (a 2-layer
language model of width 64 with M-RoPE, a 1-block vision tower of width 32 whose merger
projects to 64), ``model.safetensors`` (seeded random weights in mlx-vlm's own parameter
names and layout, so loading sanitizes nothing), the synthetic byte-level BPE tokenizer with
Qwen2-VL's vision specials (``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``,
``<|video_pad|>``), a chat template that puts each image as
``<|vision_start|><|image_pad|><|vision_end|>`` before the text, and
``preprocessor_config.json`` for Qwen2-VL's image processor (resize to 28-pixel multiples,
56²..224² pixels). The same arguments always give byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from tests.support.models.synthetic_models import SPECIAL_TOKENS, _build_tokenizer, write_tokenizer_files

VISION_SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen2-VL's template shape: an image part renders as its three vision tokens."""


def _config(vocab: int, ids: dict[str, int]) -> dict:
    return {
        "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": vocab, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}, "tie_word_embeddings": False,
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": [2, 0], "torch_dtype": "float32",
        "vision_config": {"model_type": "qwen2_vl", "depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                          "mlp_ratio": 2, "patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "in_channels": 3},
    }


def _weights(config: dict, seed: int) -> dict[str, mx.array]:
    from mlx_vlm.models.qwen2_vl import Model, ModelConfig, TextConfig, VisionConfig

    model_config = ModelConfig.from_dict(json.loads(json.dumps(config)))
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    model_config.text_config = TextConfig.from_dict(model_config.text_config)
    model = Model(model_config)
    rng = np.random.default_rng(seed)
    out: dict[str, mx.array] = {}
    for name, p in tree_flatten(model.parameters()):
        shape = tuple(p.shape)
        if name.endswith(("norm.weight", "ln_q.weight", "norm1.weight", "norm2.weight")):
            arr = np.ones(shape, dtype=np.float32)
        elif name.endswith("bias"):
            arr = np.zeros(shape, dtype=np.float32)
        elif "embed_tokens" in name or "lm_head" in name:
            arr = rng.standard_normal(shape, dtype=np.float32) * (2.5 / np.sqrt(64))
            arr[: len(SPECIAL_TOKENS)] *= 0.2
        else:
            arr = rng.standard_normal(shape, dtype=np.float32) * (2.0 / np.sqrt(shape[-1]))
        out[name] = mx.array(arr)
    return out


def make_synthetic_vlm(out_dir: Path, *, seed: int = 0) -> Path:
    """Write the tiny Qwen2-VL into ``out_dir`` (created) and return it."""
    from tokenizers import AddedToken

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_SPECIALS])
    ids = {t: tok.token_to_id(t) for t in VISION_SPECIALS}
    config = _config(tok.get_vocab_size(), ids)
    write_tokenizer_files(out_dir, tok, 4096, "jinja", template=VL_TEMPLATE)
    tok_config = json.loads((out_dir / "tokenizer_config.json").read_text())
    for token, i in ids.items():
        tok_config["added_tokens_decoder"][str(i)] = {"content": token, "special": True, "lstrip": False, "rstrip": False,
                                                      "normalized": False, "single_word": False}
    tok_config["processor_class"] = "Qwen2VLProcessor"
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        "min_pixels": 56 * 56, "max_pixels": 224 * 224, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
    }, indent=2))
    mx.save_safetensors(str(out_dir / "model.safetensors"), _weights(config, seed), metadata={"format": "mlx"})
    return out_dir
