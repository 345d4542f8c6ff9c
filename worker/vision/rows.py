"""A vision row's prompt: rendered with its images, processed, and the KV of its image part
made on rank 0, so the text engine's batch decodes it like any row (docs/architecture.md#engine
"Vision rows").

``render_prompt`` puts each message's images before its text as the template's image parts;
``vision_inputs`` (``worker.vision.greedy``) runs the model's processor (resize, patches, each
image token repeated once per feature). ``image_kv`` runs the vision tower (features cached by
image digest, ``worker.vision.features``), splices the features into the input embeddings, and
prefills the prompt up to its last image token through the language model with Qwen2-VL's
M-RoPE positions (temporal, height, width per token) **shifted by the prompt's rope delta**:
text after an image continues from the image's grid, so its true position is its index plus a
delta (≤ 0); RoPE attention depends only on position differences, so shifting every position
of the row by −delta changes no attention score, and then every token after the last image
sits at its own index — the position the text engine's RoPE gives it (``cache.offset``). The
rest of the prompt and the decode go through the text engine's batch unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from exo_p2p.types import GenerationParams
from worker.engine.answer.tools import render_kwargs
from worker.vision.features import FeatureCache, image_features
from worker.vision.greedy import VisionInputs


def render_prompt(params: GenerationParams, tokenizer: Any) -> str:
    """The chat template's text for ``params``, each message's images as image parts before
    its text. Raises ``ValueError`` when the template's messages do not map one to one onto
    the request's (a template that merges turns) and the template's own errors."""
    messages, kwargs = render_kwargs(params, tokenizer)
    if len(messages) != len(params.messages):
        raise ValueError("this model's messages could not be matched to their images")
    for rendered, message in zip(messages, params.messages):
        if message.images:
            text = rendered.get("content") or ""
            rendered["content"] = [{"type": "image"} for _ in message.images] + [{"type": "text", "text": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def image_part_end(ids: Sequence[int], image_token_id: int) -> int:
    """Tokens up to and including the last image token of ``ids`` (0: none)."""
    last = max((i for i, t in enumerate(ids) if t == image_token_id), default=-1)
    return last + 1


def image_kv(vlm: Any, inputs: VisionInputs, end: int, features: FeatureCache,
             new_cache: Callable[[], list[Any]]) -> list[Any]:
    """The KV (``new_cache()``'s layers) of ``inputs``' first ``end`` tokens (see the module
    docstring), evaluated. ``vlm``: the mlx-vlm model whose language model shares the text
    engine's weights (``worker.vision.builder``)."""
    found = image_features(vlm.vision_tower, inputs.pixel_values, inputs.grid_thw, inputs.digests, features)
    embedded = vlm.get_input_embeddings(inputs.input_ids, inputs.pixel_values, image_grid_thw=inputs.grid_thw,
                                        cached_image_features=found)
    lm = vlm.language_model
    positions, delta = lm.get_rope_index(inputs.input_ids, inputs.grid_thw)
    shifted = positions[:, :, :end] - delta.reshape(1, -1, 1)
    cache = new_cache()
    lm.model(None, inputs_embeds=embedded.inputs_embeds[:, :end], cache=cache, position_ids=shifted)
    mx.eval([a for c in cache for a in c.state])
    return cache
