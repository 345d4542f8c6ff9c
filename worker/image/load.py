"""Build an mflux FLUX.2-klein pipeline from a checkpoint directory (docs/images.md#checkpoints).

mflux's own ``Flux2Klein(model_path=...)`` takes every size from a named preset (the 4B one)
and makes a full-size VAE whatever the checkpoint holds. This initializer calls mflux's loader
pieces (``Flux2Initializer``: config, weight loading, tokenizers, weight applying) with the
component sizes read from the checkpoint's ``transformer/``, ``text_encoder/`` and ``vae/``
``config.json`` (diffusers' key names), so a real FLUX.2-klein and a tiny test checkpoint load
the same way. mflux is imported here only: the node never needs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRANSFORMER_KEYS = ("num_layers", "num_single_layers", "num_attention_heads", "attention_head_dim",
                    "joint_attention_dim", "in_channels", "timestep_guidance_channels", "mlp_ratio",
                    "axes_dims_rope", "rope_theta", "guidance_embeds", "patch_size")
"""The transformer's ``config.json`` keys passed to mflux's ``Flux2Transformer``."""

TEXT_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "intermediate_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "head_dim")
"""The text encoder's ``config.json`` keys passed to mflux's ``Qwen3TextEncoder``."""

MAX_CONFIG_BYTES = 1 << 20
"""A component's ``config.json`` is at most this long (bytes)."""


class ImageModelError(ValueError):
    """A checkpoint this loader cannot build (a component's config missing or unreadable)."""


@dataclass(frozen=True)
class Flux2Sizes:
    """The component sizes of one checkpoint: mflux constructor keyword arguments."""

    transformer: dict[str, Any]
    text_encoder: dict[str, Any]
    vae_channels: tuple[int, ...]


def _config(model_dir: Path, sub: str) -> dict[str, Any]:
    path = model_dir / sub / "config.json"
    if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:
        raise ImageModelError(f"{model_dir.name}: no {sub}/config.json of at most {MAX_CONFIG_BYTES} bytes")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ImageModelError(f"{path}: not a JSON object")
    return data


def read_sizes(model_dir: Path | str) -> Flux2Sizes:
    """The sizes in ``model_dir``'s component configs. Raises ``ImageModelError`` for a
    missing or bad one."""
    root = Path(model_dir)
    t, e, v = _config(root, "transformer"), _config(root, "text_encoder"), _config(root, "vae")
    transformer = {k: (tuple(t[k]) if isinstance(t[k], list) else t[k]) for k in TRANSFORMER_KEYS if k in t}
    text = {k: e[k] for k in TEXT_KEYS if k in e}
    channels = tuple(int(c) for c in v.get("block_out_channels", (128, 256, 512, 512)))
    return Flux2Sizes(transformer, text, channels)


def build_components(model: Any, sizes: Flux2Sizes) -> None:
    """Set ``model``'s ``vae``, ``transformer`` and ``text_encoder`` to mflux modules of
    ``sizes`` (random weights until applied)."""
    from mflux.models.common.vae.block_decoder import VAEBlockDecoder
    from mflux.models.flux2.model.flux2_text_encoder.qwen3_text_encoder import Qwen3TextEncoder
    from mflux.models.flux2.model.flux2_transformer.transformer import Flux2Transformer
    from mflux.models.flux2.model.flux2_vae.encoder.encoder import Flux2Encoder
    from mflux.models.flux2.model.flux2_vae.vae import Flux2VAE

    model.vae = Flux2VAE(decoder_block_out_channels=sizes.vae_channels)
    model.vae.encoder = Flux2Encoder(block_out_channels=sizes.vae_channels)
    model.vae.decode_mode = VAEBlockDecoder.LOW_MEMORY
    model.transformer = Flux2Transformer(**sizes.transformer)
    model.text_encoder = Qwen3TextEncoder(**sizes.text_encoder)


def model_config(sizes: Flux2Sizes, name: str) -> Any:
    """mflux's ``ModelConfig`` of the 4B klein preset with this checkpoint's ``sizes``."""
    import copy

    from mflux.models.common.config import ModelConfig

    config = copy.copy(ModelConfig.flux2_klein_4b())
    config.model_name, config.transformer_overrides = name, dict(sizes.transformer)
    config.text_encoder_overrides = dict(sizes.text_encoder)
    return config


def _pipeline_class(edit: bool) -> type:
    from mflux.models.flux2.variants.edit.flux2_klein_edit import Flux2KleinEdit
    from mflux.models.flux2.variants.txt2img.flux2_klein import Flux2Klein

    return Flux2KleinEdit if edit else Flux2Klein


def empty_pipeline(edit: bool = False) -> Any:
    """A ``Flux2Klein`` (``edit``: a ``Flux2KleinEdit``) whose constructor has not run
    (``load_pipeline`` fills it)."""
    from mlx import nn

    cls = _pipeline_class(edit)
    model = cls.__new__(cls)
    nn.Module.__init__(model)
    return model


SHARED = ("vae", "transformer", "text_encoder", "tokenizers", "model_config", "callbacks", "tiling_config",
          "prompt_cache", "bits", "lora_paths", "lora_scales", "compute_precision", "small_text_encoder",
          "small_decoder")
"""What an edit view shares with its text-to-image pipeline (everything ``load_progress`` sets)."""


def edit_view(pipeline: Any) -> Any:
    """A ``Flux2KleinEdit`` over ``pipeline``'s loaded modules and tokenizer (no second copy
    of the weights): mflux's edit path (reference-image conditioning) on the same model."""
    view = empty_pipeline(edit=True)
    for name in SHARED:
        setattr(view, name, getattr(pipeline, name))
    return view


LOAD_PHASES = 4
"""The load's phases (``load_progress``): the configs, the weights, the tokenizer, the modules."""


def load_progress(model_dir: Path | str, out: list[Any], edit: bool = False,
                  span: tuple[int, int] | None = None, leader: bool = True) -> Iterator[tuple[int, int]]:
    """Load the checkpoint in ``model_dir`` (as ``load_pipeline``), yielding ``(done,
    LOAD_PHASES)`` after each phase; the pipeline is appended to ``out`` at the end.

    ``span`` (a pipeline rank's ``[start, end)`` of the transformer's blocks,
    ``worker.image.stages``): only those blocks are built with weights, the others are empty
    modules whose weights are dropped unread (MLX loads lazily). ``leader`` False: no text
    encoder, VAE or tokenizer (a pipeline rank after the first, docs/images.md#pipeline)."""
    from mflux.models.common.compute_precision import ComputePrecision
    from mflux.models.flux2.flux2_initializer import Flux2Initializer

    path = str(model_dir)
    sizes = read_sizes(model_dir)
    model = empty_pipeline(edit)
    Flux2Initializer._init_config(model, model_config(sizes, path))
    model.small_text_encoder = model.small_decoder = False
    yield 1, LOAD_PHASES
    weights = Flux2Initializer._load_weights(path)
    yield 2, LOAD_PHASES
    if leader:
        Flux2Initializer._init_tokenizers(model, path)
    else:
        model.tokenizers = {}
    yield 3, LOAD_PHASES
    build_components(model, sizes)
    if span is not None or not leader:
        _keep_share(model, weights, span, leader)
    Flux2Initializer._apply_weights(model, weights, None)
    model.lora_paths, model.lora_scales = [], []
    model.compute_precision = ComputePrecision(None)
    out.append(model)
    yield 4, LOAD_PHASES


def _keep_share(model: Any, weights: Any, span: tuple[int, int] | None, leader: bool) -> None:
    """Drop what this rank does not hold from ``model`` and ``weights`` (``load_progress``)."""
    from mlx import nn

    from worker.image.stages import block_count, drop_blocks

    if not leader:
        model.text_encoder, model.vae = nn.Module(), nn.Module()
        weights.components.pop("text_encoder", None)
        weights.components.pop("vae", None)
    start, end = span if span is not None else (0, block_count(model.transformer))
    drop_blocks(model.transformer, start, end)
    tree = weights.components.get("transformer") or {}
    double = len(model.transformer.transformer_blocks)
    for key, offset in (("transformer_blocks", 0), ("single_transformer_blocks", double)):
        blocks = tree.get(key)
        if isinstance(blocks, list):
            tree[key] = [b if start <= i + offset < end else {} for i, b in enumerate(blocks)]


def load_pipeline(model_dir: Path | str, edit: bool = False) -> Any:
    """The mflux ``Flux2Klein`` of the checkpoint in ``model_dir`` (mflux's saved layout or
    diffusers', with component ``config.json`` files), in its stored precision, unquantized
    further (``edit``: a ``Flux2KleinEdit``). Raises ``ImageModelError`` and mflux's errors
    for files it cannot read."""
    out: list[Any] = []
    for _ in load_progress(model_dir, out, edit):
        pass
    return out[0]
