"""One vision-language generation on rank 0 of a single-rank instance: the processor's
inputs, the vision features (cached per image digest, ``worker.vision.features``) spliced
into the input embeddings at the image tokens, then the language model's prefill and greedy
decode (docs/models.md#vision-models).

``vision_inputs(processor, model, prompt, images)`` runs the model's own processor (resize,
patches, the template's image tokens expanded to one per feature); ``greedy_tokens`` prefills
all but the last prompt token in one chunk, then decodes: the steps mlx-vlm's own ``generate``
takes for a prompt shorter than its prefill step, so greedy tokens equal its tokens
(``tests/test_vision_engine.py``). Qwen2-VL's M-RoPE positions (text after an image continues
from the image's grid, not from its token count) travel as ``position_ids``/``rope_deltas``.
This is the one-request reference path (``scripts/bench_vision.py``); a node's runner batches
vision rows with text rows instead (``worker.vision.engine``, ``worker.vision.rows``).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import mlx.core as mx
import msgspec

from worker.vision.features import FeatureCache, image_features


class VisionInputs(msgspec.Struct, frozen=True, dict=True):
    """A prompt's processed inputs: ``input_ids`` ``[1, tokens]`` (each image's token repeated
    once per feature), ``pixel_values`` (every image's patches), ``grid_thw`` ``[images, 3]``,
    ``digests`` of the images in order."""

    input_ids: mx.array
    pixel_values: mx.array
    grid_thw: mx.array
    digests: tuple[str, ...]


def vision_inputs(processor, model, prompt: str, images: Sequence[tuple[str, bytes]]) -> VisionInputs:  # noqa: ANN001
    """``prompt`` (rendered, one image placeholder per image) and ``images`` (digest, bytes —
    already checked by the API, ``exo_p2p.vision.image``) through the model's processor."""
    from mlx_vlm.utils import prepare_inputs
    from PIL import Image

    pictures = [Image.open(io.BytesIO(data)).convert("RGB") for _, data in images]
    inputs = prepare_inputs(processor, images=pictures, prompts=prompt,
                            image_token_index=getattr(model.config, "image_token_index", None))
    return VisionInputs(inputs["input_ids"], inputs["pixel_values"], inputs["image_grid_thw"],
                        tuple(digest for digest, _ in images))


def greedy_tokens(model, inputs: VisionInputs, max_tokens: int, cache: FeatureCache,  # noqa: ANN001 - an mlx-vlm model
                  eos: Sequence[int] = ()) -> list[int]:
    """Greedy token ids (at most ``max_tokens``, stopping after an ``eos`` id) of ``inputs``."""
    from mlx_vlm.models import cache as kv_cache

    features = image_features(model.vision_tower, inputs.pixel_values, inputs.grid_thw, inputs.digests, cache)
    embedded = model.get_input_embeddings(inputs.input_ids, inputs.pixel_values, image_grid_thw=inputs.grid_thw,
                                          cached_image_features=features)
    extra = {k: v for k, v in embedded.to_dict().items() if k != "inputs_embeds" and v is not None}
    lm = model.language_model
    if hasattr(lm, "_rope_deltas"):
        lm._rope_deltas = None  # a new prompt: positions from its own grid
    prompt_cache = kv_cache.make_prompt_cache(lm)
    ids, embeds = inputs.input_ids, embedded.inputs_embeds
    if ids.shape[1] > 1:
        lm(inputs=ids[:, :-1], inputs_embeds=embeds[:, :-1], cache=prompt_cache, n_to_process=ids.shape[1] - 1,
           logits_to_keep=1, **extra)
        mx.eval([c.state for c in prompt_cache])
    out = lm(ids[:, -1:], inputs_embeds=embeds[:, -1:], cache=prompt_cache, logits_to_keep=1, **extra)
    tokens: list[int] = []
    while len(tokens) < max_tokens:
        token = int(mx.argmax(out.logits[:, -1, :], axis=-1).item())
        tokens.append(token)
        if token in eos:
            break
        out = lm(mx.array([[token]]), cache=prompt_cache, logits_to_keep=1)
    return tokens
