"""The model forward pass, kept apart from the engine so a pipeline stage (receive hidden
states from rank r-1, run local layers, send to rank r+1) can replace it without touching
the generation loop.
"""

from __future__ import annotations

from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

generation_stream = mx.new_thread_local_stream(mx.default_device())
"""The stream every generation op runs on (like mlx-lm's own ``generation_stream``): a
thread-local stream, so the engine may be driven from any one thread."""


class Forward(Protocol):
    """``(model, tokens [1, L] int32, cache) -> logits [1, L, vocab]`` (lazy)."""

    def __call__(self, model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array: ...


def forward(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    """Run the whole model on ``tokens`` (shape ``[1, L]``), appending to the KV ``cache``;
    returns lazy logits ``[1, L, vocab]``."""
    return model(tokens, cache=cache)


def new_cache(model: nn.Module) -> list[Any]:
    """A fresh, empty KV cache (one entry per local layer), as mlx-lm makes it (the kinds
    the family's ``make_cache`` gives the whole model; of this rank's layers on a pipeline
    rank, ``engine.layer_span``), except that a sliding-window layer's ``RotatingKVCache``
    is a ``KVCache``. The engine merges every row's cache into a ``BatchKVCache``
    (``engine.batch``, ``engine.prefill``), which keeps every token and applies the layer's
    window in its mask (the family passes ``window_size``); a rotating cache that already
    dropped tokens loses their positions in that merge, so a request decoded alone answered
    otherwise than in a batch."""
    span = getattr(model, "layer_span", None)
    caches = span.new_cache() if span is not None else make_prompt_cache(model)
    return [KVCache() if isinstance(c, RotatingKVCache) else c for c in caches]
