"""A decoder (any family mlx-lm runs) as an embedding model: its final hidden states, after
the final norm and before the head, from the family's inner model (``model.model``, which
every family mlx-lm serves here has: tests/test_embed_worker.py runs each synthetic family).

Rows are right-padded and the family's causal mask keeps a real token from seeing the
padding after it, so a row's states equal its states alone (docs/api.md#embeddings-and-reranking).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from worker.engine.forward import generation_stream

PAD_ID = 0
"""The id padding positions hold (never read: see the module's docstring)."""


class DecoderHidden:
    """``(token rows, lengths) -> hidden [B, L, H]`` float32 numpy of a whole mlx-lm model
    (``model.model`` must be its inner model). Raises ``ValueError`` for a model without
    one (a pipeline rank's share: embedding runs on a whole model)."""

    causal = True

    def __init__(self, model: nn.Module) -> None:
        inner = getattr(model, "model", None)
        if inner is None or getattr(model, "layer_span", None) is not None:
            raise ValueError("embedding needs the whole model on one rank")
        self._inner: Any = inner

    def __call__(self, rows: list[list[int]], lengths: list[int]) -> np.ndarray:
        width = max(lengths)
        ids = np.full((len(rows), width), PAD_ID, dtype=np.int32)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            ids[i, :n] = row[:n]
        with mx.stream(generation_stream):  # the stream the engine's forwards run on
            hidden = self._inner(mx.array(ids)).astype(mx.float32)
            mx.eval(hidden)
        return np.array(hidden, copy=False)

    def share(self, vecs: np.ndarray) -> np.ndarray:
        return vecs  # one rank holds the whole model
