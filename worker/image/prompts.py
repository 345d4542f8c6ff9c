"""Encoded prompts kept for the next image of the same prompt (docs/images.md#speed).

The text encoder's pass over a prompt (mflux pads it to 512 tokens) costs as much as a few
denoising steps on a CPU, and it is the same every time the same prompt comes again: the
images 2…n of one request (``n`` images are ``n`` tasks, ``exo_p2p.api.images.routes``), and
a user trying seeds or sizes on one prompt. So a runner keeps the encodings of the last
``PROMPT_CACHE_ENTRIES`` prompts, per text encoder; the arrays are the very ones a fresh
encoding gives, so the pixels do not change (``tests/test_image_prompts.py``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

PROMPT_CACHE_ENTRIES = 4
"""Prompts whose encodings a text encoder keeps (least recently used dropped first). Bounded
because an encoding of a real FLUX.2-klein prompt is 512 × 7,680 values (~7.5 MiB bf16)."""

_caches: dict[int, tuple[weakref.ref, OrderedDict[tuple[str, float], tuple]]] = {}
"""id(text encoder) → (a weak reference to it, its kept encodings). An MLX module is a dict,
so it cannot key a ``WeakKeyDictionary``; the weak reference tells a reused id from its own."""


def _cache_of(encoder: Any) -> OrderedDict[tuple[str, float], tuple]:
    for key in [k for k, (ref, _) in _caches.items() if ref() is None]:
        del _caches[key]  # encoders gone (a runner holds one; tests load several)
    held = _caches.get(id(encoder))
    if held is None or held[0]() is not encoder:
        held = _caches[id(encoder)] = (weakref.ref(encoder), OrderedDict())
    return held[1]


def prompt_pair(pipeline: Any, prompt: str, guidance: float, entries: int = PROMPT_CACHE_ENTRIES) -> tuple:
    """``pipeline._encode_prompt_pair``'s ``(embeds, text_ids, negative_embeds, negative_ids)``
    for ``prompt`` at ``guidance`` (the negative prompt is mflux's " "), evaluated, from the
    cache of ``pipeline.text_encoder`` when it holds them (an edit view shares its encoder and
    so its cache). Raises what the encoder raises."""
    import mlx.core as mx

    cache = _cache_of(pipeline.text_encoder)
    key = (prompt, guidance)
    found = cache.get(key)
    if found is not None:
        cache.move_to_end(key)
        return found
    pair = pipeline._encode_prompt_pair(prompt=prompt, negative_prompt=" ", guidance=guidance)
    mx.eval([a for a in pair if a is not None])
    cache[key] = pair
    while len(cache) > max(0, entries):
        cache.popitem(last=False)
    return pair
