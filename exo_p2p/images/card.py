"""The card of an image pipeline from its files (docs/images.md#models): a FLUX.2-klein
checkpoint, in mflux's saved layout or diffusers' (``model_index.json``, then ``transformer/``,
``text_encoder/``, ``vae/`` with their ``config.json`` and safetensors, ``tokenizer/``).

What placement reads, mapped onto the card's parts: the transformer's blocks are the card's
layers (double-stream blocks first, then single-stream ones; ``layer_bytes[i]`` block ``i``'s
tensors), so a pipeline split gives each rank whole blocks. The text encoder and the VAE are
``embedding_bytes`` (rank 0's: it encodes the prompt and decodes the image, since it is the
rank that answers); the transformer's other tensors (embedders, modulations, output) are
``shared_bytes``, held by every rank (each computes a step's time embedding and modulation
itself); the VAE decode of the largest image is rank 0's ``work_bytes``
(docs/images.md#pipeline says why). Weights are never read: sizes come from the safetensors
headers.
"""

from __future__ import annotations

import re
from pathlib import Path

from exo_p2p.images.bounds import MAX_PIXELS
from exo_p2p.models.card.derive import read_safetensors_sizes
from exo_p2p.models.errors import UnsupportedModelError
from exo_p2p.models.hub_limits import check_layers
from exo_p2p.models.model_json import model_json
from exo_p2p.types.common import ModelId
from exo_p2p.types.kinds import image_tasks
from exo_p2p.types.models import ModelCard

COMPONENTS = ("transformer", "text_encoder", "vae")
"""The component folders every image checkpoint holds (each a ``config.json`` and ``*.safetensors``)."""

PROMPT_TOKENS = 512
"""The prompt tokens the text encoder reads (mflux's ``max_sequence_length``): the card's context."""

_BLOCK = re.compile(r"^(single_)?transformer_blocks\.(\d+)\.")
MAX_JSON_BYTES = 1 << 20
"""``model_index.json`` and a component's ``config.json`` are at most this long (bytes)."""


def _json(path: Path) -> dict:
    if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
        raise UnsupportedModelError(f"{path}: missing or over {MAX_JSON_BYTES} bytes")
    data = model_json(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"{path}: not a JSON object")
    return data


def component_sizes(model_dir: Path, component: str) -> dict[str, int]:
    """Tensor name → bytes of ``component``'s safetensors files (headers only). Raises
    ``UnsupportedModelError`` for a component without any."""
    files = sorted((model_dir / component).glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{model_dir.name}: no {component}/*.safetensors")
    sizes: dict[str, int] = {}
    for path in files:
        sizes.update(read_safetensors_sizes(path))
    return sizes


def block_bytes(sizes: dict[str, int], double: int, single: int) -> list[int]:
    """Bytes of each transformer block (``double`` double-stream ones, then ``single``
    single-stream ones) from the transformer's tensor sizes. Raises
    ``UnsupportedModelError`` for a block without tensors or one outside the counts."""
    out = [0] * (double + single)
    for name, size in sizes.items():
        if m := _BLOCK.match(name):
            index = int(m.group(2)) + (double if m.group(1) else 0)
            if int(m.group(2)) >= (single if m.group(1) else double):
                raise UnsupportedModelError(f"tensor {name} is outside the config's {double}+{single} blocks")
            out[index] += size
    if empty := [i for i, b in enumerate(out) if b == 0]:
        raise UnsupportedModelError(f"transformer blocks {empty[:5]} have no tensors")
    return out


DECODE_BYTES_PER_PIXEL_CHANNEL = 24
"""Peak bytes of the VAE decode per output pixel per full-resolution channel (measured on
CPU with mflux 0.24's low-memory decode: 22.4 at 512², rounded up; docs/images.md#placement)."""


def decode_bytes(vae_config: dict, pixels: int = MAX_PIXELS) -> int:
    """Working memory of the VAE decode of a ``pixels`` image (bytes, an upper bound): its
    full-resolution activations (``DECODE_BYTES_PER_PIXEL_CHANNEL`` × pixels × the first of
    ``block_out_channels``) and the float32 scores of the mid-block attention over the
    latent tokens (pixels ÷ 64 of them)."""
    channels = vae_config.get("block_out_channels") or [128]
    first = int(channels[0]) if isinstance(channels, list) and channels else 128
    tokens = pixels // 64
    return DECODE_BYTES_PER_PIXEL_CHANNEL * pixels * first + 4 * tokens * tokens


def image_card(model_dir: Path, model_id: str) -> ModelCard:
    """The card of the image pipeline in ``model_dir`` (module docstring). Raises
    ``UnsupportedModelError`` for a pipeline class the image runner does not build, a missing
    component or config, or blocks that do not match the config."""
    index = _json(model_dir / "model_index.json")
    tasks = image_tasks(index)
    if not tasks:
        raise UnsupportedModelError(f"{model_dir.name}: image pipeline {str(index.get('_class_name'))[:80]!r} "
                                    "is not one the image runner builds (FLUX.2-klein)")
    t, e = _json(model_dir / "transformer" / "config.json"), _json(model_dir / "text_encoder" / "config.json")
    _json(model_dir / "vae" / "config.json")
    sizes = {c: component_sizes(model_dir, c) for c in COMPONENTS}
    double, single = int(t.get("num_layers", 5)), int(t.get("num_single_layers", 20))
    if min(double, single) < 0:
        raise UnsupportedModelError(f"{model_dir.name}: negative block counts {double}, {single}")
    n_layers = check_layers(double + single, range(double + single))
    layers = block_bytes(sizes["transformer"], double, single)
    total = sum(sum(s.values()) for s in sizes.values())
    shared = sum(sizes["transformer"].values()) - sum(layers)
    heads = int(t.get("num_attention_heads", 24))
    return ModelCard(
        model_id=ModelId(model_id), n_layers=n_layers, hidden_size=heads * int(t.get("attention_head_dim", 128)),
        num_attention_heads=heads, num_key_value_heads=heads, vocab_size=int(e.get("vocab_size", 0)),
        context_length=PROMPT_TOKENS, storage_size=total, layer_bytes=tuple(layers),
        embedding_bytes=total - sum(layers) - shared, head_bytes=0, shared_bytes=shared,
        work_bytes=decode_bytes(_json(model_dir / "vae" / "config.json")), norm_bytes=0, tie_word_embeddings=False,
        architecture="flux2", supports_tensor=False, tasks=tasks)
