"""Which part of a model each of its tensors belongs to, by name (the card's sizes,
``exo_p2p.models.card.derive``): a layer, the embedding, the head, or the rest (norms).

A decoder (mlx-lm) names its layers ``….layers.{i}.…``, its embedding ``embed_tokens`` and its
head ``lm_head``; an encoder (``mlx_embeddings``) names BERT's and XLM-RoBERTa's layers
``encoder.layer.{i}.…`` and ModernBERT's ``layers.{i}.…``, its embeddings ``embeddings.…``
(words, positions, token types and their norm) and has no head.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from exo_p2p.models.errors import UnsupportedModelError

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_EMBEDDING_RE = re.compile(r"(?:^|\.)embed_tokens\.")
_HEAD_RE = re.compile(r"(?:^|\.)lm_head\.")
_ENCODER_LAYER_RE = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
_ENCODER_EMBEDDING_RE = re.compile(r"(?:^|\.)(?:embeddings|embed_tokens)\.")


def layer_pattern(encoder: bool) -> re.Pattern[str]:
    """The pattern of a layer's tensor names (group 1: the layer index)."""
    return _ENCODER_LAYER_RE if encoder else _LAYER_RE


def tensor_parts(sizes: Mapping[str, int], n_layers: int, encoder: bool = False) -> tuple[list[int], int, int, int]:
    """(bytes per layer, embedding, head, other) of tensor name -> bytes; ``encoder``: an
    encoder's names (module docstring). Raises ``UnsupportedModelError`` for a layer index at
    or beyond ``n_layers``."""
    layer_bytes = [0] * n_layers
    embedding = head = norm = 0
    layer_re, embedding_re = (_ENCODER_LAYER_RE, _ENCODER_EMBEDDING_RE) if encoder else (_LAYER_RE, _EMBEDDING_RE)
    for name, nbytes in sizes.items():
        if m := layer_re.search(name):
            index = int(m.group(1))
            if index >= n_layers:
                raise UnsupportedModelError(f"tensor {name} is beyond num_hidden_layers={n_layers}")
            layer_bytes[index] += nbytes
        elif embedding_re.search(name):
            embedding += nbytes
        elif _HEAD_RE.search(name):
            head += nbytes
        else:
            norm += nbytes
    return layer_bytes, embedding, head, norm
