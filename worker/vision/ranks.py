"""A vision row on a pipeline instance: the vision tower on rank 0, hidden states to the next
ranks (docs/architecture.md#engine "Vision rows").

Every rank is given the task and its images (``worker.vision.delivery``) and makes the row at
the same point, in the same order (the rounds' agreed submit): the ranks first agree that each
holds every image (one all-gather: a rank without one would leave the others waiting in the
pipeline), run the processor (the prompt's ids and each image's patch grid, so every rank
knows the row's M-RoPE positions), ask the prompt cache (itself a collective), then prefill
the image part through the pipeline stage: rank 0 feeds the input embeddings with the tower's
features spliced in (``PipelineStage.prefill_embedded``), the others the hidden states they
receive, every rank's layers rotating by the row's shifted 3-D positions (``mrope_layers``: the
layers' RoPE replaced for this one forward by mlx-vlm's own M-RoPE of the model). Tensor
instances are not served yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class _MRope(nn.Module):
    """Stands for a layer's RoPE during a vision row's prefill: rotates by ``positions``
    (``[3, B, L]``) with the model's own M-RoPE (``rotary``: mlx-vlm's rotary embedding)."""

    def __init__(self, rotary: Any, positions: mx.array) -> None:
        super().__init__()
        object.__setattr__(self, "_rotary", rotary)
        object.__setattr__(self, "_positions", positions)

    def __call__(self, x: mx.array, offset: Any = None) -> mx.array:
        return self._rotary.apply_rotary(x, x, self._positions, unsqueeze_dim=1)[0]


@contextmanager
def mrope_layers(layers: Any, rotary: Any, positions: mx.array) -> Iterator[None]:
    """Within the block, every layer of ``layers`` with an attention ``rope`` rotates by
    ``positions`` (``_MRope``); the layers' own RoPE is back afterwards, whatever happens."""
    hooked = [(layer.self_attn, layer.self_attn.rope) for layer in layers
              if hasattr(getattr(layer, "self_attn", None), "rope")]
    for attn, _ in hooked:
        attn.rope = _MRope(rotary, positions)
    try:
        yield
    finally:
        for attn, rope in hooked:
            attn.rope = rope


def all_ranks_hold(gather: Any, held: bool) -> bool:
    """Whether every rank holds its row's images (a collective over ``gather``, the instance's
    all-gather; None: one rank)."""
    if gather is None:
        return held
    return bool(gather(np.array([int(held)], dtype=np.int64)).reshape(-1).min())


def pipeline_image_kv(stage: Any, model: Any, vlm: Any, inputs: Any, end: int, features: Any, cache: list[Any]) -> list[Any]:
    """Prefill ``inputs``' first ``end`` tokens on this pipeline rank into ``cache`` (this
    rank's layers; see the module docstring) and return it. A collective: every rank calls it."""
    from worker.vision.features import image_features

    lm = vlm.language_model
    positions, delta = lm.get_rope_index(inputs.input_ids, inputs.grid_thw)
    shifted = positions[:, :, :end] - delta.reshape(1, -1, 1)
    embeds = None
    if stage.is_first:
        found = image_features(vlm.vision_tower, inputs.pixel_values, inputs.grid_thw, inputs.digests, features)
        embeds = vlm.get_input_embeddings(inputs.input_ids, inputs.pixel_values, image_grid_thw=inputs.grid_thw,
                                          cached_image_features=found).inputs_embeds[:, :end]
    rotary = lm.model.layers[0].self_attn.rotary_emb
    with mrope_layers(model.layers, rotary, shifted):
        stage.prefill_embedded(model, inputs.input_ids[:, :end], cache, embeds)
    return cache
