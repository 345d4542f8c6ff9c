"""mflux's FLUX.2 transformer cut into pipeline stages by block (docs/images.md#pipeline).

``Flux2Transformer.__call__`` is: embed the time (``temb``) and the two streams (``x_embedder``
for the image latents, ``context_embedder`` for the prompt), the rotary embedding of the
token ids, the modulation parameters of ``temb``; then ``num_layers`` double-stream blocks on
(text, image), the streams joined, ``num_single_layers`` single-stream blocks, the text part
dropped, ``norm_out`` and ``proj_out``. Here the blocks are numbered in that order (double
then single, ``0 .. blocks(t) - 1``) and a ``Stage`` runs blocks ``[start, end)``:

- every stage computes the context itself (``context``: ``temb``, modulation parameters,
  rotary embedding) from the timestep and the token ids, which every rank holds — it is a
  few small matrix products, cheaper than sending it;
- the first stage embeds the streams (``embed``), the last one ends with ``finish``;
- between stages the state travels as one array ``[1, text + image tokens, inner_dim]``
  (text first, as the single-stream blocks hold it): during the double-stream blocks it is
  the two streams joined, and ``split`` takes them apart again. Joining and splitting copy
  values, so the stages compute, op for op, what the whole call computes (tests/test_image_stages.py
  checks the pixels equal mflux's own).

Only the unquantized call without a KV cache is cut (mflux uses a KV cache for edits only on
models whose config says so; the klein configs here do not). ``drop_blocks`` replaces the
blocks a stage does not run by empty modules, so their weights are never read or held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx import nn


def block_count(transformer: Any) -> int:
    """The transformer's blocks: double-stream then single-stream (the card's layers)."""
    return len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks)


def drop_blocks(transformer: Any, start: int, end: int) -> None:
    """Replace the blocks outside ``[start, end)`` by empty modules (their parameters gone, so
    weights applied later skip them). Raises ``ValueError`` for an empty or out-of-range span."""
    total, double = block_count(transformer), len(transformer.transformer_blocks)
    if not 0 <= start < end <= total:
        raise ValueError(f"block span [{start}, {end}) is not within the transformer's {total} blocks")
    for i in range(total):
        if start <= i < end:
            continue
        if i < double:
            transformer.transformer_blocks[i] = nn.Module()
        else:
            transformer.single_transformer_blocks[i - double] = nn.Module()


@dataclass(frozen=True)
class Context:
    """What every block of one denoising step reads: ``temb`` and the modulation parameters of
    both streams and the single stream, the rotary embedding of text + image tokens."""

    temb: mx.array
    mod_img: Any
    mod_txt: Any
    mod_single: Any
    rotary: tuple[mx.array, mx.array]


class Stage:
    """Blocks ``[start, end)`` of ``transformer`` (an mflux ``Flux2Transformer``)."""

    def __init__(self, transformer: Any, start: int, end: int) -> None:
        total = block_count(transformer)
        if not 0 <= start < end <= total:
            raise ValueError(f"block span [{start}, {end}) is not within the transformer's {total} blocks")
        self.t, self.start, self.end = transformer, start, end
        self.double = len(transformer.transformer_blocks)
        self.first, self.last = start == 0, end == total

    def context(self, hidden_states: mx.array, timestep: Any, img_ids: mx.array, txt_ids: mx.array) -> Context:
        """The step's ``Context`` (as ``Flux2Transformer.__call__`` computes it, guidance None)."""
        from mflux.models.common.config.model_config import ModelConfig

        t = self.t
        if not isinstance(timestep, mx.array):
            timestep = mx.array(timestep, dtype=hidden_states.dtype)
        if timestep.ndim == 0:
            timestep = mx.full((hidden_states.shape[0],), timestep, dtype=hidden_states.dtype)
        timestep = timestep.astype(hidden_states.dtype)
        timestep = timestep * mx.where(mx.max(timestep) <= 1.0, 1000.0, 1.0).astype(hidden_states.dtype)
        temb = t.time_guidance_embed(timestep, None).astype(ModelConfig.precision)
        img_ids = img_ids[0] if img_ids.ndim == 3 else img_ids
        txt_ids = txt_ids[0] if txt_ids.ndim == 3 else txt_ids
        image_rotary, text_rotary = t.pos_embed(img_ids), t.pos_embed(txt_ids)
        rotary = (mx.concatenate([text_rotary[0], image_rotary[0]], axis=0),
                  mx.concatenate([text_rotary[1], image_rotary[1]], axis=0))
        return Context(temb, t.double_stream_modulation_img(temb), t.double_stream_modulation_txt(temb),
                       t.single_stream_modulation(temb)[0], rotary)

    def embed(self, hidden_states: mx.array, encoder_hidden_states: mx.array) -> mx.array:
        """The first stage's input state: both streams embedded, text first ``[1, T + I, D]``."""
        return mx.concatenate([self.t.context_embedder(encoder_hidden_states), self.t.x_embedder(hidden_states)], axis=1)

    def run(self, state: mx.array, ctx: Context, text_tokens: int) -> mx.array:
        """This stage's blocks on ``state`` ``[1, T + I, D]`` (``text_tokens`` = T): the state after them."""
        enc, hid = state[:, :text_tokens], state[:, text_tokens:]
        for i in range(self.start, min(self.end, self.double)):
            enc, hid = self.t.transformer_blocks[i](
                hidden_states=hid, encoder_hidden_states=enc, temb_mod_params_img=ctx.mod_img,
                temb_mod_params_txt=ctx.mod_txt, image_rotary_emb=ctx.rotary, kv_cache=None, kv_cache_layer_idx=i)
        state = mx.concatenate([enc, hid], axis=1)
        for i in range(max(self.start, self.double), self.end):
            state = self.t.single_transformer_blocks[i - self.double](
                hidden_states=state, temb_mod_params=ctx.mod_single, image_rotary_emb=ctx.rotary,
                kv_cache=None, kv_cache_layer_idx=i - self.double)
        return state

    def finish(self, state: mx.array, ctx: Context, text_tokens: int) -> mx.array:
        """The last stage's output: the predicted noise ``[1, I, out_channels]``."""
        hidden = state[:, text_tokens:, ...]
        return self.t.proj_out(self.t.norm_out(hidden, ctx.temb))
