"""A tiny random-weight FLUX.2-klein checkpoint in mflux's saved layout, for tests and
benchmarks (docs/images.md#checkpoints).

``make_tiny_flux2`` builds the pipeline's components at tiny sizes through the image runner's
own initializer pieces (``worker.image.load.build_components``: mflux's ``Flux2Transformer``,
``Qwen3TextEncoder`` and a sized ``Flux2VAE``), with MLX's default random init from a fixed
seed, and writes them with mflux's ``ModelSaver`` (``<component>/0.safetensors`` and its index),
the byte-level BPE tokenizer of ``synthetic_models`` as a Qwen2 tokenizer with a chat template
under ``tokenizer/``, each component's ``config.json`` (diffusers' keys) and a
``model_index.json`` naming the pipeline class, as a Hugging Face FLUX.2-klein repository does.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.models.synthetic_models import CHATML_TEMPLATE, _build_tokenizer, write_tokenizer_files

TINY_TRANSFORMER = {
    "num_layers": 2, "num_single_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16,
    "joint_attention_dim": 48, "in_channels": 128, "timestep_guidance_channels": 32, "mlp_ratio": 2.0,
    "axes_dims_rope": [4, 4, 4, 4],
}
"""The tiny transformer: 2 double-stream and 2 single-stream blocks of width 32."""

TINY_TEXT = {
    "vocab_size": 320, "hidden_size": 16, "num_hidden_layers": 28, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 32, "head_dim": 8, "max_position_embeddings": 1024,
}
"""The tiny Qwen3 text encoder: 28 layers because mflux reads hidden states 9, 18 and 27
(``joint_attention_dim`` = 3 × ``hidden_size``)."""

TINY_VAE_CHANNELS = [32, 32, 32, 32]
"""The reduced VAE's ``block_out_channels`` (32: its group norm's group count)."""

PIPELINE_CLASS = "Flux2KleinPipeline"
"""``model_index.json``'s ``_class_name`` of a FLUX.2-klein repository."""


def _write_configs(out: Path) -> None:
    (out / "transformer" / "config.json").write_text(json.dumps({"_class_name": "Flux2Transformer2DModel",
                                                                  **TINY_TRANSFORMER}, indent=2))
    (out / "text_encoder" / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"],
                                                                   "model_type": "qwen3", **TINY_TEXT}, indent=2))
    (out / "vae" / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLFlux2",
                                                          "block_out_channels": TINY_VAE_CHANNELS}, indent=2))
    (out / "model_index.json").write_text(json.dumps({
        "_class_name": PIPELINE_CLASS, "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"], "vae": ["diffusers", "AutoencoderKLFlux2"],
        "tokenizer": ["transformers", "Qwen2TokenizerFast"]}, indent=2))


def _write_tokenizer(out: Path) -> None:
    tok_dir = out / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    write_tokenizer_files(tok_dir, _build_tokenizer(), 1024, "config", CHATML_TEMPLATE)
    config_path = tok_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen2TokenizerFast"
    config_path.write_text(json.dumps(config, indent=2))


def make_tiny_flux2(out_dir: Path | str, *, seed: int = 0) -> Path:
    """Write the tiny checkpoint into ``out_dir`` (created) and return it. The same ``seed``
    gives the same weights."""
    import mlx.core as mx
    from mflux.models.common.weights.saving.model_saver import ModelSaver
    from mflux.models.flux2.weights.flux2_weight_definition import Flux2KleinWeightDefinition

    from worker.image.load import Flux2Sizes, build_components, empty_pipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model = empty_pipeline()
    sizes = Flux2Sizes({k: tuple(v) if isinstance(v, list) else v for k, v in TINY_TRANSFORMER.items()},
                       dict(TINY_TEXT), tuple(TINY_VAE_CHANNELS))
    build_components(model, sizes)
    mx.eval(model.parameters())
    ModelSaver.save_model(model, bits=16, base_path=str(out), weight_definition=Flux2KleinWeightDefinition)
    _write_configs(out)
    _write_tokenizer(out)
    return out
